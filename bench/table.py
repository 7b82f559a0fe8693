"""The human table printed at the end of a run (pure: results dict in, text out)."""

from __future__ import annotations

import statistics

from bench.figures import Ratio, Recovery, StallRow, Transfer
from bench.stats import median_interval


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def _ratio_target(x: float) -> str:
    """A ratio checked against a target: three decimals, so 0.966 does not read as a met 0.97."""
    return f"{x:.3f}x"


def _interval(per_repeat: list[float]) -> str:
    ci = median_interval(per_repeat)
    return "too few repeats for a 95% interval" if ci is None else \
        f"{ci.confidence:.0%} interval {ci.low:.3f}..{ci.high:.3f}"


def render(results: dict) -> str:
    lines = [f"benchmark {results['name']} ({'quick' if results['quick'] else 'full'} run) on "
             f"{results['machine']['cores']} cores, {results['machine']['cpu_model']}; "
             f"python {results['versions']['python']}, torch {results['versions']['torch']}, "
             f"horovod {results['versions']['horovod']}"]
    sections = results["sections"]
    for name, section in sections.items():
        if section["status"] != "ok":
            lines.append(f"\n[{name}] {section['status'].upper()}: {section.get('reason', '')}")
            continue
        lines.append(f"\n[{name}]")
        lines += _RENDERERS.get(name, lambda s: ["  (no table for this section)"])(section)
    return "\n".join(lines)


def _comparison_rows(comp: dict, unit: str = "samples/s") -> list[str]:
    base = comp["baseline"]
    w = max(28, *(len(name) for name in comp["contenders"]))
    rows = [f"  {'contender':{w}} {'median ' + unit:>18} {'ratio to ' + base:>16}   per repeat"]
    for name, c in comp["contenders"].items():
        r = comp["ratios"].get(name)
        ratio = _ratio(r["median"]) if r else "(baseline)"
        per = " ".join(f"{x:.2f}" for x in r["per_repeat"]) if r else ""
        rows.append(f"  {name:{w}} {c['median']:>18.1f} {ratio:>16}   {per}")
    rows.append(f"  {comp['repeats']} repeat(s), interleaved; ratio = median of per-repeat ratios")
    return rows


def _study(s: dict) -> list[str]:
    return [*_comparison_rows(s["comparison"]),
            f"  best: {s['best']} at {_ratio(s['best_ratio_to_ddp'])} DDP"]


def _headline(s: dict) -> list[str]:
    checkpoints = s.get("trainer_checkpoints")
    return [*_image_task(s)[:-1],
            *([f"  trainer checkpoints per run: written {checkpoints['written']} (final included), "
               f"deferred {checkpoints['deferred']}"] if checkpoints else []),
            f"  window: {s['window']}"]


def _stall(s: dict) -> list[str]:
    every = s.get("every")  # results from before each row said its own interval
    rows = [f"  {'layout':28} {'model':10} {'checkpoint MB':>14} {'step ms':>9} {'1st step +ms':>13} "
            f"{'every':>6} {'lost/ckpt ms':>13} {'95% interval':>13} {'null ms':>9} {'in steps':>9} "
            f"{'write ms':>9} {'waited ms/run':>14} {'deferred/run':>13} "
            f"{'busy core':>16}"]
    for z in map(StallRow.from_json, s["sizes"]):
        rows.append(f"  {z.layout:28} {z.model + ' w' + str(z.width):10} "
                    f"{z.checkpoint_bytes / 1e6:>14.1f} "
                    f"{z.baseline_step_s * 1e3:>9.1f} {_ms(z.first_step_excess_s):>13} "
                    f"{z.every or every or 0:>6} "
                    f"{z.lost_per_checkpoint_s * 1e3:>13.1f} {_ms_range(z.lost_interval_s):>13} "
                    f"{_ms(z.null_lost_per_checkpoint_s):>9} {z.lost_in_steps:>9.2f} "
                    f"{max(z.write_max_s or [0.0]) * 1e3:>9.0f} "
                    f"{_wait(z.writer_wait_s):>14} {_deferred(z.checkpoints_deferred):>13} "
                    f"{_busy_core(z):>16}  "
                    f"< 1 step: {z.verdict()}")
    return rows


def ms_interval(interval: tuple[float, float] | None) -> str:
    """' (low to high)' in milliseconds after a figure; '' where there is no interval."""
    return "" if interval is None else f" ({interval[0] * 1e3:.1f} to {interval[1] * 1e3:.1f})"


def _ms_range(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0] * 1e3:.1f}..{interval[1] * 1e3:.1f}"


