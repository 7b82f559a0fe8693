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
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.figures import Ratio, Recovery, StallRow, Transfer
from bench.reading import fill
from bench.results import RESULTS_DIR, measured_by
from bench.stats import median_interval

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
README = ROOT / "README.md"
# Written by hand, dated, about one run: what the figures mean, and measurements made outside
# `scripts/bench` (each names its command). Appended to RESULTS.md as it stands.
READING = ROOT / "bench" / "reading.md"
README_BEGIN = "<!-- bench.report: begin (python -m bench.report --write; do not edit by hand) -->"
README_END = "<!-- bench.report: end -->"
# Benches run outside `scripts/bench`, each writing its own file beside the results file (name, the
# command that writes it): rendered as sections of these names where the file is there, and named as
# missing where it is not.
SIDE_FILES = {"tokens": ("tokens.json", "python -m bench.tokens --out {path}"),
              "image_input": ("image_input.json", "python -m bench.image_input --out {path}")}


def _x(v: float) -> str:
    """A ratio checked against a target: three decimals, so 0.966 does not read as a met 0.97."""
    return f"{v:.3f}×"


def _ms_list(values: Sequence[float] | None) -> str:
    """Seconds as comma-separated milliseconds; a dash where results predate the figure."""
    return "–" if values is None else ", ".join(f"{v * 1e3:.0f}" for v in values) + " ms"


def _median_range(values: list[float], scale: float = 1.0) -> str:
    """'median (lowest-highest)' of `values` times `scale`, without decimals."""
    v = [x * scale for x in values]
    return f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"


def _counts(values: Sequence[int] | None) -> str:
    """Comma-separated counts; a dash where results predate the figure."""
    return "–" if values is None else ", ".join(str(v) for v in values)


def ms_interval(interval: tuple[float, float] | None) -> str:
    """' (low to high)' in milliseconds after a figure; '' where there is no interval."""
    return "" if interval is None else f" ({interval[0] * 1e3:.1f} to {interval[1] * 1e3:.1f})"


def _ms(seconds: float | None, sign: str = "") -> str:
    return "–" if seconds is None else f"{seconds * 1e3:{sign}.1f} ms"


def _interval(r: Ratio) -> str:
    """The median's distribution-free interval of at least 95 % (bench.stats.median_interval)."""
    ci = r.interval
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


def _repeats(n: int) -> str:
    return f"{n} repeat{'s' if n != 1 else ''}"


def _section_load(sec: dict) -> str:
    """'; load average a to b during it', from the section's own record; '' for older results."""
    m = sec.get("measured")
    if not m or not m.get("load_avg_end"):
        return ""
    return f"; load average {m['load_avg'][0]:.1f} to {m['load_avg_end'][0]:.1f} during it"


def _marked(verdict: str) -> str:
    """A verdict (bench.figures.verdict) with 'not met' in bold, to be seen in a table."""
    return verdict.replace("not met", "**not met**")


def _bound(r: Ratio) -> str:
    """The target as a bound: '≥ 0.97', or '≤ 1.5' for a cost."""
    return f"{'≤' if r.at_most else '≥'} {r.target}"


def target_words(r: Ratio) -> str:
    """'≥ 0.97: met', '≥ 0.97: met (undecided)', ...; '' without a target."""
    return "" if r.target is None else f"{_bound(r)}: {_marked(r.verdict())}"


def _ratio_row(label: str, num: float, den: float, r: Ratio, unit: str = "", fmt: str = ".0f",
               note: str | None = None) -> str:
    """A table row: the two medians (with their `unit`), the median of the per-repeat ratios,
    its interval and its target."""
    return (f"| {label} | {num:{fmt}} / {den:{fmt}}{unit} | {_x(r.median)} | "
            f"{_interval(r)} | {target_words(r) if note is None else note} |")


RATIO_TABLE = ["| contender | median samples/s | ratio | 95 % interval of the ratio | target |",
               "|---|---:|---:|---|---|"]
# The same, for rows of different units (each row's medians carry theirs).
MEDIAN_TABLE = ["| contender | median | ratio | 95 % interval of the ratio | target |",
                "|---|---:|---:|---|---|"]


