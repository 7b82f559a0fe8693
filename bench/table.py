"""The human table printed at the end of a run (pure: results dict in, text out)."""

from __future__ import annotations

import statistics

from bench.stats import median_interval


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


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
    e, p = s["efficiency"], s["peer"]
    return [
        *_comparison_rows(s["comparison"]),
        f"  trainer efficiency (trainer / bare Horovod): {_ratio_target(e['trainer_vs_bare_hvd'])} "
        f"({_interval(e['per_repeat'])}; target >= {e['target']}: {_met(e['met'])})",
        *(f"  {name} / DDP: {_ratio_target(v['median'])} ({_interval(v['per_repeat'])}; "
          f"target >= {v['target']}: {_met(v['met'])})" for name, v in p.items()),
        *(f"  {name} / DDP pinned alike: {_ratio(v['median'])}"
          for name, v in s.get("peer_pinned", {}).items()),
        *([f"  trainer checkpoints per run: written {s['trainer_checkpoints']['written']} (final included), "
           f"deferred {s['trainer_checkpoints']['deferred']}"] if "trainer_checkpoints" in s else []),
        f"  window: {s['window']}",
    ]


def _stall(s: dict) -> list[str]:
    rows = [f"  {'layout':28} {'model':10} {'checkpoint MB':>14} {'step ms':>9} {'1st step +ms':>13} "
            f"{'every':>6} {'lost/ckpt ms':>13} {'95% interval':>13} {'null ms':>9} {'in steps':>9} "
            f"{'write ms':>9} {'waited ms/run':>14} {'deferred/run':>13} "
            f"{'busy core':>16}"]
    for z in s["sizes"]:
        rows.append(f"  {z.get('layout', ''):28} {z['model'] + ' w' + str(z['width']):10} "
                    f"{z['checkpoint_bytes'] / 1e6:>14.1f} "
                    f"{z['baseline_step_s'] * 1e3:>9.1f} {z['first_step_excess_s'] * 1e3:>13.1f} "
                    f"{z.get('every', s.get('every', 0)):>6} "
                    f"{z['lost_per_checkpoint_s'] * 1e3:>13.1f} {_ms_range(z.get('lost_interval_s')):>13} "
                    f"{_ms_null(z):>9} {z['lost_in_steps']:>9.2f} "
                    f"{max(z.get('write_max_s') or [0.0]) * 1e3:>9.0f} "
                    f"{_wait(z.get('writer_wait_s')):>14} {_deferred(z.get('checkpoints_deferred')):>13} "
                    f"{_busy_core(z.get('neighbour')):>16}  "
                    f"{stall_verdict(z)}")
    return rows


def ms_interval(interval: list[float] | None) -> str:
    """' (low to high)' in milliseconds after a figure; '' where there is no interval."""
    return "" if interval is None else f" ({interval[0] * 1e3:.1f} to {interval[1] * 1e3:.1f})"


def _ms_range(interval: list[float] | None) -> str:
    return "-" if interval is None else f"{interval[0] * 1e3:.1f}..{interval[1] * 1e3:.1f}"


def _ms_null(z: dict) -> str:
    """The null control (the estimate over the runs without checkpoints); '-' where unmeasured."""
    null = z.get("null_lost_per_checkpoint_s")
    return "-" if null is None else f"{null * 1e3:.1f}"


def stall_verdict(z: dict) -> str:
    """One stall row against its target (below one step): the median's side, and whether its 95 %
    interval decides it (results from before the interval say only the side)."""
    if not z.get("write_within_after", True):
        return "write outlasts 4/5 of the interval: no verdict"
    side = "< 1 step" if z["below_one_step"] else ">= 1 step"
    if "verdict_decided" in z and not z["verdict_decided"]:
        return f"{side}, its interval holds both sides: undecided"
    return side


def _busy_core(n: dict | None) -> str:
    """A busy spare core's cost: the step's slowdown, and that over the writer's and the store's CPU
    time per checkpoint; '-' if unmeasured."""
    if not n:
        return "-"
    cost = n["cost_of_writer_cpu_s"] + n["cost_of_store_cpu_s"]
    return f"{(n['ratio'] - 1) * 100:+.1f}% {cost * 1e3:.2f}ms"