def _ms(seconds: float | None) -> str:
    """Seconds in milliseconds; '-' where unmeasured."""
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _busy_core(z: StallRow) -> str:
    """A busy spare core's cost: the step's slowdown, and that over the writer's and the store's CPU
    time per checkpoint; '-' if unmeasured."""
    n = z.neighbour
    if n is None:
        return "-"
    return f"{(n.ratio - 1) * 100:+.1f}% {(n.cost_of_writer_cpu_s + n.cost_of_store_cpu_s) * 1e3:.2f}ms"


def _wait(values: tuple[float, ...] | None) -> str:
    """The median run's wait for the previous checkpoint's write, in ms; '-' for older results."""
    return "-" if not values else f"{statistics.median(values) * 1e3:.0f}"


def _deferred(values: tuple[int, ...] | None) -> str:
    """The median run's count of checkpoints deferred past their step; '-' for older results."""
    return "-" if values is None else f"{statistics.median(values):g}"


def _recovery(s: dict) -> list[str]:
    r = Recovery.from_json(s)
    resub = r.sigterm_to_resubmitted_s
    resub_text = f" (job resubmitted after {resub:.1f} s)" if resub is not None else ""
    return [f"  SIGTERM -> training resumed: {r.sigterm_to_resumed_s:.1f} s{resub_text}; "
            f"steps of work lost: {r.steps_lost} (interrupted at step {r.interrupted_at_step}, "
            f"resumed from {r.resumed_from_step}); network namespaces: {s['network_namespaces']}"]


def _plan(s: dict) -> list[str]:
    rows = [f"  {'stack':8} {'resources':>9} {'cold wall s':>12} {'cold cpu s':>11} {'warm s':>8}"]
    nan = float("nan")
    for stack, f in s["figures"].get("stacks", {}).items():
        rows.append(f"  {stack:8} {f.get('resources', '?'):>9} {f.get('cold_wall_median_s', nan):>12.2f} "
                    f"{f.get('cold_cpu_median_s', nan):>11.2f} {f.get('warm_median_s', nan):>8.2f}")
    return rows


def against(r: Ratio) -> str:
    """A ratio: the median, its interval and, with a target, whether the median meets it and whether
    the interval decides that."""
    text = f"{_ratio_target(r.median)} ({_interval(r.per_repeat)}"
    if r.target is None:
        return text + ")"
    return text + f"; target >= {r.target}: {r.verdict()})"


def _image_task(s: dict) -> list[str]:
    """The image section's ratios, and the headline's (the same contenders)."""
    p = s["peer"]
    return [*_comparison_rows(s["comparison"]),
            f"  trainer efficiency (trainer / bare Horovod): {against(Ratio.from_json(s['efficiency']))}",
            f"  trainer / DDP: {against(Ratio.from_json(p['trainer']))}",
            f"  bare Horovod / DDP: {against(Ratio.of(p['bare-hvd']['per_repeat']))}",  # no target
            *(f"  {name} / DDP pinned alike: {against(Ratio.from_json(v))}"
              for name, v in s.get("peer_pinned", {}).items()),
            f"  window: {s['window']}"]


def _input_pipeline(s: dict) -> list[str]:
    return [*_comparison_rows(s["comparison"]),
            f"  one loader worker / bare loop: {against(Ratio.from_json(s['ratio']))}"]


def _shard_read(s: dict) -> list[str]:
    return [*_comparison_rows(s["comparison"], unit="bytes/s"),
            f"  shard stream / bare boto3: {against(Ratio.from_json(s['ratio']))}"]


def _checkpoint_throughput(s: dict) -> list[str]:
    rows = [f"  {'state MB':>9} {'repeats':>8} {'':8} {'ours MB/s':>10} {'bare MB/s':>10}   "
            "ours / bare boto3"]
    for z in s["sizes"]:
        for direction in ("write", "restore"):
            f = Transfer.from_json(z[direction], z["bytes"])
            rows.append(f"  {z['bytes'] / 1e6:>9.0f} {z['repeats']:>8} {direction:8} {f.ours_mb_s:>10.1f} "
                        f"{f.bare_mb_s:>10.1f}   {against(f.ratio)}")
    rows.append("  ratio = the bare boto3 transfer's time / ours, per repeat, median")
    return rows


_RENDERERS = {"peer_study": _study, "headline": _headline, "checkpoint_stall": _stall,
              "recovery": _recovery, "plan_time": _plan, "shard_read": _shard_read,
              "input_pipeline": _input_pipeline, "image_task": _image_task,
              "checkpoint_throughput": _checkpoint_throughput}