def _peer_rows(sec: dict) -> list[str]:
    """The trainer, the bare Horovod loop and DDP against each other (the headline, the image task)."""
    c = sec["comparison"]["contenders"]
    peer = {name: Ratio.from_json(v) for name, v in sec["peer"].items()}
    pinned = {name: Ratio.from_json(v) for name, v in sec.get("peer_pinned", {}).items()}
    rows = [_ratio_row("trainer / bare Horovod loop", c["trainer"]["median"], c["bare-hvd"]["median"],
                       Ratio.from_json(sec["efficiency"])),
            _ratio_row("trainer / torch DDP (Gloo)", c["trainer"]["median"], c["ddp"]["median"],
                       peer["trainer"]),
            _ratio_row("bare Horovod / torch DDP", c["bare-hvd"]["median"], c["ddp"]["median"],
                       Ratio.of(peer["bare-hvd"].per_repeat))]   # no target (older results had one)
    if "ddp-pin" in c:
        rows += [_ratio_row(label, c[name]["median"], c["ddp-pin"]["median"], pinned[name],
                            note="like with like; no target")
                 for name, label in (("trainer", "trainer / DDP pinned like the trainer"),
                                     ("bare-hvd", "bare Horovod / DDP pinned alike")) if name in pinned]
    return rows


def _header(r: dict) -> list[str]:
    m, v, h = r["machine"], r["versions"], r["sections"].get("headline", {})
    ranks = _interval_ranks(h["comparison"]["repeats"]) if h.get("status") == "ok" else ""
    return [
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
        "of a much longer series lies inside it with that probability. A target is met or not by the "
        "median; undecided where the interval holds both sides of it.",
        "",
    ]


def _headline_block(h: dict) -> list[str]:
    c = h["comparison"]["contenders"]
    cfg = c["trainer"]["config"]
    out = [
        f"**Trainer efficiency and peer comparison** ({cfg['model']} width {cfg['width']}, batch "
        f"{cfg['batch_size']} per worker, {cfg['workers']} workers, {_repeats(h['comparison']['repeats'])}; "
        f"{h['window']}; the trainer checkpoints every {cfg['checkpoint_every']} steps to the local S3 "
        f"store ({cfg['checkpoints_in_window']} due inside the window) and writes its metrics "
        f"file; the trainer runs with its own defaults, the bare Horovod loop with the same settings "
        f"({_settings(c['bare-hvd']['config'])}); DDP as torchrun starts it, one torch thread per "
        "worker):",
        "", *RATIO_TABLE, *_peer_rows(h), "",
    ]
    tc = h.get("trainer_checkpoints")
    if tc:
        out += [f"The trainer's checkpoints per run, median (range): {_median_range(tc['written'])} "
                f"written (the final one, after the window, included), "
                f"{_median_range(tc['deferred'])} deferred past their step while the previous write "
                f"went on; longest write {_median_range(tc['write_max_s'], 1e3)} ms.", ""]
    return out


