"""cluster.flow.run_job's own logic (resubmit on 75, bounded retries, guaranteed teardown) against an
in-memory backend; storage is the session's real S3-compatible store, with the dataset index present."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from cluster.backend import Backend, BackendError, JobHandle, JobResult, Storage
from cluster.flow import DatasetSpec, FlowInterrupted, FlowOptions, run_job
from cluster.job import JobSpec, trainer_config
from tests.summaries import run_summary
from train.contract import EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE


class ScriptedBackend(Backend):
    """Answers each submitted attempt with the next scripted (exit code, summary)."""

    name = "scripted"

    def __init__(self, store, bucket, outcomes, *, fail_on=None):
        self.store, self.bucket, self.outcomes, self.fail_on = store, bucket, list(outcomes), fail_on
        self.ups = self.downs = 0
        self.submitted: list[JobSpec] = []

    def up(self) -> None:
        self.ups += 1

    def storage(self, job_name: str) -> Storage:
        return Storage(f"s3://{self.bucket}/datasets/demo", f"s3://{self.bucket}/checkpoints/{job_name}",
                       self.store.endpoint_url, self.store.env())

    def submit(self, job: JobSpec) -> JobHandle:
        if self.fail_on == "submit":
            raise BackendError("no capacity")
        self.submitted.append(job)
        return JobHandle(name=job.name, backend=self.name, details={"hosts": ["a", "b"]})

    def logs(self, handle: JobHandle) -> Iterator[str]:
        if self.fail_on == "logs":
            raise BackendError("job j cannot start: pod j-worker-1 cannot be scheduled")
        yield "[0]<stderr>:train: warning: something the user should see"

    def wait(self, handle: JobHandle, timeout_s: float | None = None) -> JobResult:
        if self.fail_on == "wait":
            raise KeyboardInterrupt
        code, summary = self.outcomes.pop(0)
        return JobResult(name=handle.name, succeeded=code == 0, exit_code=code,
                         summary=run_summary(**summary) if summary else None,
                         message="" if code == 0 else f"exit {code}")

    def down(self) -> None:
        self.downs += 1


@pytest.fixture
def dataset_bucket(object_store, s3_bucket):
    object_store.client().put_object(Bucket=s3_bucket, Key="datasets/demo/index.json",
                                     Body=json.dumps({"format": "ringtrain-shards/1"}).encode())
    return s3_bucket


JOB = JobSpec(name="j", num_hosts=2, trainer=trainer_config(("--steps", "10")))
OPTS = FlowOptions(dataset=DatasetSpec(shards=1, samples_per_shard=8), progress_bar=False, poll_s=0.01)


def test_an_interrupted_job_is_resubmitted_and_its_resume_reported(object_store, dataset_bucket):
    b = ScriptedBackend(object_store, dataset_bucket, [
        (EXIT_INTERRUPTED_RESUMABLE, {"steps": 4, "interrupted": True, "resumed_from_step": None}),
        (0, {"steps": 10, "interrupted": False, "resumed_from_step": 4}),
    ])
    out: list[str] = []
    r = run_job(b, JOB, OPTS, out=out.append)
    assert r.succeeded and r.exit_code == 0 and len(r.attempts) == 2 and r.resumed
    assert b.ups == 1 and b.downs == 1
    trainer = b.submitted[0].trainer
    assert trainer.data.source == f"s3://{dataset_bucket}/datasets/demo"
    assert trainer.checkpoint.uri == f"s3://{dataset_bucket}/checkpoints/j"
    assert b.submitted[1] == b.submitted[0]  # the resume is the same job; the trainer finds its checkpoint
    assert any("train: warning" in line for line in out)
    assert any("resubmitting to resume" in line for line in out)


def test_resubmits_are_bounded(object_store, dataset_bucket):
    interrupted = (EXIT_INTERRUPTED_RESUMABLE, {"interrupted": True})
    b = ScriptedBackend(object_store, dataset_bucket, [interrupted] * 5)
    r = run_job(b, JOB, replace(OPTS, max_resubmits=1), out=lambda m: None)
    assert not r.succeeded and r.exit_code == EXIT_INTERRUPTED_RESUMABLE and len(r.attempts) == 2
    assert b.downs == 1


def test_bad_input_is_not_retried(object_store, dataset_bucket):
    b = ScriptedBackend(object_store, dataset_bucket, [(EXIT_BAD_INPUT, {})])
    r = run_job(b, JOB, OPTS, out=lambda m: None)
    assert r.exit_code == EXIT_BAD_INPUT and len(r.attempts) == 1 and r.message.startswith("bad input")
    assert b.downs == 1


def test_teardown_runs_on_errors_and_on_interrupts(object_store, dataset_bucket):
    b = ScriptedBackend(object_store, dataset_bucket, [], fail_on="submit")
    with pytest.raises(BackendError, match="no capacity"):
        run_job(b, JOB, OPTS, out=lambda m: None)
    assert b.downs == 1
    b = ScriptedBackend(object_store, dataset_bucket, [], fail_on="wait")
    with pytest.raises(FlowInterrupted):
        run_job(b, JOB, OPTS, out=lambda m: None)
    assert b.downs == 1


def test_an_error_while_following_the_logs_reaches_the_user_at_once(object_store, dataset_bucket):
    """Defect: _Follower lost an exception of its log thread and the flow waited on for the job."""
    b = ScriptedBackend(object_store, dataset_bucket, [(0, {"steps": 10})], fail_on="logs")
    with pytest.raises(BackendError, match="pod j-worker-1 cannot be scheduled"):
        run_job(b, JOB, OPTS, out=lambda m: None)
    assert b.outcomes == [(0, {"steps": 10})] and b.downs == 1   # wait() never called; teardown ran


def test_keep_up_skips_teardown(object_store, dataset_bucket):
    b = ScriptedBackend(object_store, dataset_bucket, [(0, {"steps": 10})])
    run_job(b, JOB, replace(OPTS, keep_up=True), out=lambda m: None)
    assert b.downs == 0


def test_fault_injection_on_a_backend_without_it_fails_before_anything_starts(object_store, dataset_bucket):
    b = ScriptedBackend(object_store, dataset_bucket, [(0, {})])
    with pytest.raises(BackendError, match="cannot inject faults"):
        run_job(b, JOB, replace(OPTS, reclaim_at_step=3), out=lambda m: None)
    assert b.ups == 0 and b.submitted == []


def test_an_unreachable_store_is_one_clear_error(object_store, dataset_bucket):
    class DeadStore:
        endpoint_url = "http://127.0.0.1:9"   # discard port: nothing listens

        @staticmethod
        def env():
            return object_store.env()

    b = ScriptedBackend(DeadStore(), dataset_bucket, [(0, {})])
    with pytest.raises(BackendError, match="cannot reach the object store"):
        run_job(b, JOB, OPTS, out=lambda m: None)
    assert b.downs == 1 and b.submitted == []


class ReclaimingBackend(ScriptedBackend):
    """Has the fault-injection API; its reclaim takes a while, as a real one waits out the grace period."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.events: list[str] = []
        self.live = ["host-0", "host-1"]
        self.reclaim_started = threading.Event()

    def submit(self, job):
        self.events.append(f"submit {sorted(self.live)}")
        return super().submit(job)

    def logs(self, handle):
        # The attempt "ends" as soon as the reclaim starts, before the reclaim has finished.
        self.reclaim_started.wait(timeout=5)
        yield "[0]<stdout>:done"

    def progress(self, handle):
        return {"step": 5, "loss": 1.0, "world_size": 2}

    def live_host_names(self):
        return list(self.live)

    def reclaim(self, host):
        self.events.append(f"reclaim {host} start")
        self.live.remove(host)
        self.reclaim_started.set()
        time.sleep(0.5)
        self.events.append(f"reclaim {host} done")

    def restore(self, host):
        self.events.append(f"restore {host}")
        self.live.append(host)


