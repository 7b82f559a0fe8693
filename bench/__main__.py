"""`scripts/bench [--quick] [--sections ...]` (`python -m bench` after the setup): run the benchmarks,
print its figures as bench/RESULTS.md shows them, write JSON."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shlex
import sys
import traceback
from pathlib import Path

from bench import checkpoint_throughput, report, sections
from bench import results as results_mod
from bench.launch import BenchError
from bench.machine import machine_info, versions

SECTIONS = {
    "peer_study": sections.study_section,
    "headline": sections.headline_section,
    "checkpoint_stall": sections.stall_section,
    "recovery": sections.recovery_section,
    "plan_time": sections.plan_time_section,
    "shard_read": sections.shard_read_section,
    "input_pipeline": sections.input_pipeline_section,
    "image_task": sections.image_task_section,
    "checkpoint_throughput": checkpoint_throughput.section,
}


PROG = "python -m bench"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Run the benchmarks (ratios measured "
                                "interleaved in one run); print them; write bench/results/<name>.json.",
                                epilog=f"examples: {PROG} --quick    {PROG} --sections headline,recovery")
    p.add_argument("--quick", action="store_true", help="a short smoke run (1 repeat, few steps)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of: {', '.join(SECTIONS)} (default: all); the results "
                   "file keeps the sections a run leaves out")
    p.add_argument("--repeats", type=int, default=None, help="override the repeats of the comparisons")
    p.add_argument("--name", default=None,
                   help="results file name (default: 'latest', or 'quick' with --quick)")
    p.add_argument("--out", type=Path, default=results_mod.RESULTS_DIR, help="results directory")
    p.add_argument("--raw", action="store_true",
                   help="also write every per-step sample to <name>.raw.json (not committed)")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown or not chosen:
        p.error(f"--sections {args.sections!r}: unknown {unknown or 'empty'}; allowed: {', '.join(SECTIONS)}")
    args.sections = chosen
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats {args.repeats}: must be >= 1")
    args.name = args.name or ("quick" if args.quick else "latest")
    if not args.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        p.error(f"--name {args.name!r}: use letters, digits, '-', '_' and '.'")
    return args


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def plan_for(args: argparse.Namespace) -> sections.Plan:
    """The full plan or --quick's, with --repeats for every comparison when given."""
    plan = sections.QUICK if args.quick else sections.FULL
    if args.repeats is None:
        return plan
    return dataclasses.replace(plan, repeats=args.repeats, headline_repeats=args.repeats,
                               stall_repeats=args.repeats, image_repeats=args.repeats,
                               pipeline_repeats=args.repeats,
                               throughput_sizes=tuple(dataclasses.replace(z, repeats=args.repeats)
                                                      for z in plan.throughput_sizes))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_for(args)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    out = {
        "schema_version": results_mod.SCHEMA_VERSION,
        "name": args.name,
        "command": f"{PROG} {shlex.join(argv if argv is not None else sys.argv[1:])}".strip(),
        "quick": args.quick,
        "started_at": _now(),
        "finished_at": "",
        "machine": machine_info(),
        "versions": versions(),
        "sections": {},
    }
    failed = []
    for name in args.sections:
        progress(f"== {name}")
        started, load = _now(), list(os.getloadavg())
        try:
            out["sections"][name] = SECTIONS[name](plan, progress)
        except BenchError as e:
            out["sections"][name] = {"status": "failed", "reason": str(e)}
            failed.append(name)
        except Exception as e:  # a harness bug: keep the other sections' figures, but say so loudly
            traceback.print_exc()
            out["sections"][name] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
            failed.append(name)
        out["sections"][name]["measured"] = {
            "command": out["command"], "run_started_at": out["started_at"], "started_at": started,
            "finished_at": _now(), "load_avg": load, "load_avg_end": list(os.getloadavg()),
            "cpu_model": out["machine"]["cpu_model"]}
    out["finished_at"] = _now()
    out["machine"]["load_avg_end"] = machine_info()["load_avg"]
    target = args.out / f"{args.name}.json"
    try:
        previous = results_mod.read_previous(target)
    except ValueError as e:
        print(f"bench: {e}: replaced by this run's results", file=sys.stderr)
        previous = None
    doc, kept = results_mod.merge(previous, out)
    path = results_mod.write(doc, args.out, raw=args.raw)
    print(report.markdown(out))   # this run's sections, as bench/RESULTS.md shows them
    print(f"\nwrote {path}" + (f" and {results_mod.raw_path(path)}" if args.raw else ""))
    if kept:
        print(f"kept in {path.name} from earlier runs: {', '.join(kept)}")
    if failed:
        print(f"bench: failed sections: {', '.join(failed)} (reasons above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