def _study_block(st: dict) -> list[str]:
    comp = st["comparison"]
    shape = comp["contenders"]["ddp"]["config"]
    out = [
        f"**Horovod tuning study** (bare loops, {shape.get('steps', '?')} timed steps, "
        f"{_repeats(comp['repeats'])}; "
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
        out.append(f"| {name} | {cc['median']:.0f} | {rr['median']:.2f}× | "
                   f"{', '.join(f'{x:.2f}' for x in rr['per_repeat'])} |")
    return [*out, f"| (DDP) | {comp['contenders']['ddp']['median']:.0f} | 1.00× | |", ""]


STALL_INTRO = (
    "**Checkpoint stall** (trainer, MLP of growing width, a checkpoint every N steps "
    "to the local S3 store, every step timed, {repeats}; training time lost per "
    "checkpoint = the steps after it that cover the longest write (at least half the interval) "
    "minus as many steps at the mean of the rest of the interval, median over all checkpoints "
    "with its 95 % interval; target below one step, decided where the interval lies on one "
    "side of it. The same estimate over the runs without checkpoints, at the same steps, is "
    "what the method reads where nothing was written. Cross-check: the same trainer without "
    "checkpoints, interleaved, difference of the timed windows per checkpoint. With 2 workers on "
    "the 2 cores, the writer and the moto server can only take their CPU from training; with "
    "1 worker of 1 thread there is a core to spare, as on a GPU node, and what is left is what "
    "the training process itself pays):")


def _stall_block(ck: dict) -> list[str]:
    rows = [StallRow.from_json(z) for z in ck["sizes"]]
    out = [
        STALL_INTRO.format(repeats=_repeats(ck["repeats"])),
        "",
        "| layout | checkpoint | every N steps | checkpoints measured | one step | first step after it "
        "| lost per checkpoint (95 % interval) | in steps | < 1 step | the same estimate without "
        "checkpoints | longest write | cross-check per repeat "
        "| waited for the previous write (per run) | deferred (per run) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|",
    ]
    for z in rows:
        per = ", ".join(f"{x * 1e3:.1f}" for x in z.ab_lost_per_repeat_s)
        out.append(f"| {z.layout} | {z.checkpoint_bytes / 1e6:.1f} MB | {z.every or ck.get('every')} | "
                   f"{z.checkpoints_measured or '–'} | {z.baseline_step_s * 1e3:.1f} ms | "
                   f"{_ms(z.first_step_excess_s, '+')} | "
                   f"{z.lost_per_checkpoint_s * 1e3:.1f} ms{ms_interval(z.lost_interval_s)} | "
                   f"{z.lost_in_steps:.2f} | {_marked(z.verdict())} | {_ms(z.null_lost_per_checkpoint_s)} | "
                   f"{max(z.write_max_s or [0.0]) * 1e3:.0f} ms | {per} ms | {_ms_list(z.writer_wait_s)} | "
                   f"{_counts(z.checkpoints_deferred)} |")
    return [*out, "", *_busy_core_table(rows)]


def _busy_core_table(rows: list[StallRow]) -> list[str]:
    """With a core to spare: what the checkpoint's CPU work on that core costs the training step."""
    rows = [z for z in rows if z.neighbour is not None]
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
        n = z.neighbour
        spread = "" if n.interval is None else \
            f" ({(n.interval[0] - 1) * 100:+.1f} to {(n.interval[1] - 1) * 100:+.1f} %)"
        out.append(f"| {z.checkpoint_bytes / 1e6:.1f} MB | {(n.ratio - 1) * 100:+.1f} %{spread} | "
                   f"{_ms(z.writer_cpu_per_checkpoint_s)} | {n.cost_of_writer_cpu_s * 1e3:.2f} ms | "
                   f"{_ms(z.store_cpu_per_checkpoint_s)} | {n.cost_of_store_cpu_s * 1e3:.2f} ms | "
                   f"{_ms(z.first_step_excess_s, '+')} | {z.lost_per_checkpoint_s * 1e3:.1f} ms |")
    return [*out, ""]


def _recovery_block(rc: dict) -> list[str]:
    r = Recovery.from_json(rc)
    resubmitted = "" if r.sigterm_to_resubmitted_s is None else \
        f" (the flow resubmitted after {r.sigterm_to_resubmitted_s:.1f} s)"
    return [f"**Recovery** (local cluster, {rc['job']['hosts']} hosts, one reclaimed spot-style at step "
            f"{rc['job']['reclaim_at_step']}): SIGTERM to training resumed "
            f"**{r.sigterm_to_resumed_s:.1f} s**{resubmitted}; steps of work lost: **{r.steps_lost}** "
            f"(stopped at step {r.interrupted_at_step} after a SIGTERM checkpoint, resumed from "
            f"{r.resumed_from_step}).", ""]


def _plan_time_block(pt: dict) -> list[str]:
    stacks = pt["figures"].get("stacks", {})
    out = []
    plans = [f"{name} {f['plan_wall_median_s']:.2f} s wall / {f['plan_cpu_median_s']:.2f} s CPU"
             for name, f in stacks.items() if "plan_wall_median_s" in f]
    if plans:
        out += [f"**Plan time** (`scripts/plan`, from the config and the catalog): {'; '.join(plans)}.", ""]
    rows = [f"{name} {f['resources']} resources: cold {f['cold_wall_median_s']:.2f} s wall / "
            f"{f['cold_cpu_median_s']:.2f} s CPU, warm {f['warm_median_s']:.2f} s"
            for name, f in stacks.items()]
    return [*out, f"**The Pulumi program under mocks** (as the infra tests run it, tests/infra/harness.py): "
                  f"{'; '.join(rows)}.", ""]


def _image_task_block(it: dict) -> list[str]:
    comp = it["comparison"]
    c = comp["contenders"]
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
        "", *RATIO_TABLE, *_peer_rows(it), "",
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
            Ratio.from_json(read["ratio"]), unit=" MB/s", fmt=".1f"))
    if decode.get("status") == "ok":
        c = decode["comparison"]["contenders"]
        cfg = c["loader-worker"]["config"]
        rows.append(_ratio_row(
            f"one DataLoader worker / bare loop decoding the same shards with the same transforms "
            f"({cfg['samples_per_run']} generated {cfg['image_px']} px PNGs, {cfg['size']} px crops, batch "
            f"{cfg['batch']}; {_repeats(decode['comparison']['repeats'])}{_section_load(decode)})",
            c["loader-worker"]["median"], c["bare-loop"]["median"], Ratio.from_json(decode["ratio"]),
            unit=" samples/s", fmt=".1f"))
    if not rows:
        return []
    return ["**Input pipeline of the image and lm tasks** (`bench/shard_read.py`, `bench/input_pipeline.py`; "
            "each comparison interleaved, rates as medians):", "",
            *MEDIAN_TABLE, *rows, ""]


