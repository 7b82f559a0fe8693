"""The one interface every cluster backend implements (SkyPilot-style launch -> run -> down).

    backend.up()                  stand the cluster up (idempotent)
    backend.storage(job_name)     where that job's dataset and checkpoints live
    handle = backend.submit(job)  start a JobSpec
    for line in backend.logs(handle): ...   follow its output until it ends
    result = backend.wait(handle) final status, exit code and collected results
    backend.down()                tear the compute down (always safe to call twice)

`run_job` is the flow `scripts/run` drives, with the teardown guaranteed.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cluster.job import JobSpec
from train.summary import RunSummary


class BackendError(RuntimeError):
    """A backend could not do what was asked; the message says what and what to do."""


@dataclass
class JobHandle:
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
