"""`ringtrain runs`: the runs you did, what each reached, what it cost and where its model is.

    ringtrain runs                         the run directories under runs/ (each `ringtrain run` leaves one)
    ringtrain runs --stack dev             and the jobs in the dev stack's checkpoints bucket
    ringtrain runs --store s3://b --s3-endpoint-url URL    a bucket named directly (a --keep-up local run's)
    ringtrain runs --json                  the same as JSON, for machines

Each `ringtrain run` writes `run.json` into its run directory (run_record, beside report.png and
summary.txt); on AWS it also keeps a copy in the checkpoints bucket under runs/, since the run
directory is on the machine that started it. A job found in a bucket without a run record (one
submitted with `ringtrain submit`) is listed from its newest checkpoint's manifest and its export.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from cluster.buckets import add_location_args, checkpoints_root
from cluster.flow import FlowResult
from cluster.run_cost import NodeGroupCost
from cluster.usage import UsageError
from infra.storage_layout import checkpoint_key_prefix

RECORD = "run.json"
RUNS_PREFIX = "runs"  # run records in the checkpoints bucket: runs/<job>/<UTC time>.json


def run_record(result: FlowResult, backend: str, stack: str | None, run_dir: Path,
               costs: list[NodeGroupCost] | None, now: datetime.datetime | None = None) -> dict[str, Any]:
    """What `ringtrain runs` lists of a finished run (pure)."""
    s = result.summary
    first = result.attempts[0] if result.attempts else None
    priced = [c.usd for c in costs or () if c.usd is not None]
    when = (datetime.datetime.fromtimestamp(first.started_at, datetime.UTC) if first and first.started_at
            else now or datetime.datetime.now(datetime.UTC))
    return {
        "job": result.job, "when": when.isoformat(timespec="seconds"),
        "where": f"aws:{stack}" if backend == "aws" else "local",
        "state": "done" if result.succeeded else "failed", "exit_code": result.exit_code,
        "attempts": len(result.attempts), "steps": s.steps if s else None,
        "final_loss": s.final_loss if s else None, "eval": s.eval if s else None,
        "cost_usd": round(sum(priced), 4) if priced else None,
        "export": s.export if s else None, "run_dir": str(run_dir),
    }


def write_run_record(run_dir: Path, record: dict[str, Any]) -> Path:
    path = run_dir / RECORD
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def keep_in_bucket(checkpoint_uri: str, endpoint_url: str | None, record: dict[str, Any]) -> str | None:
    """A copy of the run record in the checkpoints bucket (runs/<job>/<when>.json), where `ringtrain runs
    --stack` finds it; None when the checkpoint URI is not in the storage layout."""
    from train.export import default_export_uri
    from train.storage import open_store

    exports = default_export_uri(checkpoint_uri)
    if exports is None:
        return None
    root = exports.rsplit("/", 2)[0]
    key = f"{RUNS_PREFIX}/{record['job']}/{record['when'].replace(':', '')}.json"
    open_store(root, endpoint_url).put(key, json.dumps(record, indent=1).encode())
    return f"{root}/{key}"


def local_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """The run records under `runs_dir`, oldest first; unreadable ones are skipped."""
    records = []
    for path in sorted(runs_dir.glob(f"*/{RECORD}")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict):
            records.append({**record, "run_dir": str(path.parent)})
    return sorted(records, key=lambda r: str(r.get("when")))


def bucket_runs(store, where: str) -> list[dict[str, Any]]:
    """The jobs in a checkpoints bucket (a train.storage.Store on its root): each job's newest run
    record, else what its newest checkpoint manifest and its export say."""
    from train import export
    from train.checkpoint import store as ckpt

    keys = store.list()
    records: dict[str, dict[str, Any]] = {}
    for key in keys:
        parts = key.split("/")
        if parts[0] == RUNS_PREFIX and len(parts) == 3 and parts[2].endswith(".json"):
            try:
                record = json.loads(store.get(key))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            newest = str(records.get(parts[1], {}).get("when") or "")
            if isinstance(record, dict) and str(record.get("when")) >= newest:
                records[parts[1]] = {**record, "where": where}
    jobs = {k.split("/")[1] for k in keys if k.startswith(("checkpoints/", "exports/")) and k.count("/") >= 2}
    for job in sorted(jobs - set(records)):
        record: dict[str, Any] = {"job": job, "when": None, "where": where, "state": "checkpoints only",
                                  "steps": None, "final_loss": None, "eval": None, "cost_usd": None,
                                  "export": None}
        manifests = sorted(k for k in keys if k.startswith(checkpoint_key_prefix(job))
                           and k.endswith(f"/{ckpt.MANIFEST}"))
        if manifests:
            manifest = json.loads(store.get(manifests[-1]))
            record["steps"] = manifest.get("step")
            created = manifest.get("created_unix")
            if created:
                record["when"] = datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(
                    timespec="seconds")
        if f"exports/{job}/{export.MODEL_JSON}" in keys:
            model = json.loads(store.get(f"exports/{job}/{export.MODEL_JSON}"))
            record["export"] = f"{store.uri}/exports/{job}"
            record["eval"] = model.get("eval")
            record["steps"] = record["steps"] or model.get("step")
        records[job] = record
    return sorted(records.values(), key=lambda r: str(r.get("when")))


def format_runs(records: list[dict[str, Any]]) -> str:
    """A table of the runs (pure)."""
    from tabulate import tabulate

    from train.summary import format_eval

    if not records:
        return "no runs found"
    rows = [[r.get("when") or "?", r.get("job"), r.get("where"), r.get("state", ""), r.get("steps"),
             f"{r['final_loss']:.4f}" if isinstance(r.get("final_loss"), int | float) else "",
             format_eval(r.get("eval")) or "",
             f"${r['cost_usd']:.2f}" if isinstance(r.get("cost_usd"), int | float) else "",
             r.get("export") or ""] for r in records]
    return tabulate(rows, headers=["when (UTC)", "job", "where", "state", "steps", "final loss", "evaluation",
                                   "cost", "export"])


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="past runs: local run directories and a stack's jobs",
                       description=__doc__.split("\n\n", 1)[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n".join(__doc__.split("\n\n")[1:2]))
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="run directories (default runs/)")
    add_location_args(p, required=False)
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(command_fn=cmd_runs)


def cmd_runs(a: argparse.Namespace) -> int:
    from train.errors import BadInput
    from train.storage import open_store

    records = local_runs(a.runs_dir)
    location = checkpoints_root(a)
    if location is not None:
        root, endpoint, where = location
        store = open_store(root, endpoint)
        try:
            store.check(create=False)
            records += bucket_runs(store, where)
        except BadInput as e:
            raise UsageError(str(e)) from None
    if a.json:
        json.dump(records, sys.stdout, indent=1)
        print()
    else:
        print(format_runs(records))
    return 0
