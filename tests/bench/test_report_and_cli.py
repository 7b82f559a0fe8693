"""What a run prints, the command line, and the settings each contender runs with."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report, sections
from bench.__main__ import parse_args, plan_for
from bench.machine import cpu_model
from bench.peer import STUDY, HorovodSettings

ROOT = Path(__file__).resolve().parents[2]


def test_horovod_settings_become_the_environment_horovod_reads():
    s = HorovodSettings(threads=1, cycle_time_ms=0.1, fusion_mb=4, autotune=True, compression="fp16")
    assert s.env() == {"OMP_NUM_THREADS": "1", "HOROVOD_CYCLE_TIME": "0.1",
                       "HOROVOD_FUSION_THRESHOLD": str(4 * 1024 * 1024), "HOROVOD_AUTOTUNE": "1"}
    assert s.args()[s.args().index("--compression") + 1] == "fp16"
    assert HorovodSettings().env() == {}  # defaults are Horovod's and torch's own
    assert STUDY["hvd-defaults"] == HorovodSettings()
    # One factor at a time on top of one thread per worker.
    for name, settings in STUDY.items():
        if name not in ("hvd-defaults", "hvd-threads1"):
            assert settings.threads == 1 and name.startswith("hvd-threads1-")


def test_cpu_model_from_cpuinfo():
    cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"


def test_cli_defaults_and_choices():
    a = parse_args([])
    assert a.name == "latest" and not a.quick and a.sections[0] == "peer_study"
    q = parse_args(["--quick", "--sections", "headline, recovery"])
    assert q.name == "quick" and q.sections == ["headline", "recovery"]


def test_repeats_overrides_every_comparison_of_either_plan():
    assert plan_for(parse_args([])) is sections.FULL and plan_for(parse_args(["--quick"])) is sections.QUICK
    for argv, base in (([], sections.FULL), (["--quick"], sections.QUICK)):
        plan = plan_for(parse_args([*argv, "--repeats", "5"]))
        assert (plan.repeats, plan.headline_repeats, plan.stall_repeats) == (5, 5, 5)
        assert plan.shape == base.shape and plan.stall_sizes == base.stall_sizes


@pytest.mark.parametrize("argv,message", [
    (["--sections", "peer,nope"], "--sections 'peer,nope': unknown ['peer', 'nope']; allowed: peer_study"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--name", "a/b"], "--name 'a/b'"),
])
def test_bad_arguments_are_one_message_and_exit_2(argv, message):
    proc = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_quick_run_writes_valid_results(tmp_path):
    """Smoke: the headline section's real runs (the trainer through the local flow, bare Horovod and DDP
    workers), one short repeat; checks the document, not the speed. The peer study's workers are the
    same bench/worker_*.py, and its table is rendered from results in the tests below."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--sections", "headline",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert set(doc["sections"]) == {"headline"}
    # The real trainer ran with checkpoints to the local S3 store and its window was read from its metrics.
    head = doc["sections"]["headline"]
    assert head["status"] == "ok", head.get("reason")
    comp = head["comparison"]
    for c in comp["contenders"].values():
        assert c["samples"][0] > 0
    trainer_run = comp["contenders"]["trainer"]["runs"][0]
    assert trainer_run["checkpoints_written"] >= 2 and trainer_run["samples_per_sec"] > 0
    assert set(head["peer"]) == {"trainer", "bare-hvd"} and head["efficiency"]["target"] == 0.97
    # Pinned workers report the core they were given; unpinned ones report none.
    cpus = {name: c["runs"][0]["cpus"] for name, c in comp["contenders"].items()}
    assert cpus["ddp"] is None and len(cpus["ddp-pin"]) == 1 and len(cpus["bare-hvd"]) == 1, cpus
    assert "**Trainer efficiency and peer comparison**" in proc.stdout  # what RESULTS.md shows


def test_readme_section_is_rendered_from_the_results(results):
    from bench.report import markdown

    text = markdown(results)
    assert text.startswith("## Performance")
    assert "`scripts/bench`" in text and "2 cores (Test CPU)" in text
    assert "| hvd | 104 | 1.10× | 1.10, 1.10 |" in text and "| (DDP) | 95 | 1.00× | |" in text
    assert "Not measured in this run: recovery (failed: the local cluster did not come up)" in text
    # The headline: targets against DDP as torchrun starts it, and like with like against pinned DDP.
    assert "| trainer / bare Horovod loop | 980 / 1000 | 0.980× | – (too few repeats) | ≥ 0.97: met |" in text
    assert ("| trainer / torch DDP (Gloo) | 980 / 990 | 0.990× | – (too few repeats) | "
            "≥ 1.0: **not met** |") in text
    pinned_row = ("| trainer / DDP pinned like the trainer | 980 / 1100 | 0.890× | – (too few repeats) | "
                  "like with like; no target |")
    assert pinned_row in text
    assert ("the bare Horovod loop with the same settings (1 torch thread per worker, each worker pinned "
            "to its own core, Horovod cycle time 0.5 ms, gradients allreduced in 1 group)") in text


