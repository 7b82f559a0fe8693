"""The figures the sections compute (bench/sections.py, bench/checkpoint_throughput.py) and the
report reads (bench/report.py), as types. Each writes itself into the results file
with `to_json` and is read back with `from_json`, which also reads the results of earlier runs (what
a type computes, such as a ratio's median and verdict, is computed again, not trusted)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.stats import MedianInterval, median, median_interval


def verdict(met: bool, undecided: bool) -> str:
    """A figure against its target, as every table says it: 'met' or 'not met', with ' (undecided)'
    where the 95 % interval of the figure holds both sides of the target."""
    return ("met" if met else "not met") + (" (undecided)" if undecided else "")


@dataclass(frozen=True)
class Ratio:
    """Per-repeat ratios of one comparison: their median, its distribution-free 95 % interval (None
    with fewer than 6 repeats: bench.stats.median_interval) and, with a target, whether the median
    meets it and whether the interval decides that (lies wholly on one side of the target). A target
    is a floor (the ratio is met at or above it), or with `at_most` a ceiling (a cost such as CPU per
    image, met at or below it)."""

    per_repeat: tuple[float, ...]
    target: float | None = None
    at_most: bool = False

    def __post_init__(self) -> None:
        if not self.per_repeat:
            raise ValueError("a ratio needs at least one repeat")
        object.__setattr__(self, "per_repeat", tuple(float(x) for x in self.per_repeat))

    @classmethod
    def of(cls, per_repeat: Sequence[float], target: float | None = None, at_most: bool = False) -> Ratio:
        return cls(tuple(per_repeat), target, at_most)

    @property
    def median(self) -> float:
        return median(self.per_repeat)

    @property
    def interval(self) -> MedianInterval | None:
        return median_interval(self.per_repeat)

    @property
    def met(self) -> bool:
        if self.target is None:
            raise ValueError("a ratio without a target is neither met nor not")
        return self.median <= self.target if self.at_most else self.median >= self.target

    @property
    def decided(self) -> bool:
        """The interval lies on one side of the target; False without an interval or a target."""
        ci, t = self.interval, self.target
        if t is None or ci is None:
            return False
        return (ci.high <= t or ci.low > t) if self.at_most else (ci.low >= t or ci.high < t)

    @property
    def undecided(self) -> bool:
        """An interval that holds both sides of the target (with too few repeats for an interval, the
        median alone says met or not: the renderers say 'too few repeats' beside it)."""
        return self.target is not None and self.interval is not None and not self.decided

    def verdict(self) -> str:
        return verdict(self.met, self.undecided)

    def to_json(self) -> dict[str, Any]:
        ci = self.interval
        out: dict[str, Any] = {"per_repeat": list(self.per_repeat), "median": self.median,
                               "interval": None if ci is None else [ci.low, ci.high]}
        if self.target is not None:
            out.update(target=self.target, met=self.met, decided=self.decided)
            if self.at_most:
                out["at_most"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Ratio:
        return cls.of(d["per_repeat"], d.get("target"), d.get("at_most", False))


@dataclass(frozen=True)
class Transfer:
    """One direction (write or restore) of one checkpoint size against the bare boto3 transfer of the
    same bytes: the paired times and the ratio bare time / our time per repeat."""

    ours_s: tuple[float, ...]
    bare_s: tuple[float, ...]
    nbytes: int
    ratio: Ratio

    @property
    def ours_mb_s(self) -> float:
        return self.nbytes / median(self.ours_s) / 1e6

    @property
    def bare_mb_s(self) -> float:
        return self.nbytes / median(self.bare_s) / 1e6

    def to_json(self) -> dict[str, Any]:
        return {**self.ratio.to_json(), "ours_s": list(self.ours_s), "bare_s": list(self.bare_s),
                "ours_mb_s": self.ours_mb_s, "bare_mb_s": self.bare_mb_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], nbytes: int) -> Transfer:
        return cls(tuple(d["ours_s"]), tuple(d["bare_s"]), nbytes, Ratio.from_json(d))


@dataclass(frozen=True)
class BusyCore:
    """What a checkpoint's CPU work on the spare core costs the step (bench/neighbour.py): the step's
    median slowdown with the neighbour running, and that times the writer's and the store's CPU time
    per checkpoint; `record` is bench.neighbour's whole record, kept as written."""

    ratio: float
    interval: tuple[float, float] | None
    cost_of_writer_cpu_s: float
    cost_of_store_cpu_s: float
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.record, "ratio": self.ratio, "interval": _jsonable(self.interval),
                "cost_of_writer_cpu_s": self.cost_of_writer_cpu_s,
                "cost_of_store_cpu_s": self.cost_of_store_cpu_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BusyCore:
        return cls(d["ratio"], _tuples(d.get("interval")), d["cost_of_writer_cpu_s"],
                   d["cost_of_store_cpu_s"], dict(d))