def _transfers(tp: dict) -> list[tuple[dict, Transfer, Transfer]]:
    """Each size of the checkpoint-throughput section with its write and its restore."""
    return [(z, Transfer.from_json(z["write"], z["bytes"]), Transfer.from_json(z["restore"], z["bytes"]))
            for z in tp["sizes"]]


def _checkpoint_throughput_block(tp: dict) -> list[str]:
    rows = [_ratio_row(f"{direction} of a {z['bytes'] / 1e9:.2f} GB state ({_repeats(z['repeats'])})",
                       t.ours_mb_s, t.bare_mb_s, t.ratio, unit=" MB/s")
            for z, write, restore in _transfers(tp)
            for direction, t in (("write", write), ("restore", restore))]
    return [f"**Checkpoint write and restore against a bare boto3 transfer of the same bytes** ({tp['store']}"
            f"{_section_load(tp)}; ours / bare, ratio = the bare transfer's time over ours. {tp['method']}):",
            "", "| checkpoint | median MB/s, ours / bare | ratio | 95 % interval of the ratio | target |",
            "|---|---:|---:|---|---|", *rows, ""]


def _when(row: dict) -> str:
    """'; measured 2026-12-07 06:37, load average 0.8' from a bench.tokens row's own record."""
    m = row["measured"]
    return f"; measured {m['started'][:16].replace('T', ' ')}, load average {m['load_average']:.1f}"