def test_stall_rows_name_their_layout(results):
    from bench.report import markdown

    def size(layout, step_s, lost_s, write_s=0.02, contained=True):
        return {"layout": layout, "workers": 1, "model": "mlp", "width": 256, "checkpoint_bytes": 700_000,
                "every": 50, "baseline_step_s": step_s, "first_step_excess_s": 0.002,
                "lost_per_checkpoint_s": lost_s,
                "lost_in_steps": lost_s / step_s, "below_one_step": contained and lost_s < step_s,
                "write_max_s": [write_s], "write_within_after": contained,
                "ab_lost_per_repeat_s": [lost_s + 0.01]}

    saturated = size("2 workers on 2 cores", 0.005, 0.030)
    saturated["writer_wait_s"] = [0.25, 0.0, 0.1]  # results from before this figure have none
    saturated["checkpoints_deferred"] = [2, 3, 2]  # nor this one
    long_write = size("1 worker, 1 thread, 2 cores", 0.010, 0.001, write_s=0.4, contained=False)
    long_write.update(writer_cpu_per_checkpoint_s=0.05, store_cpu_per_checkpoint_s=0.2, checkpoint_bytes=35e6,
                      neighbour={"ratio": 1.04, "interval": [1.023, 1.052], "cost_of_writer_cpu_s": 0.002,
                                 "cost_of_store_cpu_s": 0.008})
    # with the interval of its median and the null control: the median is below one step, its
    # interval is not
    undecided = size("1 worker, 1 thread, 2 cores", 0.004, 0.003)
    undecided.update(lost_interval_s=[0.0021, 0.0052], verdict_decided=False, checkpoints_measured=84,
                     null_lost_per_checkpoint_s=0.0004)
    decided = dict(undecided, lost_interval_s=[0.0021, 0.0032], verdict_decided=True)
    results["sections"]["checkpoint_stall"] = {
        "status": "ok", "repeats": 1,
        "sizes": [saturated, size("1 worker, 1 thread, 2 cores", 0.010, 0.004), long_write,
                  undecided, decided]}
    text = markdown(results)
    # the spare core's share: only the row that measured it, split into the writer's and the store's
    assert ("| 35.0 MB | +4.0 % (+2.3 to +5.2 %) | 50.0 ms | 2.00 ms | 200.0 ms | 8.00 ms | +2.0 ms | "
            "1.0 ms |") in text
    assert "| 0.7 MB | +" not in text
    assert "the steps after it that cover the longest write (at least half the interval)" in text
    assert ("| 2 workers on 2 cores | 0.7 MB | 50 | – | 5.0 ms | +2.0 ms | 30.0 ms | 6.00 | **not met** "
            "| – | "
            "20 ms | 40.0 ms | 250, 0, 100 ms | 2, 3, 2 |") in text
    assert ("| 1 worker, 1 thread, 2 cores | 0.7 MB | 50 | – | 10.0 ms | +2.0 ms | 4.0 ms | 0.40 | "
            "met | – | 20 ms | 14.0 ms | – | – |") in text
    assert "| 0.10 | no verdict: the write outlasts 4/5 of the interval | – | 400 ms |" in text
    assert "| 84 | 4.0 ms | +2.0 ms | 3.0 ms (2.1 to 5.2) | 0.75 | met (undecided) | 0.4 ms | 20 ms |" in text
    assert "| 3.0 ms (2.1 to 3.2) | 0.75 | met | 0.4 ms |" in text


def test_the_headline_says_what_the_trainers_checkpoints_did(results):
    from bench.report import markdown

    runs = [{"checkpoints_written": w, "checkpoints_deferred": d, "checkpoint_wait_s": 0.01,
             "checkpoint_write_max_s": m} for w, d, m in ((5, 0, 0.29), (3, 2, 0.71), (4, 1, 0.45))]
    head = results["sections"]["headline"]
    assert "The trainer's checkpoints per run" not in markdown(results)  # results from before the figure
    head["trainer_checkpoints"] = tc = sections.trainer_checkpoints(runs)
    assert tc["written"] == [5, 3, 4] and tc["deferred"] == [0, 2, 1]
    assert ("The trainer's checkpoints per run, median (range): 4 (3-5) written (the final one, after the "
            "window, included), 1 (0-2) deferred past their step while the previous write went on; longest "
            "write 450 (290-710) ms.") in markdown(results)


