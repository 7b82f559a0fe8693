"""The AWS backend's job lifecycle, submit -> wait -> logs -> exit code -> resubmit, offline: `kubectl` is
the stand-in in tests/cluster/kubectl_standin (API server + MPI Operator v0.8.2), EKS scaling a moto
server on loopback, the stack its exports under mocks."""

from __future__ import annotations

import time

import pytest

import cluster.aws.backend as aws_backend
from cluster.aws.backend import AwsBackend
from cluster.backend import BackendError
from cluster.flow import FlowOptions, run_job
from cluster.job import JobSpec, trainer_config
from tests.cluster.kubectl_standin import FakeCluster, JobScript
from tests.cluster.test_aws_backend import RECLAIMED_LOG, RecordingStack, aws_env, dev_exports, moto_aws  # noqa: F401
from tests.summaries import run_summary
from train.contract import EXIT_INTERRUPTED_RESUMABLE

DONE_LOG = ["[0]<stdout>:step 10 loss 0.50",
            "[0]<stdout>:" + run_summary(steps=20, resumed_from_step=153).line()]
GPU_NODE = {"nvidia.com/gpu": 4}


@pytest.fixture
def fake(tmp_path, monkeypatch, moto_aws):  # noqa: F811
    monkeypatch.setattr(aws_backend, "POLL_S", 0.05)
    cluster = FakeCluster(tmp_path / "cluster").install(monkeypatch)
    cluster.add_nodes("a10g-spot", 2, GPU_NODE)
    return cluster


def backend_for(exports, tmp_path, **kw):
    ops = RecordingStack("dev", exports)
    messages: list[str] = []
    backend = AwsBackend("dev", node_group="a10g-spot", kubeconfig=tmp_path / "kubeconfig",
                         ops_factory=lambda s: ops, log=messages.append, **kw)
    return backend, ops, messages


def flow(backend, job, **opts):
    lines: list[str] = []
    opts.setdefault("dataset", None)
    result = run_job(backend, job, FlowOptions(progress_bar=False, **opts), out=lines.append)
    return result, lines


JOB = JobSpec(name="life", num_hosts=2, slots_per_host=4,
              trainer=trainer_config(("--data", "s3://d/x", "--steps", "20")))


def test_a_normal_run(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(log=DONE_LOG, exit_code=0))
    backend, ops, _ = backend_for(dev_exports, tmp_path)
    result, lines = flow(backend, JOB)
    assert result.succeeded and result.exit_code == 0 and len(result.attempts) == 1, lines
    assert result.summary.steps == 20
    assert ops.calls[-1] == ("up", {"ringtrain:compute": "false"})   # teardown
    deletes = [c for c in fake.calls() if c[2:3] == ["delete"]]
    assert "--cascade=foreground" in deletes[0] and "--wait=true" in deletes[0]


@pytest.mark.slow   # two jobs' worth of kubectl processes
def test_a_spot_reclaim_is_resubmitted_and_resumes(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(log=RECLAIMED_LOG, exit_code=1), JobScript(log=DONE_LOG, exit_code=0))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    result, lines = flow(backend, JOB)
    assert [a.exit_code for a in result.attempts] == [EXIT_INTERRUPTED_RESUMABLE, 0], lines
    assert result.succeeded and result.resumed
    uids = [j["uid"] for j in fake.mpijobs()]
    assert len(set(uids)) == 2 and fake.mpijobs()[0]["deleted_at"] is not None


def test_a_worker_that_never_schedules_fails_at_once_naming_the_pod(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(unschedulable_workers=[1], log=DONE_LOG))
    backend, _, messages = backend_for(dev_exports, tmp_path)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"job life cannot start: pod life-worker-1 cannot be scheduled: "
                                           r"0/2 nodes are available: 2 Insufficient nvidia.com/gpu"):
        flow(backend, JOB)
    assert time.monotonic() - started < 30
    assert fake.mpijobs()[-1]["deleted_at"] is not None   # cancelled on the cluster too
    assert any("deleted MPIJob training/life" in m for m in messages)


def test_a_failing_self_test_fails_at_once_with_its_output(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(init_failure={"exit_code": 3, "log": ["selftest: NCCL did not select EFA"]}))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    with pytest.raises(BackendError) as err:
        flow(backend, JOB)
    text = str(err.value)
    assert "pod life-worker-0: init container selftest failed with exit code 3" in text
    assert "| selftest: NCCL did not select EFA" in text


