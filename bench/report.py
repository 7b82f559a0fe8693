"""bench/RESULTS.md and the README's Performance table, rendered from a results file (so no figure
is typed by hand).

    .venv/bin/python -m bench.report [bench/results/latest.json]           print the full report
    .venv/bin/python -m bench.report --write [bench/results/latest.json]   write bench/RESULTS.md and
                                                                            README.md's table
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from bench.results import RESULTS_DIR, measured_by
from bench.stats import median_interval
from bench.table import ms_interval, stall_verdict

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
README = ROOT / "README.md"
# Written by hand, dated, about one run: what the figures mean, and measurements made outside
# `scripts/bench` (each names its command). Appended to RESULTS.md as it stands.
READING = ROOT / "bench" / "reading.md"
README_BEGIN = "<!-- bench.report: begin (python -m bench.report --write; do not edit by hand) -->"
README_END = "<!-- bench.report: end -->"


def _x(v: float) -> str:
    return f"{v:.2f}×"


def _ms_list(values: list[float] | None) -> str:
    """Seconds as comma-separated milliseconds; a dash where results predate the figure."""
    return "–" if values is None else ", ".join(f"{v * 1e3:.0f}" for v in values) + " ms"


def _median_range(values: list[float], scale: float = 1.0) -> str:
    """'median (lowest-highest)' of `values` times `scale`, without decimals."""
    v = [x * scale for x in values]
    return f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"


def _counts(values: list[int] | None) -> str:
    """Comma-separated counts; a dash where results predate the figure."""
    return "–" if values is None else ", ".join(str(v) for v in values)


def _busy_core_table(sizes: list[dict]) -> list[str]:
    """With a core to spare: what the checkpoint's CPU work on that core costs the training step."""
    rows = [z for z in sizes if z.get("neighbour")]
    if not rows:
        return []
    out = [
        "What a checkpoint's work on the spare core costs the step (1 worker): the stall model's step "
        "timed in one process, in blocks alternating with a neighbour process doing a checkpoint's "
        "CPU work (serialization and sha256 of a state of that size, in a loop, at nice 19) stopped "
        "and running (`bench/neighbour.py`); that slowdown, times the CPU time per checkpoint of the "
        "trainer's writer process and of the local S3 store's server (which on AWS runs on S3's "
        "machines), is the part of the loss that comes from sharing the machine:",
        "",
        "| checkpoint | the step with the spare core busy | writer CPU per checkpoint | its cost to the step "
        "| store CPU per checkpoint | its cost to the step | first step after it | lost per checkpoint |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for z in rows:
        n = z["neighbour"]
        low, high = n["interval"] or (None, None)
        spread = f" ({(low - 1) * 100:+.1f} to {(high - 1) * 100:+.1f} %)" if low is not None else ""
        out.append(f"| {z['checkpoint_bytes'] / 1e6:.1f} MB | {(n['ratio'] - 1) * 100:+.1f} %{spread} | "
                   f"{z['writer_cpu_per_checkpoint_s'] * 1e3:.1f} ms | "
                   f"{n['cost_of_writer_cpu_s'] * 1e3:.2f} ms | "
                   f"{z['store_cpu_per_checkpoint_s'] * 1e3:.1f} ms | "
                   f"{n['cost_of_store_cpu_s'] * 1e3:.2f} ms | +{z['first_step_excess_s'] * 1e3:.1f} ms | "
                   f"{z['lost_per_checkpoint_s'] * 1e3:.1f} ms |")
    return [*out, ""]


def _x_target(v: float) -> str:
    """A ratio checked against a target: three decimals, so 0.966 does not read as a met 0.97."""
    return f"{v:.3f}×"


def _interval(per_repeat: list[float]) -> str:
    """The median's distribution-free interval of at least 95 % (bench.stats.median_interval)."""
    ci = median_interval(per_repeat)
    return "– (too few repeats)" if ci is None else f"{ci.low:.3f}–{ci.high:.3f}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _interval_ranks(repeats: int) -> str:
    """Which per-repeat ratios bound the headline's intervals at its number of repeats, in words."""
    ci = median_interval(range(1, repeats + 1))
    if ci is None:
        return f"; with {repeats} repeat{'s' if repeats != 1 else ''}, too few for one"
    return (f"; with {repeats} repeats, the {_ordinal(int(ci.low))} to the {_ordinal(int(ci.high))}, "
            f"{ci.confidence * 100:.0f} % coverage")


def _settings(cfg: dict) -> str:
    """A bare Horovod contender's settings in words."""
    words = [f"{cfg['threads']} torch thread{'s' if cfg['threads'] != 1 else ''} per worker"
             if cfg.get("threads") else "torch's default threads"]
    if cfg.get("pin"):
        words.append("each worker pinned to its own core")
    if cfg.get("cycle_time_ms") is not None:
        words.append(f"Horovod cycle time {cfg['cycle_time_ms']:g} ms")
    if cfg.get("groups"):
        words.append(f"gradients allreduced in {cfg['groups']} group{'s' if cfg['groups'] != 1 else ''}")
    return ", ".join(words)


def markdown(r: dict) -> str:
    m, v, s = r["machine"], r["versions"], r["sections"]
    h = s.get("headline", {})
    ranks = _interval_ranks(h["comparison"]["repeats"]) if h.get("status") == "ok" else ""
    out = [
        "## Performance",
        "",
        f"Measured with {_measured_by(r)} on {m['cores']} cores "
        f"({m['cpu_model']}), Python {v['python']}, torch {v['torch']}, Horovod {v['horovod']}; "
        f"the summary in `bench/results/{r['name']}.json` (every per-step sample in "
        f"`{r['name']}.raw.json` with `scripts/bench --raw`). Every comparison runs its contenders "
        "interleaved (rotated order, one run each per repeat) and reports the median of the per-repeat "
        "ratios. The machine was shared with other work while this ran, "
        "so single samples swing widely: read the "
        "ratios, and the per-repeat spread in the JSON. The 95 % interval of a ratio is distribution-free "
        "(from the order of the per-repeat ratios: the k-th smallest to the k-th largest, with k from "
        f"the binomial distribution{ranks}): the median "
        "of a much longer series lies inside it with that probability.",
        "",
    ]
    if h.get("status") == "ok":
        c = h["comparison"]["contenders"]
        cfg = c["trainer"]["config"]
        e, p = h["efficiency"], h["peer"]
        out += [
            f"**Trainer efficiency and peer comparison** ({cfg['model']} width {cfg['width']}, batch "
            f"{cfg['batch_size']} per worker, {cfg['workers']} workers, "
            f"{h['comparison']['repeats']} repeats; "
            f"{h['window']}; the trainer checkpoints every {cfg['checkpoint_every']} steps to the local S3 "
            f"store ({cfg['checkpoints_in_window']} due inside the window) and writes its metrics "
            f"file; the trainer runs with its own defaults, the bare Horovod loop with the same settings "
            f"({_settings(c['bare-hvd']['config'])}); DDP as torchrun starts it, one torch thread per "
            "worker):",
            "",
            "| contender | median samples/s | ratio | 95 % interval of the ratio | target |",
            "|---|---:|---:|---|---|",
            f"| trainer / bare Horovod loop | {c['trainer']['median']:.0f} / {c['bare-hvd']['median']:.0f} | "
            f"{_x_target(e['trainer_vs_bare_hvd'])} | {_interval(e['per_repeat'])} | "
            f"≥ 0.97: {'met' if e['met'] else '**not met**'} |",
            f"| trainer / torch DDP (Gloo) | {c['trainer']['median']:.0f} / {c['ddp']['median']:.0f} | "
            f"{_x_target(p['trainer']['median'])} | {_interval(p['trainer']['per_repeat'])} | "
            f"≥ 1.0: {'met' if p['trainer']['met'] else '**not met**'} |",
            f"| bare Horovod / torch DDP | {c['bare-hvd']['median']:.0f} / {c['ddp']['median']:.0f} | "
            f"{_x(p['bare-hvd']['median'])} | {_interval(p['bare-hvd']['per_repeat'])} | |",
        ]
        pp = h.get("peer_pinned")
        if pp and "ddp-pin" in c:
            out += [
                f"| trainer / DDP pinned like the trainer | {c['trainer']['median']:.0f} / "
                f"{c['ddp-pin']['median']:.0f} | {_x(pp['trainer']['median'])} | "
                f"{_interval(pp['trainer']['per_repeat'])} | like with like; no target |",
                f"| bare Horovod / DDP pinned alike | {c['bare-hvd']['median']:.0f} / "
                f"{c['ddp-pin']['median']:.0f} | {_x(pp['bare-hvd']['median'])} | "
                f"{_interval(pp['bare-hvd']['per_repeat'])} | |",
            ]
        out += [""]
        tc = h.get("trainer_checkpoints")
        if tc:
            out += [f"The trainer's checkpoints per run, median (range): {_median_range(tc['written'])} "
                    f"written (the final one, after the window, included), "
                    f"{_median_range(tc['deferred'])} deferred past their step while the previous write "
                    f"went on; longest write {_median_range(tc['write_max_s'], 1e3)} ms.", ""]
    st = s.get("peer_study", {})
    if st.get("status") == "ok":
        comp = st["comparison"]
        shape = comp["contenders"]["ddp"]["config"]
        out += [
            f"**Horovod tuning study** (bare loops, {shape.get('steps', '?')} timed steps, "
            f"{comp['repeats']} repeats; "
            "each Horovod setting's ratio to DDP as torchrun starts it, i.e. one torch thread per worker "
            "and no pinning; `pin`: each worker's threads pinned to a core of its own; `groups1`: "
            "DistributedOptimizer(groups=1), one allreduce of all gradients per step):",
            "",
            "| contender | median samples/s | ratio to DDP | per repeat |",
            "|---|---:|---:|---|",
        ]
        for name, cc in comp["contenders"].items():
            if name == comp["baseline"]:
                continue
            rr = comp["ratios"][name]
            out.append(f"| {name} | {cc['median']:.0f} | {_x(rr['median'])} | "
                       f"{', '.join(f'{x:.2f}' for x in rr['per_repeat'])} |")
        out += [f"| (DDP) | {comp['contenders']['ddp']['median']:.0f} | 1.00× | |", ""]
    ck = s.get("checkpoint_stall", {})
    if ck.get("status") == "ok":
        out += [
            "**Checkpoint stall** (trainer, MLP of growing width, a checkpoint every N steps "
            f"to the local S3 store, every step timed, {ck['repeats']} repeats; training time lost per "
            "checkpoint = the steps after it that cover the longest write (at least half the interval) "
            "minus as many steps at the mean of the rest of the interval, median over all checkpoints "
            "with its 95 % interval; target below one step, decided where the interval lies on one "
            "side of it. The same estimate over the runs without checkpoints, at the same steps, is "
            "what the method reads where nothing was written. Cross-check: the same trainer without "
            "checkpoints, interleaved, difference of the timed windows per checkpoint. With 2 workers on "
            "the 2 cores, the writer and the moto server can only take their CPU from training; with "
            "1 worker of 1 thread there is a core to spare, as on a GPU node, and what is left is what "
            "the training process itself pays):",
            "",
            "| layout | checkpoint | every N steps | checkpoints measured | one step | first step after it "
            "| lost per checkpoint (95 % interval) | in steps | verdict | the same estimate without "
            "checkpoints | longest write | cross-check per repeat "
            "| waited for the previous write (per run) | deferred (per run) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|",
        ]
        for z in ck["sizes"]:
            per = ", ".join(f"{x * 1e3:.1f}" for x in z.get("ab_lost_per_repeat_s", []))
            write = max(z.get("write_max_s") or [0.0])
            null = z.get("null_lost_per_checkpoint_s")
            out.append(f"| {z.get('layout', '')} | {z['checkpoint_bytes'] / 1e6:.1f} MB | "
                       f"{z.get('every', ck.get('every'))} | {z.get('checkpoints_measured', '–')} | "
                       f"{z['baseline_step_s'] * 1e3:.1f} ms | "
                       f"+{z['first_step_excess_s'] * 1e3:.1f} ms | "
                       f"{z['lost_per_checkpoint_s'] * 1e3:.1f} ms{ms_interval(z.get('lost_interval_s'))} | "
                       f"{z['lost_in_steps']:.2f} | "
                       f"{stall_verdict(z)} | {'–' if null is None else f'{null * 1e3:.1f} ms'} | "
                       f"{write * 1e3:.0f} ms | {per} ms | {_ms_list(z.get('writer_wait_s'))} | "
                       f"{_counts(z.get('checkpoints_deferred'))} |")
        out.append("")
        out += _busy_core_table(ck["sizes"])
    rc = s.get("recovery", {})
    if rc.get("status") == "ok":
        out += [
            f"**Recovery** (local cluster, {rc['job']['hosts']} hosts, one reclaimed spot-style at step "
            f"{rc['job']['reclaim_at_step']}): SIGTERM to training resumed "
            f"**{rc['sigterm_to_resumed_s']:.1f} s** (the flow resubmitted after "
            f"{rc['sigterm_to_resubmitted_s']:.1f} s); steps of work lost: **{rc['steps_lost']}** "
            f"(stopped at step {rc['interrupted_at_step']} after a SIGTERM checkpoint, resumed from "
            f"{rc['resumed_from_step']}).",
            "",
        ]
    pt = s.get("plan_time", {})
    if pt.get("status") == "ok":
        stacks = pt["figures"].get("stacks", {})
        plans = [f"{name} {f['plan_wall_median_s']:.2f} s wall / {f['plan_cpu_median_s']:.2f} s CPU"
                 for name, f in stacks.items() if "plan_wall_median_s" in f]
        if plans:
            out += [f"**Plan time** (`scripts/plan`, from the config and the catalog): {'; '.join(plans)}.",
                    ""]
        rows = [f"{name} {f['resources']} resources: cold {f['cold_wall_median_s']:.2f} s wall / "
                f"{f['cold_cpu_median_s']:.2f} s CPU, warm {f['warm_median_s']:.2f} s"
                for name, f in stacks.items()]
        out += [f"**The Pulumi program under mocks** (as the infra tests run it, tests/infra/harness.py): "
                f"{'; '.join(rows)}.", ""]
    out += _image_task_block(s.get("image_task", {}))
    out += _input_pipeline_block(s.get("shard_read", {}), s.get("input_pipeline", {}))
    out += _checkpoint_throughput_block(s.get("checkpoint_throughput", {}))
    failed = [f"{name} ({sec['status']}: {sec.get('reason', '')[:200]})" for name, sec in s.items()
              if sec.get("status") != "ok"]
    if failed:
        out += ["Not measured in this run: " + "; ".join(failed), ""]
    return "\n".join(out)


def _runs(r: dict) -> list[tuple[dict, list[str]]]:
    """The runs that measured the document's sections, oldest first, each with its sections: one run,
    or several where a run of some sections kept the others (bench.results.merge)."""
    runs: dict[tuple, tuple[dict, list[str]]] = {}
    for name, sec in r["sections"].items():
        m = sec.get("measured") or measured_by(r)
        runs.setdefault((m["run_started_at"], m["command"]), (m, []))[1].append(name)
    return [runs[key] for key in sorted(runs)]


def _measured_by(r: dict) -> str:
    """The RESULTS.md header's account of the run(s), each with its span and starting load."""
    runs = _runs(r)
    if len(runs) <= 1:
        m = runs[0][0] if runs else measured_by(r)
        return f"`{m['command']}` ({r['started_at']} to {r['finished_at']}, load average " \
               f"{m['load_avg'][0]:.1f} at the start)"
    parts = []
    for m, names in runs:
        spans = [r["sections"][n].get("measured", m) for n in names]
        cpu = "" if m["cpu_model"] == r["machine"]["cpu_model"] else f", on {m['cpu_model']}"
        parts.append(f"`{m['command']}` ({min(x['started_at'] for x in spans)} to "
                     f"{max(x['finished_at'] for x in spans)}, load average {m['load_avg'][0]:.1f} at the "
                     f"start{cpu}) for {', '.join(names)}")
    return f"{len(runs)} runs: " + "; ".join(parts)


def _repeats(n: int) -> str:
    return f"{n} repeat{'s' if n != 1 else ''}"


def _section_load(sec: dict) -> str:
    """' (load average a to b during it)', from the section's own record; '' for older results."""
    m = sec.get("measured")
    if not m or not m.get("load_avg_end"):
        return ""
    return f"; load average {m['load_avg'][0]:.1f} to {m['load_avg_end'][0]:.1f} during it"


def target_words(r: dict) -> str:
    """A ratio's target and verdict, as the tables read: '≥ 0.97: met', with a note where the
    interval holds both sides of the target; '' without a target."""
    if "target" not in r:
        return ""
    undecided = r.get("interval") is not None and not r["decided"]
    return f"≥ {r['target']}: {'met' if r['met'] else '**not met**'}" + \
        ("; its interval holds both sides" if undecided else "")


def _ratio_row(label: str, num: float, den: float, r: dict, unit: str = "", fmt: str = ".0f",
               note: str | None = None) -> str:
    """A table row: the two medians (with their `unit`), the median of the per-repeat ratios,
    its interval and its target."""
    return (f"| {label} | {num:{fmt}} / {den:{fmt}}{unit} | {_x_target(r['median'])} | "
            f"{_interval(r['per_repeat'])} | {target_words(r) if note is None else note} |")


def _image_task_block(it: dict) -> list[str]:
    if it.get("status") != "ok":
        return []
    comp = it["comparison"]
    c, e, p = comp["contenders"], it["efficiency"], it["peer"]
    cfg = c["trainer"]["config"]
    return [
        f"**The image task: trainer efficiency and peer comparison** (torchvision {cfg['model']} at "
        f"{cfg['image_size']} px, batch {cfg['batch_size']} per worker, {cfg['workers']} workers with "
        f"{cfg['loader_workers']} DataLoader process each, {_repeats(comp['repeats'])}; "
        f"{it['window']}{_section_load(it)}. Data: {it['data']}, "
        "read by every contender through the image task's own shard stream and DataLoader "
        "(`bench/image_loop.py`). The trainer runs `--task image` with its defaults and its metrics file, "
        "without checkpoints (their cost is the checkpoint stall's); the bare Horovod loop with the "
        f"trainer's settings ({_settings(c['bare-hvd']['config'])}); DDP as torchrun starts it, one "
        "torch thread per worker, unpinned, held to the same target as the trainer's row above):",
        "",
        "| contender | median samples/s | ratio | 95 % interval of the ratio | target |",
        "|---|---:|---:|---|---|",
        _ratio_row("trainer / bare Horovod loop", c["trainer"]["median"], c["bare-hvd"]["median"], e),
        _ratio_row("trainer / torch DDP (Gloo)", c["trainer"]["median"], c["ddp"]["median"], p["trainer"]),
        _ratio_row("bare Horovod / torch DDP", c["bare-hvd"]["median"], c["ddp"]["median"], p["bare-hvd"]),
        *(_ratio_row(label, c[name]["median"], c["ddp-pin"]["median"], it["peer_pinned"][name],
                     note="like with like; no target")
          for name, label in (("trainer", "trainer / DDP pinned like the trainer"),
                              ("bare-hvd", "bare Horovod / DDP pinned alike"))
          if name in it.get("peer_pinned", {})),
        "",
    ]


def _input_pipeline_block(read: dict, decode: dict) -> list[str]:
    rows = []
    if read.get("status") == "ok":
        c = read["comparison"]["contenders"]
        cfg = c["shard-stream"]["config"]
        rows.append(_ratio_row(
            f"shard stream / bare boto3 `get_object().read()` loop, the same objects from the local store "
            f"({cfg['shards']} shards of {cfg['samples_per_shard']} samples of {cfg['sample_kb']:g} kB, "
            f"{cfg['bytes_per_run'] / 1e6:.0f} MB a run; {_repeats(read['comparison']['repeats'])}"
            f"{_section_load(read)})", c["shard-stream"]["median"] / 1e6, c["bare-boto3"]["median"] / 1e6,
            read["ratio"], unit=" MB/s", fmt=".1f"))
    if decode.get("status") == "ok":
        c = decode["comparison"]["contenders"]
        cfg = c["loader-worker"]["config"]
        rows.append(_ratio_row(
            f"one DataLoader worker / bare loop decoding the same shards with the same transforms "
            f"({cfg['samples_per_run']} generated {cfg['image_px']} px PNGs, {cfg['size']} px crops, batch "
            f"{cfg['batch']}; {_repeats(decode['comparison']['repeats'])}{_section_load(decode)})",
            c["loader-worker"]["median"], c["bare-loop"]["median"], decode["ratio"], unit=" samples/s",
            fmt=".1f"))
    if not rows:
        return []
    return ["**Input pipeline of the image and lm tasks** (`bench/shard_read.py`, `bench/input_pipeline.py`; "
            "each comparison interleaved, rates as medians):", "",
            "| contender | median | ratio | 95 % interval of the ratio | target |",
            "|---|---:|---:|---|---|", *rows, ""]


def _checkpoint_throughput_block(tp: dict) -> list[str]:
    if tp.get("status") != "ok":
        return []
    rows = [_ratio_row(f"{direction} of a {z['bytes'] / 1e9:.2f} GB state ({_repeats(z['repeats'])})",
                       z[direction]["ours_mb_s"], z[direction]["bare_mb_s"], z[direction], unit=" MB/s")
            for z in tp["sizes"] for direction in ("write", "restore")]
    return [f"**Checkpoint write and restore against a bare boto3 transfer of the same bytes** ({tp['store']}"
            f"{_section_load(tp)}; ours / bare, ratio = the bare transfer's time over ours. {tp['method']}):",
            "", "| checkpoint | median MB/s, ours / bare | ratio | 95 % interval of the ratio | target |",
            "|---|---:|---:|---|---|", *rows, ""]


def results_page(r: dict, reading: str) -> str:
    """bench/RESULTS.md: every figure of `r` with its method, then the hand-written reading."""
    return "\n".join([
        "# Benchmark results",
        "",
        "Generated by `python -m bench.report --write` from `bench/results/"
        f"{r['name']}.json` and `bench/reading.md`; the short table in the README comes from the same file.",
        "",
        markdown(r).rstrip("\n"),
        "",
        reading.rstrip("\n"),
        "",
    ])


def _stall_target(z: dict) -> str:
    """A stall row's verdict against its target of one step, as the other targets read."""
    verdict = stall_verdict(z)
    return {"< 1 step": "met", ">= 1 step": "**not met**"}.get(verdict, verdict)


def readme_table(r: dict) -> str:
    """The README's Performance table: the headline ratios, their date and machine, a link to the rest."""
    m, s = r["machine"], r["sections"]
    rows = []
    h = s.get("headline", {})
    if h.get("status") == "ok":
        e, p = h["efficiency"], h["peer"]
        rows += [
            f"| trainer / bare Horovod loop (samples/s) | {_x_target(e['trainer_vs_bare_hvd'])} "
            f"({_interval(e['per_repeat'])}) | ≥ 0.97: {'met' if e['met'] else '**not met**'} |",
            f"| trainer / torch DDP over Gloo (samples/s) | {_x_target(p['trainer']['median'])} "
            f"({_interval(p['trainer']['per_repeat'])}) | "
            f"≥ 1.0: {'met' if p['trainer']['met'] else '**not met**'} |",
        ]
    ck = s.get("checkpoint_stall", {})
    if ck.get("status") == "ok":
        for z in ck["sizes"]:
            if z.get("workers") == 1 or z.get("layout", "").startswith("1 worker"):
                rows.append(f"| training time lost per checkpoint of {z['checkpoint_bytes'] / 1e6:.1f} MB, "
                            f"a core to spare | {z['lost_per_checkpoint_s'] * 1e3:.1f} ms against a "
                            f"{z['baseline_step_s'] * 1e3:.1f} ms step | < 1 step: {_stall_target(z)} |")
    rc = s.get("recovery", {})
    if rc.get("status") == "ok":
        rows.append(f"| spot reclaim: SIGTERM to training resumed, steps lost | "
                    f"{rc['sigterm_to_resumed_s']:.1f} s, {rc['steps_lost']} | |")
    it = s.get("image_task", {})
    if it.get("status") == "ok":
        rows += [_readme_row("image task: trainer / bare Horovod loop", it["efficiency"]),
                 _readme_row("image task: trainer / DDP over Gloo", it["peer"]["trainer"])]
    for name, what in (("shard_read", "shard stream / bare boto3 reads, local S3"),
                       ("input_pipeline", "1 DataLoader worker / bare decode loop")):
        if s.get(name, {}).get("status") == "ok":
            rows.append(_readme_row(what, s[name]["ratio"]))
    tp = s.get("checkpoint_throughput", {})
    if tp.get("status") == "ok":
        for z in tp["sizes"]:  # one row a size, write / restore (the README has a size limit)
            w, rs = (_readme_cells(z[d]) for d in ("write", "restore"))
            rows.append(f"| checkpoint write / restore, {z['bytes'] / 1e9:.1f} GB / bare boto3, local S3 | "
                        f"{w[0]} / {rs[0]} | ≥ {z['write']['target']}: {w[1]} / {rs[1]} |")
    runs = _runs(r)
    # The README has a size limit: the runs of single sections are named in RESULTS.md only.
    dates = sorted({m["run_started_at"][:10] for m, _ in runs})  # the first and the last
    by = f"{' to '.join(dates[::max(1, len(dates) - 1)])} by " + \
        (f"{len(runs)} runs of `scripts/bench` sections" if len(runs) > 1 else f"`{runs[0][0]['command']}`")
    head = [
        f"Measured {by} on {m['cores']} cores ({m['cpu_model']}), shared with other work: read the "
        "ratios (95 % interval in parentheses), not the rates. Methods and every figure: "
        "[bench/RESULTS.md](bench/RESULTS.md).",
        "",
        "| what | measured | target |",
        "|---|---|---|",
    ]
    return "\n".join([README_BEGIN, *head, *rows, README_END])


def _readme_cells(r: dict) -> tuple[str, str]:
    """A ratio with its interval, and its verdict ("undecided" where the interval holds both sides of
    the target), as short as the README's size limit wants them."""
    ci = "too few repeats for an interval" if r.get("interval") is None else _interval(r["per_repeat"])
    verdict = ("met" if r["met"] else "**not met**") + \
        (" (undecided)" if r.get("interval") is not None and not r["decided"] else "")
    return f"{_x_target(r['median'])} ({ci})", verdict


def _readme_row(what: str, r: dict) -> str:
    """A README row (kept short: the README has a size limit)."""
    ratio, verdict = _readme_cells(r)
    return f"| {what} | {ratio} | ≥ {r['target']}: {verdict} |"


def replace_readme_table(readme: str, table: str) -> str:
    """`readme` with the text between the markers (markers included) replaced by `table`."""
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(readme):
        raise ValueError(f"README.md has no {README_BEGIN!r} ... {README_END!r} block")
    return pattern.sub(lambda _: table, readme, count=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?", type=Path, default=RESULTS_DIR / "latest.json")
    p.add_argument("--write", action="store_true",
                   help=f"write {RESULTS_MD.relative_to(ROOT)} and README.md's table instead of printing")
    args = p.parse_args(argv)
    try:
        results = json.loads(args.path.read_text())
        reading = READING.read_text()
    except (OSError, json.JSONDecodeError) as e:
        print(f"bench.report: cannot read {getattr(e, 'filename', None) or args.path}: {e}", file=sys.stderr)
        return 2
    if not args.write:
        print(results_page(results, reading), end="")
        return 0
    try:
        readme = replace_readme_table(README.read_text(), readme_table(results))
    except ValueError as e:
        print(f"bench.report: {e}", file=sys.stderr)
        return 2
    RESULTS_MD.write_text(results_page(results, reading))
    README.write_text(readme)
    print(f"wrote {RESULTS_MD.relative_to(ROOT)} and the Performance table in README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
