"""`ringtrain export`: a model export from a job's checkpoint, after the run (train/export.py).

    ringtrain export --job image --stack dev                 the newest checkpoint that verifies
    ringtrain export --job image --stack dev --step 200      that step's
    ringtrain export --job image --store s3://ringtrain-local-checkpoints --s3-endpoint-url URL
    ringtrain export --job image --store /data --export-dir /models/image-200

The checkpoints are <bucket>/checkpoints/<job>/, the export goes to <bucket>/exports/<job>/ unless
--export-dir says otherwise. Bad input (no such checkpoint, one that does not verify, a destination
that cannot be written) is one line and exit 2.
"""

from __future__ import annotations

import argparse

from cluster.buckets import add_location_args, checkpoints_root
from cluster.usage import UsageError
from infra.storage_layout import checkpoint_key_prefix


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a job's model (safetensors + model.json) from a checkpoint",
                       description=__doc__.split("\n\n", 1)[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--job", required=True, help="the job whose checkpoints to export from")
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint's step (default: the newest that verifies)")
    p.add_argument("--export-dir", default=None,
                   help="where the export goes: s3://bucket/prefix or a directory (default: "
                        "exports/<job> in the checkpoints bucket)")
    add_location_args(p, required=True)
    p.set_defaults(command_fn=cmd_export)


def cmd_export(a: argparse.Namespace) -> int:
    from cluster.job import JobSpec
    from train.errors import BadInput
    from train.export import export_checkpoint

    try:
        JobSpec(name=a.job, num_hosts=1)
    except ValueError as e:
        raise UsageError(f"--job {a.job!r}: {e}") from None
    if a.step is not None and a.step < 0:
        raise UsageError(f"--step {a.step}: must be >= 0")
    root, endpoint, _ = checkpoints_root(a)
    target = a.export_dir or f"{root}/exports/{a.job}"
    try:
        source = f"{root}/{checkpoint_key_prefix(a.job).rstrip('/')}"
        record = export_checkpoint(source, target, a.step, endpoint)
    except BadInput as e:
        raise UsageError(str(e)) from None
    print(f"exported {a.job} step {record['step']} to {target}")
    return 0