def _tokens_block(tk: dict) -> list[str]:
    rows, runs = [], []
    if "token_pipeline" in tk:
        tp = tk["token_pipeline"]
        sh = tp["shape"]
        labels = {"stream_inline": "token stream, each block read when needed (`--readahead-blocks 0`)",
                  "stream": "token stream, its default read-ahead (4 blocks on threads)",
                  "bare_memmap": "bare loop through a numpy memmap"}
        untargeted = {"stream": "the mode for S3; no target here", "stream_inline": "the mode for a local "
                      "disk; no target here", "bare_memmap": "what a read costs; no target"}
        for comparison, where in ((tp, "local disk"), (tp.get("s3"), "S3")):
            if comparison is None:  # a row written before the S3 comparison
                continue
            c = comparison["contenders"]
            for name, ratio in comparison["ratios"].items():
                r = Ratio.from_json(ratio)
                note = None if r.target is not None else untargeted[name]
                rows.append(_ratio_row(f"{where}: {labels[name]} / bare loop of ranged reads",
                                       c[name]["median"] / 1e6, c[comparison["baseline"]]["median"] / 1e6, r,
                                       unit=" M tokens/s", note=note))
        runs.append(f"the token stream's {sh['seq_len']}-token windows, batch {sh['batch']}, {sh['steps']} "
                    f"batches a run from {sh['blocks']} blocks of {sh['block_tokens']} {sh['dtype']} tokens, "
                    f"{_repeats(tp['repeats'])}"
                    + (f", every run a fresh process, on a local disk and on the {tp['s3']['store']}"
                       if "s3" in tp else "") + _when(tp))
    if "packing" in tk:
        pk = tk["packing"]
        c = pk["contenders"]
        rows.append(_ratio_row("`pack tokens`, one tokenizer process / the tokenizer alone, per CPU-second "
                               "of one more pass over the text", c["pack_tokens"]["median"],
                               c["tokenizer_alone"]["median"], Ratio.from_json(pk["ratios"]["pack_tokens"]),
                               unit=" MB/s", fmt=".2f"))
        runs.append(f"packing {pk['text_mb']:.1f} MB of text (the corpus packed twice over less once; a "
                    f"single command, its start-up included, packs {pk['one_command_mb_per_cpu_s']:.2f} MB "
                    f"per CPU-second), {_repeats(pk['repeats'])}{_when(pk)}")
    if "trainer_vs_bare" in tk:
        tr = tk["trainer_vs_bare"]
        c = tr["contenders"]
        cfg = c["trainer"]["config"]
        rows.append(_ratio_row("trainer (`--task lm`) / bare Horovod loop", c["trainer"]["median"],
                               c["bare-hvd"]["median"], Ratio.from_json(tr["efficiency"]), unit=" tokens/s"))
        runs.append(f"the trainer's GPT of {cfg['layers']} layers, width {cfg['dim']}, context "
                    f"{cfg['seq_len']}, batch {cfg['batch_size']} per worker, {cfg['workers']} workers, "
                    f"{tr['window']}, {_repeats(tr['repeats'])}{_when(tr)}")
    return [f"**The lm task's text path and trainer** (`python -m bench.tokens`, outside `scripts/bench`, "
            f"from `{tk['side_file']}`; each comparison interleaved, rates as medians):", "",
            *MEDIAN_TABLE, *rows, "", "Each row's run: " + "; ".join(runs) + ".", ""]


def _image_input_block(ii: dict) -> list[str]:
    comp = ii["comparison"]
    c, cpu = comp["contenders"], ii["main_cpu_us_per_image"]
    cfg = c["task-2w"]["config"]
    rate = {name: c[name]["median"] for name in ("task-2w", "task-1w", "bare-wds-2w")}
    return [f"**The image task's input path at photo sizes** (`python -m bench.image_input`, outside "
            f"`scripts/bench`, from `{ii['side_file']}`: the task's loader against a bare WebDataset loop "
            f"with the same decoder and crops, {cfg['width']}x{cfg['height']} JPEGs at quality "
            f"{cfg['quality']}, {cfg['size']} px crops, batch {cfg['batch']}, {cfg['images_per_run']} images "
            f"a run, {_repeats(comp['repeats'])}, interleaved):", "",
            *MEDIAN_TABLE,
            _ratio_row("the task's loader / bare loop, 2 DataLoader workers each", rate["task-2w"],
                       rate["bare-wds-2w"], Ratio.from_json(ii["images_per_s_vs_bare"]), unit=" images/s"),
            _ratio_row("the training process's CPU per image: the task's loader / bare loop", cpu["task-2w"],
                       cpu["bare-wds-2w"], Ratio.from_json(ii["main_cpu_per_image_vs_bare"]), unit=" µs"),
            _ratio_row("the task's loader, 2 workers / 1 worker", rate["task-2w"], rate["task-1w"],
                       Ratio.from_json(ii["two_workers_vs_one"]), unit=" images/s"), ""]


# The sections of RESULTS.md in order, each rendered from its section when that ran and is "ok"; the
# side files' sections last.
BLOCKS = (("headline", _headline_block), ("peer_study", _study_block), ("checkpoint_stall", _stall_block),
          ("recovery", _recovery_block), ("plan_time", _plan_time_block), ("image_task", _image_task_block),
          ("checkpoint_throughput", _checkpoint_throughput_block), ("tokens", _tokens_block),
          ("image_input", _image_input_block))


