"""The whole main job on the local backend, shortened: train, reclaim a host, resume, tear down.

Runs the real trainer (`python -m train`) under `horovodrun` on two local hosts and asserts on its
summary and on nothing being left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cluster.flow import DatasetSpec, FlowOptions, run_job
from cluster.job import JobSpec, trainer_config
from cluster.local import network
from cluster.local.backend import LocalBackend
from cluster.local.leftovers import leftovers
from train.contract import EXIT_INTERRUPTED_RESUMABLE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")  # the console script


class RecordingBackend(LocalBackend):
    """The local backend, remembering what it created so the test can check it is all gone, and what it
    ran for each submission."""

    seen: dict
    handles: list

    def submit(self, job):
        handle = super().submit(job)
        self.handles = [*getattr(self, "handles", []), handle]
        return handle

    def up(self) -> None:
        super().up()
        plan = self.hosts.plan
        self.seen = {
            "subnet_index": plan.subnet_index, "isolated": plan.isolated, "workdir": self.workdir,
            "iface": plan.pod_iface, "launcher_netns": plan.launcher.netns if plan.launcher else None,
            "listen": [(h.address, self.hosts.keys.port) for h in plan.hosts]
                      + [(self.store.host, self.store.port)],
        }


# The trainer's test hook: seconds to sleep after every step. One-thread-per-core workers finish these
# short jobs in well under a second, before the injected reclaim could land; this keeps each step
# slow enough that the reclaim arrives mid-training, which is what these tests are about.
STEP_PACING = {"RINGTRAIN_FAULT_STEP_SLEEP_S": "0.1"}


def assert_ran_the_mpijobs_launcher(backend: RecordingBackend, elastic: bool) -> None:
    """Every submission ran the rendered MPIJob's launcher container verbatim: the image's ENTRYPOINT and
    the container's args (static: the operator's hostfile; elastic: its discovery script), on the
    launcher host (its own namespace, named as the operator names the launcher pod). An elastic job's
    first submission is its preflight, a static job (cluster/preflight_gate.py)."""
    from cluster.local.executor import IMAGE_ENTRYPOINT
    from cluster.mpijob import launcher_container

    assert backend.handles
    for i, handle in enumerate(backend.handles):
        mpijob = handle.details["mpijob"]
        args = launcher_container(mpijob)["args"]
        assert ("--preflight-only" in args) is (elastic and i == 0)
        run = elastic and i > 0
        assert handle.details["command"] == [*IMAGE_ENTRYPOINT, *args]
        assert args[:2] == ["launcher", "--"] and args[2] == "horovodrun"
        assert ("--host-discovery-script" in args) is run and ("--hostfile" in args) is not run
        assert "/etc/mpi/discover_hosts.sh" in args if run else "/etc/mpi/hostfile" in args
        assert args[args.index("--network-interfaces") + 1] == backend.seen["iface"]
        if backend.seen["isolated"]:
            process = handle.details["process"]
            assert process[:4] == ["ip", "netns", "exec", backend.seen["launcher_netns"]]
            assert f"{mpijob['metadata']['name']}-launcher" in process
            assert process[-len(handle.details["command"]):] == handle.details["command"]


def _cluster(seen: dict) -> dict:
    return {k: seen[k] for k in ("subnet_index", "isolated", "workdir", "listen")}


def _trainer_available():
    import importlib.util

    if importlib.util.find_spec("horovod.torch") is None:
        pytest.skip("needs Horovod: run scripts/setup")


@pytest.mark.parametrize("isolated", [None], ids=["auto"])
def test_main_job_trains_is_reclaimed_resumes_and_leaves_nothing(isolated):
    _trainer_available()
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    backend = RecordingBackend(2, isolated=isolated, reclaim_grace_s=10, log=print)
    job = JobSpec(name="flowtest", num_hosts=2, env=STEP_PACING,
                  trainer=trainer_config(("--steps", "40", "--checkpoint-every", "10", "--batch-size", "32",
                                          "--log-every", "5")))
    opts = FlowOptions(dataset=DatasetSpec(shards=2, samples_per_shard=256), reclaim_at_step=15,
                       progress_bar=False, job_timeout_s=400)
    result = run_job(backend, job, opts)

    first, second = result.attempts[0], result.attempts[-1]
    # It trained to the end ...
    assert result.succeeded and result.exit_code == 0, result.message
    assert result.summary.steps == 40 and result.summary.world_size == 2
    # ... was interrupted by the reclaim after a checkpoint ...
    assert result.reclaimed == ["host-1"]
    assert first.exit_code == EXIT_INTERRUPTED_RESUMABLE and first.summary.interrupted is True
    assert 15 <= first.summary.steps < 40 and first.summary.checkpoints_written >= 1
    # ... and resumed from that checkpoint on the restored host, not from scratch.
    assert len(result.attempts) == 2 and result.resumed
    assert second.summary.resumed_from_step == first.summary.steps
    assert second.hosts == ["host-0", "host-1"]
    # The loss went down over the whole run.
    assert second.summary.final_loss < first.summary.initial_loss
    assert result.metrics and result.metrics[-1]["step"] == 40

    assert_ran_the_mpijobs_launcher(backend, elastic=False)
    assert leftovers(**_cluster(backend.seen)) == []
    new_children = [p for p in psutil.Process().children(recursive=True) if p.pid not in children_before]
    assert new_children == []


def test_elastic_job_continues_on_the_survivor_without_a_resubmit():
    _trainer_available()
    # With an interruption notice the host leaves discovery before its worker is signalled, so
    # Horovod's elastic driver shrinks the ring around it instead of the job stopping.
    backend = RecordingBackend(2, reclaim_grace_s=10, reclaim_notice_s=3, log=print)
    job = JobSpec(name="elastictest", num_hosts=2, elastic=True, min_hosts=1, env=STEP_PACING,
                  trainer=trainer_config(("--steps", "60", "--checkpoint-every", "20", "--batch-size", "32",
                                          "--log-every", "2")))
    opts = FlowOptions(dataset=DatasetSpec(shards=2, samples_per_shard=256), reclaim_at_step=10,
                       restore_after_s=5, progress_bar=False, job_timeout_s=400)
    result = run_job(backend, job, opts)

    assert result.succeeded and result.exit_code == 0, result.message
    assert len(result.attempts) == 1 and result.reclaimed == ["host-1"]
    assert result.summary.steps == 60 and result.summary.interrupted is False
    assert result.summary.elastic_resets >= 1
    # Training went on with one worker after the reclaim (the discovery script dropped host-1).
    assert any(m.get("world_size") == 1 for m in result.metrics), result.metrics
    assert result.summary.final_loss < result.summary.initial_loss
    assert_ran_the_mpijobs_launcher(backend, elastic=True)
    assert leftovers(**_cluster(backend.seen)) == []


def test_a_users_task_file_outside_the_repository_trains_through_ringtrain_run_and_resumes(tmp_path):
    """`scripts/run --task path.py:Class` minus setup: the user's file, outside the repository, on 2 local
    hosts, reclaimed mid-run and resumed, from a directory that is not the repository."""
    _trainer_available()
    task = tmp_path / "elsewhere" / "my_task.py"
    task.parent.mkdir()
    shutil.copy(REPO / "tests" / "train" / "user_task.py", task)
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [RINGTRAIN, "run", "--task", f"{task}:ParityTask", "--job-name", "usertask", "--steps", "30",
         "--checkpoint-every", "10", "--reclaim-at-step", "12", "--no-progress", "--run-dir", str(run_dir),
         "--", "--data", "synthetic", "--hidden", "32", "--lr", "0.05", "--log-every", "2"],
        cwd=task.parent, env={**os.environ, **STEP_PACING}, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = (run_dir / "summary.txt").read_text()
    interrupted = re.search(r"attempt 1: from scratch, reached step (\d+), interrupted", summary)
    assert interrupted and 12 <= int(interrupted.group(1)) < 30, summary
    assert f"attempt 2: resumed from step {interrupted.group(1)}, reached step 30, exit 0" in summary, summary
    assert "reclaimed          host-1" in summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in records if "loss" in m]
    assert sum(losses[-3:]) < sum(losses[:3]), losses  # the hidden layer trained: the loss fell
    # the task's evaluation ran over both workers' shares (2 batches of 32 each), summed over both
    assert [m["eval_samples"] for m in records if "eval_samples" in m] == [128]


def test_the_lm_example_trains_a_bpe_gpt_on_parquet_sourced_token_shards_and_resumes(tmp_path):
    """`scripts/run --task lm` minus setup, shortened: the stdlib source as Parquet, a BPE trained on it,
    token shards in the local store, a 2-layer GPT on 2 hosts, reclaimed mid-run and resumed; the loss
    falls and the held-out perplexity is reported."""
    _trainer_available()
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [RINGTRAIN, "run", "--task", "lm", "--job-name", "lm-e2e", "--steps", "30", "--batch-size", "8",
         "--checkpoint-every", "10", "--reclaim-at-step", "12", "--no-progress", "--run-dir", str(run_dir),
         "--", "--log-every", "5"],
        cwd=REPO, env={**os.environ, **STEP_PACING}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = (run_dir / "summary.txt").read_text()
    interrupted = re.search(r"attempt 1: from scratch, reached step (\d+), interrupted", summary)
    assert interrupted and 12 <= int(interrupted.group(1)) < 30, summary
    assert f"attempt 2: resumed from step {interrupted.group(1)}, reached step 30, exit 0" in summary, summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in records if "loss" in m]
    assert losses[-1] < losses[0] - 0.5, losses  # nats, from about ln(2048) = 7.6
    assert all(m["tokens_per_sec"] == m["samples_per_sec"] * 128 for m in records if "loss" in m)
    [held_out] = [m for m in records if "eval_perplexity" in m]
    assert held_out["eval_tokens"] > 10_000 and held_out["eval_perplexity"] < 2048 / 2, held_out
    assert re.search(r"evaluation         loss [\d.]+, perplexity [\d.]+ \(\d+ tokens\) \(step \d+\)",
                     summary), summary


def test_ctrl_c_tears_everything_down():
    _trainer_available()
    proc = subprocess.Popen(
        [RINGTRAIN, "run", "--steps", "5000", "--no-reclaim", "--no-progress",
         "--job-name", "ctrlc", "--dataset-shards", "1", "--samples-per-shard", "256"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            output.append(line)
            if line.startswith("attempt 1: submitted"):
                break
        assert any(ln.startswith("attempt 1: submitted") for ln in output), "".join(output)
        time.sleep(3)  # training under way
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        output.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(output)
    assert proc.returncode == 130, text
    assert "interrupted; the cluster was torn down" in text
    assert "Traceback" not in text

    up = re.search(r"local cluster up: .*?(?:bridge rtbr(\d+)|localhost).*"
                   r"object store http://([\d.]+):(\d+); work dir (\S+)", text)
    assert up, text
    subnet = int(up.group(1)) if up.group(1) else None
    assert leftovers(subnet_index=subnet, isolated=subnet is not None, workdir=Path(up.group(4)),
                     listen=[(up.group(2), int(up.group(3)))]) == []
    if subnet is not None:
        assert network.list_namespaces(f"{network.NETNS_PREFIX}{subnet}-") == []
