"""--precision fp16 under --elastic: the loss scaler's state is part of the elastic state, so after one
of 3 workers is killed and rejoins, every rank's parameters are equal (each rank unscales the averaged
gradients by its scale: a rejoined worker with a fresh scale would step differently). CPU autocast
in float16 stands in for the GPU's."""

from __future__ import annotations

import re
import signal
import stat
from collections import defaultdict

import pytest

from tests.train.proc import (
    REPO,
    VENV_BIN,
    finish,
    horovodrun_cmd,
    start,
    train_workers,
    wait_for,
    worker_env,
)
from tests.train.scaler_probe_task import PREFIX
from tests.train.test_distributed import _local_host_names, _shrank_and_regrew, _world_sizes
from train.cpu import fp16_autocast_works
from train.summary import parse_summary

pytestmark = pytest.mark.slow
LINE = re.compile(PREFIX + r" rank=(\d+) step=(\d+) sum=(\S+)")


def test_fp16_elastic_ranks_stay_equal_after_a_worker_is_killed_and_rejoins(tmp_path):
    if not fp16_autocast_works():
        pytest.skip("this torch's CPU autocast lacks float16")
    names = _local_host_names()
    if len(names) < 3:
        pytest.skip(f"needs 3 names for this machine to run 3 elastic 'hosts', found {names}")
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\n" + "".join(f"echo {n}:1\n" for n in names[:3]))
    discover.chmod(discover.stat().st_mode | stat.S_IEXEC)
    metrics = tmp_path / "m.jsonl"
    steps = 150
    task = f"{REPO / 'tests' / 'train' / 'scaler_probe_task.py'}:ScalerProbeTask"
    # as test_distributed's elastic test: 3 'hosts', one killed, it rejoins. The survivors, blocked in a
    # collective with the dead worker, notice after --gloo-timeout-seconds: 20 s leaves a rejoining
    # worker time to import and meet the rendezvous on a loaded host, where 90 s made the test wait.
    cmd = [str(VENV_BIN / "horovodrun"), "--gloo", "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(discover), "--blacklist-cooldown-range", "1", "2",
           "--gloo-timeout-seconds", "20",
           *horovodrun_cmd(3, "--elastic", "--task", task, "--precision", "fp16", "--steps", str(steps),
                           "--batch-size", "16", "--lr", "0.001", "--commit-every", "5", "--log-every", "1",
                           "--metrics-file", str(metrics), "--cpu-affinity", "off")[6:]]
    proc = start(cmd, env=worker_env({"RINGTRAIN_FAULT_STEP_SLEEP_S": "0.05"}))
    # past the scaler's back-off (about 12 steps from 65536 here) on 3 workers, then kill one
    wait_for(lambda: len(_world_sizes(metrics)) >= 25, 180, "25 steps on 3 workers", proc)
    workers = wait_for(lambda: len(train_workers(proc)) == 3 and train_workers(proc), 10, "3 workers")
    workers[2].send_signal(signal.SIGKILL)
    wait_for(lambda: _shrank_and_regrew(metrics), 240, "2 workers, then 3 again", proc)
    out = finish(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    s = parse_summary(out)
    assert s.steps == steps and s.world_size == 3 and s.elastic_resets >= 2, s
    sums = defaultdict(set)  # step -> the parameter sums printed before it
    ranks = defaultdict(set)
    for rank, step, value in LINE.findall(out):
        sums[int(step)].add(value)
        ranks[int(step)].add(int(rank))
    # the last 20 steps ran on 3 workers after the rejoin (each once: no reset after them)
    tail = range(steps - 20, steps + 1)
    assert all(ranks[step] == {0, 1, 2} for step in tail), {step: ranks[step] for step in tail}
    differing = [step for step in tail if len(sums[step]) != 1]
    assert not differing, f"replicas differ at steps {differing}"
