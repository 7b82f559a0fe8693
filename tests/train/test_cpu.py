"""Where CPU workers run: the core shares (pure) and the pinning of every thread of a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.train.proc import REPO
from train.contract import cpu_share


def test_each_part_gets_a_contiguous_share_of_the_cores():
    assert cpu_share([0, 1], 0, 2) == (0,)
    assert cpu_share([1, 0], 1, 2) == (1,)                       # in core order, whatever the input order
    assert cpu_share(range(16), 3, 4) == (12, 13, 14, 15)
    assert cpu_share([2, 3, 5, 7, 11], 1, 2) == (5, 7)          # 5 cores, 2 parts: the fifth stays unused
    assert cpu_share([4, 5, 6, 7], 0, 1) == (4, 5, 6, 7)
    assert cpu_share([0, 1], 0, 3) is None                       # fewer cores than parts: nobody pinned
    with pytest.raises(ValueError, match="part 2 of 2"):
        cpu_share([0, 1], 2, 2)


_PIN_PROBE = textwrap.dedent("""
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    from train.cpu import pin_worker

    started = threading.Event(); done = threading.Event()
    def worker():  # a thread that exists before pinning, like Horovod's background thread
        started.set(); done.wait(30)
    t = threading.Thread(target=worker); t.start(); started.wait(30)
    share = pin_worker(int(sys.argv[2]), int(sys.argv[3]))
    late = []
    t2 = threading.Thread(target=lambda: late.append(sorted(os.sched_getaffinity(0)))); t2.start(); t2.join()
    threads = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
    done.set(); t.join()
    print(json.dumps({"share": share, "threads": threads, "late": late[0]}))
""")


def _probe(local_rank: int, local_size: int, cpus: set[int]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PIN_PROBE, str(REPO), str(local_rank), str(local_size)],
                         capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs at least 2 usable cores")
def test_pin_worker_moves_every_existing_thread_and_later_threads_inherit():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    for rank in (0, 1):
        got = _probe(rank, 2, set(cpus))
        assert got["share"] == [cpus[rank]]
        assert len(got["threads"]) >= 2  # the main thread and the one started before pinning
        assert all(aff == [cpus[rank]] for aff in got["threads"].values()), got["threads"]
        assert got["late"] == [cpus[rank]]


def test_pin_worker_leaves_placement_alone_with_fewer_cores_than_workers():
    cpu = sorted(os.sched_getaffinity(0))[0]
    got = _probe(0, 2, {cpu})
    assert got["share"] is None
    assert all(aff == [cpu] for aff in got["threads"].values())


_IDLE_PROBE = textwrap.dedent("""
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    from train.cpu import idle_while_finishing

    started = threading.Event(); done = threading.Event()
    def worker():  # a thread that exists before, like Horovod's background thread
        started.set(); done.wait(30)
    t = threading.Thread(target=worker); t.start(); started.wait(30)
    moved = idle_while_finishing()
    late = []
    t2 = threading.Thread(target=lambda: late.append(os.sched_getscheduler(0))); t2.start(); t2.join()
    policies = {tid: os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}
    done.set(); t.join()
    print(json.dumps({"moved": moved, "policies": policies, "late": late[0]}))
""")


def test_idle_while_finishing_moves_every_existing_thread_to_sched_idle_and_later_threads_inherit():
    out = subprocess.run([sys.executable, "-c", _IDLE_PROBE, str(REPO)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["moved"] is True
    assert len(got["policies"]) >= 2  # the main thread and the one started before
    assert set(got["policies"].values()) == {os.SCHED_IDLE}, got
    assert got["late"] == os.SCHED_IDLE