def test_an_image_that_cannot_be_pulled_fails_at_once(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(image_pull_error='failed to pull "acme/img:v9": not found'))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    with pytest.raises(BackendError, match=r"pod life-worker-0: container worker ImagePullBackOff: "
                                           r"failed to pull \"acme/img:v9\": not found"):
        flow(backend, JOB)


def test_pods_still_pending_at_the_startup_deadline_fail_naming_them(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(start_s=60.0))
    backend, _, _ = backend_for(dev_exports, tmp_path, startup_timeout_s=1.0)
    with pytest.raises(BackendError, match=r"job life did not start within 1 s: life-worker-0 \(container "
                                           r"selftest waiting: PodInitializing\); life-worker-1 "):
        flow(backend, JOB)


@pytest.mark.slow   # two jobs' worth of kubectl processes
def test_a_resubmit_waits_for_the_previous_pods_and_reads_only_its_own(fake, dev_exports, tmp_path):  # noqa: F811
    """The first attempt's pods stay Terminating for a while after the delete: the resubmission must not
    read the old launcher, nor take kubectl's NotFound for the job's log."""
    fake.plan(JobScript(log=RECLAIMED_LOG, exit_code=1, terminating_s=2.0),
              JobScript(log=DONE_LOG, exit_code=0, start_s=1.5))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    result, lines = flow(backend, JOB)
    assert [a.exit_code for a in result.attempts] == [EXIT_INTERRUPTED_RESUMABLE, 0], lines
    assert result.succeeded and result.summary.steps == 20
    first, second = fake.mpijobs()
    assert second["t0"] >= first["deleted_at"] + 2.0   # applied once the old pods were gone
    assert not any("NotFound" in line or "waiting to start" in line for line in lines)


@pytest.mark.slow   # two jobs' worth of kubectl processes
def test_a_log_stream_cut_mid_run_does_not_decide_the_exit_code(fake, dev_exports, tmp_path):  # noqa: F811
    """kubectl's `logs -f` ends mid-run ("error: unexpected EOF"): the lines after the cut (the summary
    and horovodrun's exit lines) still decide that the reclaim is resumable."""
    fake.plan(JobScript(log=RECLAIMED_LOG, exit_code=1, cut_after_lines=1, line_s=1.2),
              JobScript(log=DONE_LOG, exit_code=0))
    backend, _, messages = backend_for(dev_exports, tmp_path)
    result, lines = flow(backend, JOB)
    assert [a.exit_code for a in result.attempts] == [EXIT_INTERRUPTED_RESUMABLE, 0], (lines, messages)
    assert any(m.startswith("the log stream of life-launcher-")
               and m.endswith("exited 1: error: unexpected EOF") for m in messages), messages
    assert any(m.endswith("still runs: following its log again") for m in messages), messages


@pytest.mark.slow   # two jobs' worth of kubectl processes
def test_an_interrupt_or_timeout_deletes_the_job_unless_keep_up(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(log=DONE_LOG * 200, line_s=0.05), JobScript(log=DONE_LOG * 200, line_s=0.05))
    backend, ops, messages = backend_for(dev_exports, tmp_path)
    with pytest.raises(BackendError, match=r"job life did not finish within 0.5s \(--job-timeout\)"):
        flow(backend, JOB, job_timeout_s=0.5)
    assert fake.mpijobs()[-1]["deleted_at"] is not None
    assert not any("log stream" in m for m in messages), messages   # closed by us: no error
    backend, ops, _ = backend_for(dev_exports, tmp_path)
    with pytest.raises(BackendError, match="did not finish within"):
        flow(backend, JOB, job_timeout_s=0.5, keep_up=True)
    assert fake.mpijobs()[-1]["deleted_at"] is None      # --keep-up: the job stays
    assert ops.calls == [("up", {"ringtrain:compute": "true"})]


@pytest.mark.slow   # two backends' worth of kubectl processes
def test_logs_and_status_of_a_job_submitted_earlier(fake, dev_exports, tmp_path):  # noqa: F811
    """`ringtrain logs --job` and `status --job` find the job by its MPIJob (uid and workers)."""
    fake.plan(JobScript(log=DONE_LOG, exit_code=0))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    backend.submit(JOB)
    later, _, _ = backend_for(dev_exports, tmp_path)
    assert list(later.logs(later.handle_for("life"))) == DONE_LOG
    status = later.job_status("life")
    assert (status["state"], status["exitCode"]) == ("Succeeded", 0)
    with pytest.raises(BackendError, match="no MPIJob training/other: submit it first"):
        later.handle_for("other")
