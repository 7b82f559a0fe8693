"""The one interface every cluster backend implements (SkyPilot-style launch -> run -> down).

    backend.up()                  stand the cluster up (idempotent)
    backend.storage(job_name)     where that job's dataset and checkpoints live
    handle = backend.submit(job)  start a JobSpec
    for line in backend.logs(handle): ...   follow its output until it ends
    result = backend.wait(handle) final status, exit code and collected results
    backend.down()                tear the compute down (always safe to call twice)

Optional capabilities, typed as Protocols so the flow asks for them by name (isinstance) rather
than probing attributes:

    Cancel          backend.cancel(handle)     end a submitted job (a timeout, an interrupt, an error)
    Progress        backend.progress(handle)   the trainer's latest metrics record while a job runs
    FaultInjection  backend.live_host_names() / reclaim(host) / restore(host)   spot-style faults
    HardFaults      backend.kill(host) / freeze(host) / slow_link(host)   a crash, a hang, a slow link
    PreflightFloor  backend.preflight_floor(job)   the busbw the job's links must reach

The local backend has all three; the AWS backend Cancel only (EC2 reclaims spot nodes by itself there).

`run_job` is the flow `scripts/run` drives, with the teardown guaranteed.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cluster.job import JobSpec
from train.summary import RunSummary


class BackendError(RuntimeError):
    """A backend could not do what was asked; the message says what and what to do."""


@dataclass
class JobHandle:
    """A submitted job. `details` holds what its backend knows of it; every backend keeps "hosts" (the
    workers' host names) and, once the job has started, "nodes" (each worker pod's node), which the
    flow reads to keep an elastic job off a node its preflight found slow."""

    name: str
    backend: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobResult:
    name: str
    succeeded: bool
    exit_code: int | None
    summary: RunSummary | None = None  # the trainer's summary (None: its output held none)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # its JSON-lines metrics
    message: str = ""


@dataclass(frozen=True)
class Storage:
    """Where a backend's jobs read data and write checkpoints (same bucket layout everywhere).

    `env` is what a process needs to reach the store (endpoint URL and credentials for the local
    store; empty on AWS, where the pod's IAM role supplies credentials).
    """

    dataset_uri: str  # infra/storage_layout.py: s3://<datasets-bucket>/datasets/<name>
    checkpoint_uri: str  # and s3://<checkpoints-bucket>/checkpoints/<job-name>
    endpoint_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)


class Backend(abc.ABC):
    name: str = "abstract"

    @abc.abstractmethod
    def storage(self, job_name: str) -> Storage: ...

    @abc.abstractmethod
    def up(self) -> None: ...

    @abc.abstractmethod
    def submit(self, job: JobSpec) -> JobHandle: ...

    @abc.abstractmethod
    def logs(self, handle: JobHandle) -> Iterator[str]: ...

    @abc.abstractmethod
    def wait(self, handle: JobHandle, timeout_s: float | None = None) -> JobResult: ...

    @abc.abstractmethod
    def down(self) -> None: ...

    def __enter__(self) -> Backend:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


@runtime_checkable
class Cancel(Protocol):
    """A backend that can end a job it submitted before it finishes."""

    def cancel(self, handle: JobHandle) -> None: ...


@runtime_checkable
class Progress(Protocol):
    """A backend that can say how far a running job is."""

    def progress(self, handle: JobHandle) -> dict[str, Any] | None:
        """The trainer's latest metrics record (step, loss, samples_per_sec, world_size), if any."""
        ...


@runtime_checkable
class FaultInjection(Protocol):
    """A backend that can take a host away the way EC2 reclaims a spot node, and bring it back."""

    def live_host_names(self) -> list[str]: ...

    def reclaim(self, host: str) -> None:
        """SIGTERM to the host's workers, then the host goes away (blocks for the grace period)."""
        ...

    def restore(self, host: str) -> None:
        """The host comes back under the same name (a spot node group's replacement node); on a host
        that stayed up, what a fault left (frozen workers) is cleared."""
        ...


@runtime_checkable
class HardFaults(Protocol):
    """A backend that can also fail a host's workers without notice (`ringtrain run --fault kill|hang`)."""

    def kill(self, host: str) -> None:
        """SIGKILL to the host's workers: no notice, no checkpoint (a crash, an OOM kill)."""
        ...

    def freeze(self, host: str) -> None:
        """SIGSTOP to the host's workers: a hang, for the watchdog to find."""
        ...

    def slow_link(self, host: str) -> None:
        """Cap the host's link (tc tbf): the preflight must find it."""
        ...


@runtime_checkable
class PreflightFloor(Protocol):
    """A backend that knows the collective bandwidth its nodes must reach (train/preflight.py)."""

    def preflight_floor(self, job: JobSpec) -> float | None:
        """Allreduce busbw in bytes/s below which the job fails fast (None: measure and report only)."""
        ...