def test_headline_ratios_carry_the_interval_of_their_median(results):
    """With 9 repeats the interval is the 2nd to the 8th smallest per-repeat ratio, so a reader sees
    how far a median just under its target is from it."""
    from bench.report import markdown

    head = results["sections"]["headline"]
    per_repeat = [0.96, 0.96, 0.95, 0.97, 0.97, 1.00, 0.98, 0.99, 1.02]
    head["efficiency"].update(per_repeat=per_repeat, trainer_vs_bare_hvd=0.97)
    head["peer"]["trainer"]["per_repeat"] = [0.95 + x / 100 for x in range(9)]  # median 0.99, as given
    text = markdown(results)
    # the median meets the target, its interval holds both sides of it: undecided, in every table
    assert "| trainer / bare Horovod loop | 980 / 1000 | 0.970× | 0.960–1.000 | ≥ 0.97: met (undecided) |" \
        in text
    assert "| trainer / bare Horovod loop (samples/s) | 0.970× (0.960–1.000) | ≥ 0.97: met (undecided) |" in \
        report.readme_table(results)
    assert "| trainer / torch DDP (Gloo) | 980 / 990 | 0.990× | 0.960–1.020 |" in text


@pytest.mark.parametrize("repeats, words", [
    (9, "with 9 repeats, the 2nd to the 8th, 96 % coverage)"),
    (24, "with 24 repeats, the 7th to the 18th, 98 % coverage)"),
    (5, "with 5 repeats, too few for one)"),
])
def test_the_interval_is_explained_for_the_headlines_repeats(results, repeats, words):
    from bench.report import markdown

    results["sections"]["headline"]["comparison"]["repeats"] = repeats
    assert f"with k from the binomial distribution; {words}" in markdown(results)


def test_bare_loop_settings_are_the_trainers_cpu_defaults():
    """The headline compares the trainer (run with its own defaults) with a bare loop under PRODUCTION:
    both must be the same settings, or the efficiency ratio measures the settings, not the trainer."""
    from bench.sections import PRODUCTION
    from train.config import parse_args
    from train.cpu import cpu_threads_per_worker
    from train.recipe import configure_horovod_env, gradient_groups

    defaults = parse_args([])
    environ: dict[str, str] = {}
    configure_horovod_env(defaults, on_gpu=False, environ=environ)
    assert environ == {"HOROVOD_CYCLE_TIME": f"{PRODUCTION.cycle_time_ms:g}"}
    assert PRODUCTION.pin and defaults.cpu_affinity == "auto"
    # 2 workers on 2 cores, pinned: each has one core, so one torch thread.
    assert PRODUCTION.threads == cpu_threads_per_worker(1, 1, {}) == 1
    assert PRODUCTION.fusion_mb is None and defaults.horovod.fusion_threshold_mb is None
    assert PRODUCTION.compression == defaults.horovod.compression == "none" and not PRODUCTION.autotune
    assert PRODUCTION.groups == gradient_groups(defaults, on_gpu=False) == 1


def test_plan_time_names_the_plan_and_the_program_run_under_mocks_apart(results):
    """scripts/plan no longer runs the Pulumi program: its time and the mocked program run (what the infra
    tests pay) are two figures; a results file from before the plan's own timing shows only the run."""
    from bench.report import markdown

    program = {"resources": 116, "cold_wall_median_s": 1.92, "cold_cpu_median_s": 1.9, "warm_median_s": 0.3}
    results["sections"]["plan_time"] = {"status": "ok", "figures": {"stacks": {"prod": program}}}
    text = markdown(results)
    assert ("**The Pulumi program under mocks** (as the infra tests run it, tests/infra/harness.py): prod "
            "116 resources: cold 1.92 s wall / 1.90 s CPU, warm 0.30 s.") in text
    assert "**Plan time**" not in text
    program.update(plan_wall_median_s=0.62, plan_cpu_median_s=0.31)
    assert ("**Plan time** (`scripts/plan`, from the config and the catalog): prod 0.62 s wall / 0.31 s CPU."
            in markdown(results))
