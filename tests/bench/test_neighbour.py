"""bench.neighbour: what a busy spare core costs a training step."""

import pytest

from bench.neighbour import block_ratios, main, neighbour_slowdown


def test_block_ratios_pair_each_loaded_block_with_its_idle_one():
    assert block_ratios([1.0, 2.0], [1.1, 2.4]) == pytest.approx([1.1, 1.2])
    with pytest.raises(ValueError, match="pairs of blocks"):
        block_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="pairs of blocks"):
        block_ratios([], [])


@pytest.mark.slow
def test_the_neighbour_runs_in_the_loaded_blocks_only():
    """The figure means something only if the neighbour really works while the loaded blocks run and
    is stopped during the idle ones: its own CPU time says so."""
    r = neighbour_slowdown(16, 100_000, pairs=3, block_s=0.05)
    assert r["pairs"] == 3 and len(r["per_pair"]) == 3 and r["steps_per_block"] >= 5
    assert r["neighbour_cpu_share"] > 0.2
    assert r["neighbour_cpu_share_stopped"] < 0.05
    assert r["ratio"] > 0 and r["idle_step_s"] > 0


def test_bad_arguments_are_refused():
    assert main(["busy", "lots"]) == 2
    with pytest.raises(ValueError, match="pairs=0"):
        neighbour_slowdown(16, 1000, pairs=0)
