"""Where a command finds a stack's checkpoints bucket: `--stack NAME` (its Pulumi outputs, or
`--outputs FILE` with them), or `--store URI` named directly (a bucket on another endpoint, such as a
--keep-up local cluster's store, or a directory). Used by `ringtrain runs` and `ringtrain export`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cluster.usage import UsageError


def add_location_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("where the checkpoints bucket is" + ("" if required else " (optional)"))
    g.add_argument("--stack", help="the Pulumi stack whose checkpoints bucket to read (e.g. dev)")
    g.add_argument("--outputs", type=Path,
                   help="with --stack: its outputs as JSON (`pulumi stack output --json --show-secrets`) "
                        "instead of asking Pulumi")
    g.add_argument("--store", help="the checkpoints bucket's root named directly: s3://BUCKET or a directory "
                                   "(holding checkpoints/<job>/, exports/<job>/)")
    g.add_argument("--s3-endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL") or None,
                   help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    p.set_defaults(location_required=required)


def checkpoints_root(a: argparse.Namespace) -> tuple[str, str | None, str] | None:
    """(the bucket root's URI, its endpoint, a short name for it), or None when neither is given and
    none is required. UsageError for both, or a stack without its bucket."""
    if a.stack and a.store:
        raise UsageError("--stack and --store: give one")
    if a.outputs and not a.stack:
        raise UsageError("--outputs: only with --stack")
    if a.store:
        return a.store.rstrip("/"), a.s3_endpoint_url, a.store.rstrip("/")
    if a.stack:
        from cluster.aws.outputs import parse_outputs

        if a.outputs:
            try:
                raw = json.loads(a.outputs.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"--outputs {a.outputs}: not a JSON file of stack outputs ({e})") from None
        else:
            from cluster.aws.stack import AutomationStack

            raw = AutomationStack(a.stack, create=False).outputs()
        bucket = parse_outputs(a.stack, raw).checkpoints_bucket
        return f"s3://{bucket}", a.s3_endpoint_url, f"aws:{a.stack}"
    if a.location_required:
        raise UsageError("say where the checkpoints are: --stack NAME, or --store s3://BUCKET|DIR")
    return None
