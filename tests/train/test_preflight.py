"""The preflight's arithmetic (train/preflight.py); the measurement runs in the local flow tests."""

import pytest

from train.preflight import PreflightResult, bus_bandwidth, pair_bandwidth, slow_hosts


def test_busbw_is_nccl_tests_definition():
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for allreduce
    assert bus_bandwidth(8e9, 1.0, 2) == pytest.approx(8e9)
    assert bus_bandwidth(8e9, 1.0, 8) == pytest.approx(8e9 * 14 / 8)
    assert bus_bandwidth(8e9, 2.0, 16) == pytest.approx(4e9 * 30 / 16)
    assert pair_bandwidth(1e6, 0.5) == pytest.approx(2e6)


def test_the_slow_host_is_the_one_every_pair_of_which_is_slow():
    pairs = {("a", "b"): 1.0, ("a", "c"): 10.0, ("b", "c"): 1.0, ("b", "d"): 1.0, ("c", "d"): 10.0,
             ("a", "d"): 10.0}
    assert slow_hosts(pairs, floor=5.0) == ["b"]
    # two hosts: both ends of their one link
    assert slow_hosts({("host-0", "host-1"): 1.0}, floor=5.0) == ["host-0", "host-1"]
    assert slow_hosts({("host-0", "host-1"): 9.0}, floor=5.0) == []


def test_the_result_names_the_slow_hosts_and_records_gbps():
    r = PreflightResult(ranks=2, nbytes=2**20, busbw=1.2e6, floor=20e6,
                        pairs={("host-0", "host-1"): 1.2e6}, slow=["host-0", "host-1"])
    assert not r.passed
    assert "BELOW THE FLOOR; slow: host-0 and host-1" in r.describe()
    assert r.record()["floor_gbps"] == 0.02 and r.record()["passed"] is False
    assert PreflightResult(ranks=2, nbytes=1, busbw=1.0, floor=None).passed