def markdown(r: dict) -> str:
    s = r["sections"]
    ok = {name: sec for name, sec in s.items() if sec.get("status") == "ok"}
    out = _header(r)
    for name, block in BLOCKS:
        if name == "checkpoint_throughput":  # the input pipeline's rows come before it
            out += _input_pipeline_block(ok.get("shard_read", {}), ok.get("input_pipeline", {}))
        if name in ok:
            out += block(ok[name])
    # a failed section's reason may be a long error, cut; a missing side file's is ours, and names a path
    failed = [f"{name} ({sec['status']}: "
              f"{sec['reason'] if 'side_file' in sec else sec.get('reason', '')[:200]})"
              for name, sec in s.items() if name not in ok]
    if failed:
        out += ["Not measured in this run: " + "; ".join(failed), ""]
    return "\n".join(out)


def _runs(r: dict) -> list[tuple[dict, list[str]]]:
    """The runs that measured the document's sections, oldest first, each with its sections: one run,
    or several where a run of some sections kept the others (bench.results.merge)."""
    runs: dict[tuple, tuple[dict, list[str]]] = {}
    for name, sec in r["sections"].items():
        if "side_file" in sec:  # not a run of scripts/bench: each side file's rows say when they ran
            continue
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



def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def side_section(name: str, folder: Path) -> dict:
    """The section `name` of SIDE_FILES from its file in `folder`, its ratios against their targets
    (bench.tokens.with_targets, bench.image_input.with_targets); {"status": "missing", ...} naming the
    command that writes it where the file is not there. ValueError for a file that cannot be read."""
    file, command = SIDE_FILES[name]
    path = folder / file
    where = _shown(path)
    if not path.exists():
        return {"status": "missing", "side_file": where,
                "reason": f"{where} is not there; `{command.format(path=where)}` writes it"}
    if name == "tokens":
        from bench.tokens import with_targets  # imports torch: only where the file is there
    else:
        from bench.image_input import with_targets
    try:
        return {**with_targets(json.loads(path.read_text())), "status": "ok", "side_file": where}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read {where}: {type(e).__name__}: {e}") from None


def load_results(path: Path) -> dict:
    """The results file at `path` with the side files beside it as its sections SIDE_FILES (what
    `python -m bench.report` renders); ValueError or OSError naming a file that cannot be read."""
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    side = {name: side_section(name, path.parent) for name in SIDE_FILES}
    return {**results, "sections": {**results["sections"], **side}}


def results_page(r: dict, reading: str) -> str:
    """bench/RESULTS.md: every figure of `r` with its method, then the hand-written reading."""
    return "\n".join([
        "# Benchmark results",
        "",
        "Generated by `python -m bench.report --write` from `bench/results/"
        f"{r['name']}.json` (and the files of the benches run outside `scripts/bench` beside it) and "
        "`bench/reading.md`; the short table in the README comes from the same files.",
        "",
        markdown(r).rstrip("\n"),
        "",
        fill(reading, r).rstrip("\n"),
        "",
    ])


