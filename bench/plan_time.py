"""How long the offline plan takes, and the offline run of the Pulumi program under mocks that the tests
make (no CLI, no AWS), per committed stack.

    .venv/bin/python bench/plan_time.py [--runs N] [--stacks dev prod]

Figures per stack:
  plan wall  wall time of a fresh interpreter that makes the plan and its table (cluster/aws/plan.py,
  plan cpu   pure: config + catalog; what `scripts/plan` pays after setup) and its CPU seconds;
             medians of --cold-runs processes.
  cold wall  wall time of a fresh interpreter that imports everything and runs the program once under
             mocks (tests/infra/harness.py: what a test session pays first); median of --cold-runs.
  cold cpu   user+system CPU seconds of that process. The runs are essentially single-threaded, so on
             an idle machine wall ~= cpu; on a shared, loaded machine wall time measures the neighbours.
  warm       one more program run inside a process that already ran it (imports cached); median of --runs.
The target is a prod plan in < 5 s on a 2-core machine (judged on cpu when the 1-minute load average
exceeds the core count, else on wall). Prints a table and writes bench/results/plan_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "plan_time.json"
TARGET_S = 5.0

_CHILD = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from tests.infra.harness import run_program
result = run_program({stack!r})
print(time.perf_counter() - t0, len(result.resources))
"""


_PLAN_CHILD = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from cluster.aws.plan import offline_plan, plan_to_table
plan_to_table(offline_plan({stack!r}, 24))
print(time.perf_counter() - t0)
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fresh_process(code: str, what: str, timeout_s: float) -> tuple[float, float, list[str]]:
    """(process wall s, process cpu s, the last line's fields) for one fresh interpreter."""
    cpu0, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                          cwd=ROOT)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"plan_time: {what} failed:\n{proc.stderr[-2000:]}")
    return wall, cpu, proc.stdout.splitlines()[-1].split()


def cold_run(stack: str, timeout_s: float) -> tuple[float, float, float, int]:
    """(process wall s, process cpu s, in-process wall s, resources) of one program run under mocks."""
    wall, cpu, (inner, count) = _fresh_process(_CHILD.format(root=str(ROOT), stack=stack),
                                               f"the {stack} run", timeout_s)
    return wall, cpu, float(inner), int(count)


def plan_run(stack: str, timeout_s: float) -> tuple[float, float]:
    """(process wall s, process cpu s) of one plan of `stack`, as scripts/plan makes it."""
    wall, cpu, _ = _fresh_process(_PLAN_CHILD.format(root=str(ROOT), stack=stack), f"the {stack} plan",
                                  timeout_s)
    return wall, cpu


def warm_runs(stack: str, runs: int) -> list[float]:
    sys.path.insert(0, str(ROOT))
    from tests.infra.harness import run_program

    run_program(stack)  # imports and first-run caches
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run_program(stack)
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="warm runs per stack (default 5)")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes per stack (default 3)")
    parser.add_argument("--stacks", nargs="+", default=["dev", "prod"])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per cold process")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.cold_runs < 1:
        parser.error("--runs and --cold-runs must be at least 1")
    for stack in args.stacks:
        if not (ROOT / f"Pulumi.{stack}.yaml").is_file():
            parser.error(f"no committed stack {stack!r} (Pulumi.{stack}.yaml is missing)")

    report: dict = {
        "what": "the offline plan (cluster/aws/plan.py: plan_*) and the offline run of infra/__main__.py "
                "under Pulumi mocks that the tests make (tests/infra/harness.py: cold_*, warm_*)",
        "target": f"prod plan median < {TARGET_S} s on 2 cores",
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0],
                    "python": platform.python_version(), "platform": platform.platform()},
        "stacks": {},
    }
    print(f"{'stack':6} {'plan wall s':>11} {'plan cpu s':>10} {'resources':>9} {'cold wall s':>12} "
          f"{'cold cpu s':>11} {'warm s':>7}   (medians)")
    for stack in args.stacks:
        plans = [plan_run(stack, args.timeout) for _ in range(args.cold_runs)]
        cold = [cold_run(stack, args.timeout) for _ in range(args.cold_runs)]
        warm = warm_runs(stack, args.runs)
        entry = {
            "plan_wall_s": [round(p[0], 3) for p in plans],
            "plan_wall_median_s": round(statistics.median(p[0] for p in plans), 3),
            "plan_cpu_s": [round(p[1], 3) for p in plans],
            "plan_cpu_median_s": round(statistics.median(p[1] for p in plans), 3),
            "resources": cold[0][3],
            "cold_wall_s": [round(c[0], 3) for c in cold],
            "cold_wall_median_s": round(statistics.median(c[0] for c in cold), 3),
            "cold_cpu_s": [round(c[1], 3) for c in cold],
            "cold_cpu_median_s": round(statistics.median(c[1] for c in cold), 3),
            "cold_in_process_wall_median_s": round(statistics.median(c[2] for c in cold), 3),
            "warm_s": [round(t, 3) for t in warm],
            "warm_median_s": round(statistics.median(warm), 3),
        }
        report["stacks"][stack] = entry
        print(f"{stack:6} {entry['plan_wall_median_s']:>11.2f} {entry['plan_cpu_median_s']:>10.2f} "
              f"{entry['resources']:>9} {entry['cold_wall_median_s']:>12.2f} "
              f"{entry['cold_cpu_median_s']:>11.2f} {entry['warm_median_s']:>7.2f}")
    report["machine"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    if "prod" in report["stacks"]:
        loaded = max(report["machine"]["load_avg_1m_at_start"], report["machine"]["load_avg_1m_at_end"]) \
            > (os.cpu_count() or 1)
        judged_on = "plan_cpu_median_s" if loaded else "plan_wall_median_s"
        report["prod_judged_on"] = judged_on + (" (machine loaded by other work)" if loaded else "")
        report["prod_meets_target"] = report["stacks"]["prod"][judged_on] < TARGET_S
        print(f"prod {judged_on}: {report['stacks']['prod'][judged_on]:.2f} s "
              f"({'meets' if report['prod_meets_target'] else 'MISSES'} the {TARGET_S} s target)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(RESULTS)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