def _wait(values: list[float] | None) -> str:
    """The median run's wait for the previous checkpoint's write, in ms; '-' for older results."""
    return "-" if not values else f"{statistics.median(values) * 1e3:.0f}"


def _deferred(values: list[int] | None) -> str:
    """The median run's count of checkpoints deferred past their step; '-' for older results."""
    return "-" if values is None else f"{statistics.median(values):g}"


def _recovery(s: dict) -> list[str]:
    resub = s.get("sigterm_to_resubmitted_s")
    resub_text = f" (job resubmitted after {resub:.1f} s)" if resub is not None else ""
    return [f"  SIGTERM -> training resumed: {s['sigterm_to_resumed_s']:.1f} s{resub_text}; "
            f"steps of work lost: {s['steps_lost']} (interrupted at step {s['interrupted_at_step']}, "
            f"resumed from {s['resumed_from_step']}); network namespaces: {s['network_namespaces']}"]


def _plan(s: dict) -> list[str]:
    rows = [f"  {'stack':8} {'resources':>9} {'cold wall s':>12} {'cold cpu s':>11} {'warm s':>8}"]
    nan = float("nan")
    for stack, f in s["figures"].get("stacks", {}).items():
        rows.append(f"  {stack:8} {f.get('resources', '?'):>9} {f.get('cold_wall_median_s', nan):>12.2f} "
                    f"{f.get('cold_cpu_median_s', nan):>11.2f} {f.get('warm_median_s', nan):>8.2f}")
    return rows


def against(r: dict) -> str:
    """A ratio summarised by sections.against_target: the median, its interval and, with a target,
    whether the median meets it and whether the interval decides that."""
    text = f"{_ratio_target(r['median'])} ({_interval(r['per_repeat'])}"
    if "target" not in r:
        return text + ")"
    undecided = ", its interval holds both sides" if r["interval"] is not None and not r["decided"] else ""
    return text + f"; target >= {r['target']}: {_met(r['met'])}{undecided})"


def _image_task(s: dict) -> list[str]:
    e, p = s["efficiency"], s["peer"]
    return [*_comparison_rows(s["comparison"]),
            f"  trainer efficiency (trainer / bare Horovod): {against(e)}",
            f"  trainer / DDP: {against(p['trainer'])}",
            f"  bare Horovod / DDP: {against(p['bare-hvd'])}",
            *(f"  {name} / DDP pinned alike: {against(v)}" for name, v in s.get("peer_pinned", {}).items()),
            f"  window: {s['window']}"]


def _input_pipeline(s: dict) -> list[str]:
    return [*_comparison_rows(s["comparison"]), f"  one loader worker / bare loop: {against(s['ratio'])}"]


def _shard_read(s: dict) -> list[str]:
    return [*_comparison_rows(s["comparison"], unit="bytes/s"),
            f"  shard stream / bare boto3: {against(s['ratio'])}"]


def _checkpoint_throughput(s: dict) -> list[str]:
    rows = [f"  {'state MB':>9} {'repeats':>8} {'':8} {'ours MB/s':>10} {'bare MB/s':>10}   "
            "ours / bare boto3"]
    for z in s["sizes"]:
        for direction in ("write", "restore"):
            f = z[direction]
            rows.append(f"  {z['bytes'] / 1e6:>9.0f} {z['repeats']:>8} {direction:8} {f['ours_mb_s']:>10.1f} "
                        f"{f['bare_mb_s']:>10.1f}   {against(f)}")
    rows.append("  ratio = the bare boto3 transfer's time / ours, per repeat, median")
    return rows


_RENDERERS = {"peer_study": _study, "headline": _headline, "checkpoint_stall": _stall,
              "recovery": _recovery, "plan_time": _plan, "shard_read": _shard_read,
              "input_pipeline": _input_pipeline, "image_task": _image_task,
              "checkpoint_throughput": _checkpoint_throughput}