def test_one_reclaim_per_run_and_the_resubmit_waits_for_it(object_store, dataset_bucket):
    b = ReclaimingBackend(object_store, dataset_bucket, [
        (EXIT_INTERRUPTED_RESUMABLE, {"steps": 5, "interrupted": True}),
        (0, {"steps": 10, "resumed_from_step": 5}),
    ])
    r = run_job(b, JOB, replace(OPTS, reclaim_at_step=3), out=lambda m: None)
    assert r.succeeded and r.reclaimed == ["host-1"]
    assert b.events == [
        "submit ['host-0', 'host-1']",
        "reclaim host-1 start",
        "reclaim host-1 done",
        "restore host-1",                   # the replacement node, before the resume
        "submit ['host-0', 'host-1']",      # the second attempt does not reclaim again
    ]
    # the report's marks: which host, at which step of training
    assert [(rec.host, rec.step) for rec in r.reclaims] == [("host-1", 5)]
    assert r.attempts[0].started_at <= r.reclaims[0].at <= r.attempts[0].ended_at


def test_backend_capabilities_are_typed_protocols():
    from cluster.aws.backend import AwsBackend
    from cluster.backend import Cancel, FaultInjection, HardFaults, PreflightFloor, Progress
    from cluster.local.backend import LocalBackend

    local = LocalBackend(2, log=lambda m: None)   # not started: the capabilities are its methods
    assert isinstance(local, FaultInjection) and isinstance(local, Progress)
    assert isinstance(local, HardFaults) and isinstance(local, PreflightFloor)
    aws = AwsBackend("dev")
    # AWS: progress from the launcher's metrics lines (issue 39), the catalog's busbw floor (issue 37);
    # EC2 injects its own faults
    assert not isinstance(aws, FaultInjection) and not isinstance(aws, HardFaults)
    assert isinstance(aws, Progress) and isinstance(aws, PreflightFloor)
    assert isinstance(aws, Cancel) and isinstance(local, Cancel)
    assert isinstance(ReclaimingBackend(None, "b", []), FaultInjection)
    assert not isinstance(ScriptedBackend(None, "b", []), FaultInjection)