def readme_table(r: dict) -> str:
    """The README's Performance table: the headline ratios, their date and machine, a link to the rest."""
    m, s = r["machine"], r["sections"]
    ok = {name: sec for name, sec in s.items() if sec.get("status") == "ok"}
    rows = []
    if "headline" in ok:
        h = ok["headline"]
        rows += [_readme_row("trainer / bare Horovod loop (samples/s)", Ratio.from_json(h["efficiency"])),
                 _readme_row("trainer / torch DDP over Gloo (samples/s)",
                             Ratio.from_json(h["peer"]["trainer"]))]
    stall = ok.get("checkpoint_stall", {}).get("sizes", [])
    spare = [z for z in map(StallRow.from_json, stall) if z.workers == 1]
    if spare:  # one row for all sizes (README's limit), 'a / b / c' in each cell

        def each(figure: Callable[[StallRow], str]) -> str:
            return " / ".join(map(figure, spare))

        rows.append(f"| training time lost per checkpoint of "
                    f"{each(lambda z: f'{z.checkpoint_bytes / 1e6:.1f}')} MB, a core to spare | "
                    f"{each(lambda z: f'{z.lost_per_checkpoint_s * 1e3:.1f}')} ms "
                    f"against a {each(lambda z: f'{z.baseline_step_s * 1e3:.1f}')} ms step | "
                    f"< 1 step: {each(lambda z: _marked(z.verdict()))} |")
    if "recovery" in ok:
        rc = Recovery.from_json(ok["recovery"])
        rows.append(f"| spot reclaim: SIGTERM to training resumed, steps lost | "
                    f"{rc.sigterm_to_resumed_s:.1f} s, {rc.steps_lost} | |")
    if "image_task" in ok:
        it = ok["image_task"]
        rows += [_readme_row("image task: trainer / bare Horovod loop", Ratio.from_json(it["efficiency"])),
                 _readme_row("image task: trainer / DDP over Gloo", Ratio.from_json(it["peer"]["trainer"]))]
    for name, what in (("shard_read", "shard stream / bare boto3 reads, local S3"),
                       ("input_pipeline", "1 DataLoader worker / bare decode loop")):
        if name in ok:
            rows.append(_readme_row(what, Ratio.from_json(ok[name]["ratio"])))
    if "checkpoint_throughput" in ok:
        for z, write, restore in _transfers(ok["checkpoint_throughput"]):  # one row a size (README's limit)
            rows.append(_readme_pair(f"checkpoint write / restore, {z['bytes'] / 1e9:.1f} GB / bare boto3, "
                                     "local S3", write.ratio, restore.ratio))
    tk = ok.get("tokens", {})
    if "token_pipeline" in tk:
        ratios = {name: Ratio.from_json(v) for name, v in tk["token_pipeline"]["ratios"].items()}
        s3 = tk["token_pipeline"].get("s3")
        if s3 is None:  # a row written before the S3 comparison
            rows.append(_readme_row("lm token stream / bare reads: local disk inline",
                                    ratios["stream_inline"]))
        else:
            rows.append(_readme_pair("lm token stream / bare reads: local disk inline / S3 read-ahead",
                                     ratios["stream_inline"], Ratio.from_json(s3["ratios"]["stream"])))
    if "packing" in tk:
        rows.append(_readme_row("lm packing / tokenizer alone (MB per CPU-s, one more pass)",
                                Ratio.from_json(tk["packing"]["ratios"]["pack_tokens"])))
    if "trainer_vs_bare" in tk:
        rows.append(_readme_row("lm trainer / bare Horovod loop (tokens/s)",
                                Ratio.from_json(tk["trainer_vs_bare"]["efficiency"])))
    runs = _runs(r)
    # The README has a size limit: the runs of single sections are named in RESULTS.md only.
    dates = sorted({m["run_started_at"][:10] for m, _ in runs} |
                   {row["measured"]["started"][:10] for row in tk.values() if isinstance(row, dict)})
    by = f"{' to '.join(dates[::max(1, len(dates) - 1)])} by " + \
        (f"{len(runs)} runs of `scripts/bench` sections" if len(runs) > 1 else f"`{runs[0][0]['command']}`")
    if tk:
        by += " and `bench.tokens`"
    head = [
        f"Measured {by} on {m['cores']} shared cores ({m['cpu_model']}): read the ratios (95 % interval "
        "in parentheses). Methods, every figure: [bench/RESULTS.md](bench/RESULTS.md).",
        "",
        "| what | measured | target |",
        "|---|---|---|",
    ]
    return "\n".join([README_BEGIN, *head, *rows, README_END])


def _readme_cells(r: Ratio) -> tuple[str, str]:
    """A ratio with its interval, and its verdict, as short as the README's size limit wants them."""
    ci = "too few repeats for an interval" if r.interval is None else _interval(r)
    return f"{_x(r.median)} ({ci})", _marked(r.verdict())


def _readme_row(what: str, r: Ratio) -> str:
    ratio, words = _readme_cells(r)
    return f"| {what} | {ratio} | {_bound(r)}: {words} |"


def _readme_pair(what: str, first: Ratio, second: Ratio) -> str:
    """One row for two ratios against the same target, 'first / second' in each cell."""
    (a, av), (b, bv) = _readme_cells(first), _readme_cells(second)
    return f"| {what} | {a} / {b} | {_bound(first)}: {av} / {bv} |"


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
        results = load_results(args.path)
        reading = READING.read_text()
    except OSError as e:
        print(f"bench.report: cannot read {e.filename or args.path}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"bench.report: {e}", file=sys.stderr)
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