@dataclass(frozen=True)
class StallRow:
    """One layout and model size of the checkpoint-stall section (bench/sections.py stall_section;
    the method is its STALL_METHOD). Times in seconds. Fields after `write_within_after` are absent
    from some older results or hand-made ones: None or empty there."""

    layout: str
    workers: int
    checkpoint_bytes: int
    baseline_step_s: float            # one step: the run without checkpoints' window / steps
    lost_per_checkpoint_s: float      # median over the checkpoints measured
    lost_in_steps: float
    below_one_step: bool
    write_within_after: bool          # False: the write outlasts 4/5 of the interval, no verdict
    verdict_decided: bool | None = None  # the interval lies on one side of one step
    lost_interval_s: tuple[float, float] | None = None
    model: str = "mlp"
    width: int | None = None
    every: int | None = None
    steps: int | None = None
    warmup: int | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    checkpoints_in_window: int | None = None
    checkpoints_measured: int | None = None
    profiled_after_steps: tuple[int, ...] = ()
    first_step_excess_s: float | None = None
    excess_by_position_s: tuple[float, ...] = ()
    after_steps: int | None = None
    lost_per_checkpoint_samples_s: tuple[float, ...] = ()
    null_lost_per_checkpoint_s: float | None = None   # the same estimate where nothing was written
    null_lost_interval_s: tuple[float, float] | None = None
    write_max_s: tuple[float, ...] = ()                # per run: the longest write
    writer_wait_s: tuple[float, ...] | None = None     # per run: training waiting for the previous write
    checkpoints_deferred: tuple[int, ...] | None = None  # per run: taken late, the previous write going on
    writer_cpu_per_checkpoint_s: float | None = None
    store_cpu_per_checkpoint_s: float | None = None
    store_cpu_without_checkpoints_s: tuple[float, ...] = ()
    neighbour: BusyCore | None = None
    ab_lost_per_checkpoint_s: float | None = None      # cross-check: windows with - without, per checkpoint
    ab_lost_per_repeat_s: tuple[float, ...] = ()
    window_s: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    step_durations_s: Sequence[Any] = ()                # raw samples (bench.results.RAW_KEYS)

    def verdict(self) -> str:
        """Against the target of less than one step, as a ratio's verdict reads (undecided where the
        interval holds both sides of one step); no verdict where the write outlasted what the method
        can measure."""
        if not self.write_within_after:
            return "no verdict: the write outlasts 4/5 of the interval"
        undecided = self.lost_interval_s is not None and self.verdict_decided is False
        return verdict(self.below_one_step, undecided)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["neighbour"] = None if self.neighbour is None else self.neighbour.to_json()
        return _jsonable(out)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StallRow:
        names = {f.name for f in dataclasses.fields(cls)} - {"neighbour"}
        kwargs = {k: _tuples(v) for k, v in d.items() if k in names}
        n = d.get("neighbour")
        return cls(**kwargs, neighbour=BusyCore.from_json(n) if n else None)


def _tuples(value: Any) -> Any:
    """JSON lists of numbers back as tuples (the types' sequences are immutable)."""
    if isinstance(value, list) and all(not isinstance(v, list | dict) for v in value):
        return tuple(value)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Recovery:
    """The recovery section's figures (bench/sections.py recovery_figures), in seconds and steps."""

    sigterm_to_resumed_s: float
    steps_lost: int
    sigterm_to_resubmitted_s: float | None = None   # of which: the stop, and the flow resubmitting
    first_resumed_step: int | None = None
    interrupted_at_step: int | None = None
    resumed_from_step: int | None = None
    checkpoints_written_before_stop: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Recovery:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
