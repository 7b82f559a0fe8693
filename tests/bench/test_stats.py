"""The maths of the benchmarks: run order, medians, paired ratios."""

import math
from collections import Counter

import pytest

from bench.stats import interleaved_order, median, median_interval, paired_ratios, ratio_summary, throughput


def test_every_repeat_runs_every_contender_once():
    order = interleaved_order(["a", "b", "c"], 4)
    assert len(order) == 12
    for rep in range(4):
        assert sorted(name for r, name in order if r == rep) == ["a", "b", "c"]


def test_order_rotates_so_no_contender_always_goes_first():
    order = [name for _, name in interleaved_order(["a", "b", "c"], 3)]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # Over a full cycle each contender sits in each slot exactly once.
    slots = Counter((i % 3, name) for i, name in enumerate(order))
    assert set(slots.values()) == {1} and len(slots) == 9


def test_two_contenders_alternate_abba():
    assert [n for _, n in interleaved_order(["x", "y"], 4)] == ["x", "y", "y", "x", "x", "y", "y", "x"]


@pytest.mark.parametrize("names,repeats,match", [
    (["a"], 0, "repeats"), ([], 2, "no contenders"), (["a", "a"], 1, "unique"),
])
def test_order_rejects_bad_input(names, repeats, match):
    with pytest.raises(ValueError, match=match):
        interleaved_order(names, repeats)


def test_median_odd_even_and_empty():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_paired_ratios_are_per_repeat():
    assert paired_ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]
    with pytest.raises(ValueError, match="unpaired"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratios([1.0], [0.0])


def test_ratio_summary_takes_median_of_paired_ratios_not_ratio_of_medians():
    # Repeat-wise the contender is always 10% faster, though the machine's speed swings.
    samples = {"base": [100.0, 50.0, 200.0], "fast": [110.0, 55.0, 220.0]}
    summary = ratio_summary(samples, "base")
    assert set(summary) == {"fast"}
    assert summary["fast"]["per_repeat"] == pytest.approx([1.1, 1.1, 1.1])
    assert summary["fast"]["median"] == pytest.approx(1.1)
    # One repeat disturbed either way (a neighbour's burst during one run) does not move the median.
    drift = {"base": [100.0, 10.0, 10.0], "fast": [10.5, 105.0, 10.5]}
    assert ratio_summary(drift, "base")["fast"]["median"] == pytest.approx(1.05)


def test_ratio_summary_needs_its_baseline():
    with pytest.raises(ValueError, match="baseline"):
        ratio_summary({"a": [1.0]}, "b")


def test_throughput():
    assert throughput(640, 2.0) == 320.0
    with pytest.raises(ValueError):
        throughput(1, 0.0)


@pytest.mark.parametrize("n, low_rank, coverage", [
    (6, 1, 0.96875), (8, 1, 0.9921875), (9, 2, 0.9609375), (11, 2, 0.98828125), (20, 6, 0.9586105),
])
def test_median_interval_is_the_order_statistics_of_the_binomial_table(n, low_rank, coverage):
    values = [float(x) for x in range(n, 0, -1)]  # unsorted on purpose
    ci = median_interval(values)
    assert (ci.low, ci.high) == (low_rank, n + 1 - low_rank)
    assert ci.confidence == pytest.approx(coverage, abs=1e-6)
    # The next narrower interval would cover less than 95 %.
    narrower = 1 - 2 * sum(math.comb(n, i) for i in range(low_rank + 1)) / 2**n
    assert narrower < 0.95 <= ci.confidence


def test_median_interval_needs_six_values_at_95_and_a_sane_confidence():
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([1.0] * 5, confidence=0.9) is not None  # 1 - 2/32 = 0.9375
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            median_interval([1.0] * 9, confidence=bad)