def test_attempts_carry_what_the_run_report_needs(object_store, dataset_bucket):
    """Each attempt's times, metrics records and (on AWS) node group, for the picture and the cost."""

    class NodeGroupBackend(ScriptedBackend):
        def submit(self, job):
            handle = super().submit(job)
            handle.details.update(node_group="a10g-spot", instance_types=["g5.12xlarge"],
                                  capacity_type="SPOT")
            return handle

        def wait(self, handle, timeout_s=None):
            result = super().wait(handle, timeout_s)
            result.metrics = [{"step": 10, "loss": 0.5}]
            return result

    b = NodeGroupBackend(object_store, dataset_bucket, [(0, {"steps": 10})])
    before = time.time()
    r = run_job(b, JOB, OPTS, out=lambda m: None)
    [a] = r.attempts
    assert before <= a.started_at <= a.ended_at <= time.time()
    assert a.metrics == [{"step": 10, "loss": 0.5}] and r.metrics == a.metrics
    assert (a.node_group, a.instance_types, a.capacity_type) == ("a10g-spot", ("g5.12xlarge",), "SPOT")


def test_a_failing_teardown_does_not_hide_the_original_error(object_store, dataset_bucket):
    class DownFails(ScriptedBackend):
        def down(self):
            super().down()
            raise BackendError("destroy failed")

    out: list[str] = []
    b = DownFails(object_store, dataset_bucket, [], fail_on="submit")
    with pytest.raises(BackendError, match="no capacity"):
        run_job(b, JOB, OPTS, out=out.append)
    assert b.downs == 1 and any("destroy failed" in line for line in out)
    # After a successful run the teardown error is the error.
    b = DownFails(object_store, dataset_bucket, [(0, {"steps": 10})])
    with pytest.raises(BackendError, match="destroy failed"):
        run_job(b, JOB, OPTS, out=out.append)
