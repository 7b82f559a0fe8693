"""bench/reading.md, the hand-written reading of the figures, with every figure filled in from the
results file: the words are typed, the figures are not, so none goes stale when the bench runs again.

A placeholder is `{path|format}`: `path` walks the results' sections, keys and list indices joined by
'/' (keys such as 'hvd-threads1-pin-cycle0.5' hold dots); `format` says how the value reads:

    {headline/efficiency}                          a ratio: 0.971× (interval 0.926–1.073)
    {headline/efficiency|verdict}                  its verdict: met, not met, either (undecided)
    {checkpoint_stall/sizes/3|verdict}             a stall row's verdict
    {peer_study/comparison/ratios/ddp-pin/median|x2}   a number as a ratio: 0.97×
    {recovery/sigterm_to_resumed_s|s}              seconds: 10.6 s; |ms: milliseconds: 1.6 ms
    {checkpoint_stall/sizes/0/checkpoint_bytes|mb} bytes in MB: 0.7 MB
    {headline/trainer_checkpoints/written|range}   a list's lowest to highest: 3 to 5
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from bench.figures import Ratio, StallRow

PLACEHOLDER = re.compile(r"\{([a-z_]+(?:/[A-Za-z0-9_.-]+)*)(?:\|([a-z0-9]+))?\}")


def _ratio(value: dict) -> str:
    r = Ratio.from_json(value)
    ci = r.interval
    return f"{r.median:.3f}×" + ("" if ci is None else f" (interval {ci.low:.3f}–{ci.high:.3f})")


def _verdict(value: dict) -> str:
    return StallRow.from_json(value).verdict() if "layout" in value else Ratio.from_json(value).verdict()


def _range(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{low:g} to {high:g}"


def _ms_interval(interval: list[float]) -> str:
    return f"{interval[0] * 1e3:.1f} to {interval[1] * 1e3:.1f} ms"


FORMATS: dict[str, Callable[[Any], str]] = {
    "ratio": _ratio,
    "verdict": _verdict,
    "x": lambda v: f"{v:.3f}×",
    "x2": lambda v: f"{v:.2f}×",
    "s": lambda v: f"{v:.1f} s",
    "ms": lambda v: f"{v * 1e3:.1f} ms",
    "msinterval": _ms_interval,
    "maxs": lambda v: f"{max(v):.1f} s",
    "mb": lambda v: f"{v / 1e6:.1f} MB",
    "range": _range,
    "int": lambda v: f"{int(v)}",
    "g": lambda v: f"{v:g}",
}


def _default_format(value: Any) -> str:
    if isinstance(value, dict) and "per_repeat" in value:
        return "ratio"
    if isinstance(value, int) and not isinstance(value, bool):
        return "int"
    raise ValueError(f"{type(value).__name__} {value!r} needs a format (|{'|'.join(FORMATS)})")


def lookup(sections: dict, path: str) -> Any:
    node: Any = sections
    for key in path.split("/"):
        try:
            node = node[int(key)] if isinstance(node, list) else node[key]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{path}: no {key!r} in the results") from None
    return node


def fill(template: str, results: dict) -> str:
    """`template` with every placeholder replaced by its figure from `results`; ValueError naming the
    placeholder that the results cannot fill (a section that did not run, a key that moved). A section
    whose file is missing (status "missing": bench.report.SIDE_FILES) is the exception: its figures
    read '–', and each paragraph that holds one ends by saying which file is missing and what writes it."""
    sections = results["sections"]
    missing = {name: sec["reason"] for name, sec in sections.items() if sec.get("status") == "missing"}

    def paragraph(text: str) -> str:
        absent: list[str] = []

        def figure(m: re.Match) -> str:
            path, fmt = m.group(1), m.group(2)
            section = path.split("/")[0]
            if section in missing:
                absent.extend([missing[section]] if missing[section] not in absent else [])
                return "–"
            try:
                value = lookup(sections, path)
                fmt = fmt or _default_format(value)
                if fmt not in FORMATS:
                    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
                return FORMATS[fmt](value)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"reading.md: {{{m.group(0)[1:-1]}}}: {e}") from None

        filled = PLACEHOLDER.sub(figure, text)
        if not absent:
            return filled
        return filled.rstrip("\n") + f" (Not measured, shown as –: {'; '.join(absent)}.)" + \
            text[len(text.rstrip("\n")):]

    return "\n\n".join(paragraph(text) for text in template.split("\n\n"))


# What a typed figure looks like: a number with a unit of time, size, rate or ratio. The reading's
# numbers come from the results (placeholders); these stay: the 95 % of the intervals and the 4/5 of
# the interval that bounds a write, the method's constants.
TYPED_FIGURE = re.compile(r"\d(?:[\d.,]*\d)?\s?(?:×|x\b|ms\b|s\b|MB\b|GB\b|MB/s|%|minutes?\b)")
METHOD_CONSTANTS = ("95 %",)


def typed_figures(template: str) -> list[str]:
    """Figures typed into `template` rather than filled in (a test keeps this empty)."""
    text = PLACEHOLDER.sub("", template)
    for constant in METHOD_CONSTANTS:
        text = text.replace(constant, "")
    return TYPED_FIGURE.findall(text)
