"""The one flow every backend runs.

    up -> storage -> dataset -> (preflight job) -> submit -> follow -> (resume) -> summary -> down

    result = run_job(backend, job, FlowOptions(...))

A job that ends with exit code 75 (interrupted by SIGTERM after a checkpoint: a spot reclaim) is
submitted again and the trainer resumes from its latest checkpoint, up to `max_resubmits` times.
An elastic job's preflight runs first as a static job of its own, and a slow node it names is kept out
of the elastic job (cluster/preflight_gate.py). Teardown (`backend.down()`) always runs, on errors and
on Ctrl-C / SIGTERM too, unless the caller asked to keep the cluster up.

Fault injection (`reclaim_at_step`) needs a backend with the FaultInjection and Progress capabilities
(cluster/backend.py); the local backend has them. A backend with Progress gets a progress bar.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.backend import (
    Backend,
    BackendError,
    Cancel,
    FaultInjection,
    HardFaults,
    JobHandle,
    JobResult,
    PreflightFloor,
    Progress,
    Storage,
)
from cluster.job import JobSpec
from cluster.preflight_gate import GateDecision, decide_gate, needs_gate, preflight_job, preflight_record
from cluster.recovery import FailureCost, Next, decide, failure_cost, last_step
from cluster.run_data import Dataset, DatasetSpec
from train import stragglers
from train.config import TrainConfig, with_flags
from train.contract import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED_RESUMABLE,
    EXIT_PREFLIGHT_FAILED,
    MANIFEST,
    step_dir,
)
from train.summary import RunSummary, format_eval

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class FlowOptions:
    # written into the datasets bucket unless there; None: the job's own --data (cluster/run_data.py)
    dataset: Dataset | None = field(default_factory=DatasetSpec)
    max_resubmits: int = 3                 # spot stops (exit 75) resubmitted
    max_restarts: int = 2                  # failures (any exit but 0, 2, 75, 69) restarted from a checkpoint
    reclaim_at_step: int | None = None     # fault injection: inject `fault` once this step is reached
    fault: str = "reclaim"                 # which fault (FAULTS)
    reclaim_host: str | None = None        # the host it hits; default: the last live host
    restore_after_s: float | None = None   # bring it back this long after the reclaim (None: before resubmit)
    keep_up: bool = False
    progress_bar: bool = True
    echo_logs: bool = False                # every line of the job's output, not only the trainer's messages
    job_timeout_s: float | None = None    # the run itself, from its first output; None: no limit
    poll_s: float = 0.25
    keep_export_in: Path | None = None     # copy the run's export here before teardown (the local store goes)


@dataclass
class Attempt:
    """One submission of the job, as the run report needs it."""

    exit_code: int | None
    summary: RunSummary | None
    hosts: list[str]
    message: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)  # the trainer's JSON-lines records
    started_at: float = 0.0   # epoch seconds: before submit (nodes scaled and awaited on AWS) ...
    ended_at: float = 0.0     # ... to the job's end
    node_group: str | None = None           # AWS: the node group it ran on, its types and capacity
    instance_types: tuple[str, ...] = ()
    capacity_type: str | None = None
    decision: str = ""                      # what the flow did next, and why (cluster/recovery.py)
    cost: FailureCost | None = None         # for an attempt that failed and was restarted


@dataclass(frozen=True)
class Reclaim:
    """The injected fault: `host` hit by `fault` once training reached `step`, at `at` (epoch seconds)."""

    host: str
    step: int
    at: float
    fault: str = "reclaim"


@dataclass
class FlowResult:
    job: str
    succeeded: bool
    exit_code: int | None
    attempts: list[Attempt]
    summary: RunSummary | None
    metrics: list[dict[str, Any]]
    reclaimed: list[str]
    storage: Storage | None
    message: str = ""
    reclaims: list[Reclaim] = field(default_factory=list)
    export_kept: Path | None = None   # where the export was copied to (FlowOptions.keep_export_in)
    preflight: Attempt | None = None  # an elastic job's preflight job (cluster/preflight_gate.py)

    @property
    def resumed(self) -> bool:
        return any(a.summary is not None and a.summary.resumed_from_step is not None
                   for a in self.attempts[1:])


class FlowInterrupted(Exception):
    """Ctrl-C or SIGTERM while the flow ran; teardown has run."""


def trainer_config_for(job: JobSpec, storage: Storage, dataset: Dataset | None) -> TrainConfig:
    """The job's trainer configuration plus where its data (the flow's `dataset`, None: the job's own) and
    checkpoints live (pure but for loading the task). What the job's configuration already says wins."""
    cfg = job.trainer
    if dataset is not None:
        cfg = with_flags(cfg, dataset.trainer_args(dataset.uris(storage), cfg.task.args))
    if cfg.checkpoint.uri is None:
        checkpoint = dataclasses.replace(cfg.checkpoint, uri=storage.checkpoint_uri)
        cfg = dataclasses.replace(cfg, checkpoint=checkpoint)
    if storage.endpoint_url and cfg.s3_endpoint_url is None:
        cfg = dataclasses.replace(cfg, s3_endpoint_url=storage.endpoint_url)
    if job.elastic:
        cfg = dataclasses.replace(cfg, horovod=dataclasses.replace(cfg.horovod, elastic=True))
    # The flow draws its own progress bar from the metrics; a tqdm bar per attempt would garble the log.
    return dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, progress=False))


def is_trainer_message(line: str) -> bool:
    """Lines worth showing without --verbose: the trainer's own messages ("train: error: ...",
    "train: warning: ...", "ringtrain: elastic reset ...") (pure). horovodrun's own chatter about
    workers exiting is left out: the flow reports what the exit codes mean."""
    return "train: " in line or "ringtrain:" in line


def without_launcher_traceback(lines: list[str]) -> list[str]:
    """The output minus horovodrun's own Python traceback for "a worker exited non-zero", which
    repeats what its "Process N exit with status code C" line already said (pure)."""
    kept: list[str] = []
    block: list[str] = []
    for line in lines:
        if block:
            block.append(line)
            if line.startswith(("RuntimeError: Horovod detected", "Process name:", "Exit code:")):
                continue
            if line.startswith(("  ", "    ")) or not line.strip():
                continue
            kept.extend(block)  # not horovodrun's block after all
            block = []
        elif line.startswith("Traceback (most recent call last):"):
            block = [line]
        else:
            kept.append(line)
    if block and not any(ln.startswith("RuntimeError: Horovod detected") for ln in block):
        kept.extend(block)
    return kept


def format_summary(result: FlowResult) -> str:
    """The human summary printed at the end of a run (pure)."""
    s = result.summary
    lines = [f"job {result.job}: {'done' if result.succeeded else 'FAILED'} "
             f"(exit code {result.exit_code}, {len(result.attempts)} attempt(s))"]
    summaries = [a.summary for a in result.attempts if a.summary is not None]
    written = sum(x.checkpoints_written for x in summaries)
    deferred = sum(x.checkpoints_deferred for x in summaries)
    late = f", {deferred} deferred past their step (the previous write was still going)" if deferred else ""
    if s is not None:
        first = result.attempts[0].summary if result.attempts else None

        def num(v: float | None, fmt: str) -> str:
            return format(v, fmt) if v is not None else "n/a"

        lines += [
            f"  steps              {s.steps}",
            f"  loss               {num(first.initial_loss if first else None, '.4f')} -> "
            f"{num(s.final_loss, '.4f')}",
            f"  samples/s          {num(s.samples_per_sec, '.1f')} (last attempt, {s.world_size} workers)",
            f"  checkpoints        {written} written{late}",
        ]
        rate = s.throughput or {}
        if "tokens_per_sec" in rate:  # a task that counts tokens (lm); MFU on GPUs
            mfu = f", MFU {rate['mfu']:.1%}" if "mfu" in rate else ""
            lines.append(f"  tokens/s           {rate['tokens_per_sec']:.0f}{mfu} (last attempt)")
        evaluation = format_eval(s.eval)
        if evaluation:
            lines.append(f"  evaluation         {evaluation} (step {s.steps})")
        if s.export:
            kept = f", kept in {result.export_kept}" if result.export_kept else ""
            lines.append(f"  export             {s.export}{kept}")
    for i, a in enumerate(result.attempts, 1):
        start = attempt_start(a.summary)
        end = ("interrupted (resumable)" if a.exit_code == EXIT_INTERRUPTED_RESUMABLE
               else f"exit {a.exit_code}")
        reached = a.summary.steps if a.summary else last_step(a.metrics)
        reached_text = reached if reached is not None else "?"
        lines.append(f"  attempt {i}: {start}, reached step {reached_text}, {end}, "
                     f"hosts {', '.join(a.hosts) or '?'}"
                     + (f", elastic resets {a.summary.elastic_resets}"
                        if a.summary and a.summary.elastic_resets else "")
                     + (f"; restarted, cost {a.cost.describe()}" if a.cost is not None else ""))
    reclaimed = [r.host for r in result.reclaims if r.fault == "reclaim"] or result.reclaimed
    if reclaimed:
        lines.append(f"  reclaimed          {', '.join(reclaimed)}")
    for r in result.reclaims:
        if r.fault != "reclaim":
            lines.append(f"  fault injected     {r.fault} {r.host} at step {r.step}")
    every_record = [m for a in ([result.preflight] if result.preflight else []) + result.attempts
                    for m in a.metrics]
    p = preflight_record(every_record)
    if p is not None:
        verdict = "passed" if p.get("passed") else f"FAILED, slow: {', '.join(p.get('slow_hosts') or ['?'])}"
        floor = f"floor {p['floor_gbps']:g} GB/s" if p.get("floor_gbps") is not None else "no floor"
        lines.append(f"  preflight          allreduce busbw {p['busbw_gbps']:g} GB/s over {p['ranks']} ranks "
                     f"({floor}): {verdict}")
        if result.preflight is not None and result.preflight.decision:
            lines.append(f"                     {result.preflight.decision}")
    straggle = stragglers.describe(every_record)
    if straggle:
        lines.append(f"  stragglers         {straggle}")
    if result.message:
        lines.append(f"  {result.message}")
    return "\n".join(lines)


def attempt_start(summary: RunSummary | None) -> str:
    """Where an attempt started: a checkpoint (which wins over --init-from), --init-from's weights or
    scratch (pure)."""
    where = summary.resumed_from_step if summary else None
    init = summary.init_from if summary else None
    if where is not None:
        return f"resumed from step {where}" + (f" (a resume wins over --init-from {init['uri']})"
                                               if init else "")
    if init and init.get("applied", True):
        skipped = [f"{len(init[k])} {k}" for k in ("missing", "unexpected", "mismatched") if init.get(k)]
        return (f"initialized from {init['uri']} ({init['loaded']} tensors"
                + (f"; {', '.join(skipped)} key(s) left as built" if skipped else "") + ")")
    return "from scratch"


def storage_client(storage: Storage):
    """A boto3 S3 client for `storage`: its endpoint and, for the local store, its credentials."""
    import boto3

    env = storage.env
    return boto3.client(
        "s3", endpoint_url=storage.endpoint_url,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        region_name=env.get("AWS_DEFAULT_REGION"),
    )


def ensure_dataset(storage: Storage, dataset: Dataset, out: Callable[[str], None] = print,
                   timeout_s: float = 600) -> bool:
    """Write `dataset` into storage's datasets bucket unless all its indexes are there. True if written."""
    from botocore.exceptions import BotoCoreError, ClientError

    uris = dataset.uris(storage)
    env = storage.env
    client = storage_client(storage)

    def present(uri: str) -> bool:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        try:
            client.head_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/index.json")
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise BackendError(f"cannot read {uri}: {e}") from e
            return False
        except BotoCoreError as e:
            raise BackendError(f"cannot reach the object store at {storage.endpoint_url}: {e}") from e

    where = " and ".join(uris.all())
    if all(present(uri) for uri in uris.all()):
        out(f"dataset already there: {where}")
        return False
    out(f"writing dataset {where} ({dataset.describe()})")
    env_all = {**os.environ, **env}
    if storage.endpoint_url:
        env_all["AWS_ENDPOINT_URL"] = storage.endpoint_url
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="ringtrain-data-") as scratch:
        for cmd in dataset.commands(uris, Path(scratch)):
            try:
                done = subprocess.run(cmd, cwd=REPO_ROOT, env=env_all, capture_output=True, text=True,
                                      timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BackendError(f"writing the dataset did not finish within {timeout_s:g}s") from None
            if done.returncode != 0:
                raise BackendError(f"writing the dataset failed: `{' '.join(cmd[1:4])} ...` exited "
                                   f"{done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}")
    return True


@contextlib.contextmanager
def _signals_raise_interrupt():
    """SIGTERM and SIGHUP (terminal closed) behave like Ctrl-C, so `finally` blocks (teardown) run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


# The faults `ringtrain run --fault` injects (local backend); each ends as cluster/recovery.py says.
FAULTS = {
    "reclaim": "spot-style: SIGTERM, then the host goes away",
    "kill": "SIGKILL to the host's workers: no notice, no checkpoint",
    "hang": "SIGSTOP to the host's workers: they stop answering",
    "slow-link": "the host's link capped (tc tbf) from the start: the preflight must find it",
}


class _Reclaimer:
    """The planned fault: once training reaches `at_step`, hit one host with `opts.fault` (once per
    run), and bring it back after `restore_after_s` or, at the latest, before the job runs again.

    A reclaim blocks for the workers' grace period, so it runs in a thread while the flow follows
    the job on; so does a delayed restore."""

    def __init__(self, backend: FaultInjection, opts: FlowOptions, at_step: int,
                 out: Callable[[str], None]):
        self.backend, self.opts, self.at_step, self.out = backend, opts, at_step, out
        self.reclaims: list[Reclaim] = []
        self._fired = False
        self._stopping = threading.Event()   # tells a pending delayed restore not to start
        self._reclaim_threads: list[threading.Thread] = []
        self._restore_threads: list[threading.Thread] = []

    def before_first_submit(self) -> None:
        """A slow link is there from the start, as a degraded node's is."""
        if self.opts.fault == "slow-link" and not self._fired:
            self._fired = True
            self._reclaim(0)

    def at(self, step: int) -> None:
        """Called with the job's progress: fires the fault the first time `step` reaches the plan."""
        if self._fired or step < self.at_step:
            return
        self._fired = True
        self._start(self._reclaim_threads, self._reclaim, step, name=self.opts.fault)

    @staticmethod
    def _start(threads: list[threading.Thread], target: Callable[..., None], *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        threads.append(thread)
        thread.start()

    def _reclaim(self, step: int) -> None:
        live = self.backend.live_host_names()
        host = self.opts.reclaim_host or (live[-1] if live else None)
        if host is None:
            return
        fault = self.opts.fault
        verb = {"reclaim": "reclaiming", "kill": "killing", "hang": "freezing", "slow-link": "slowing"}[fault]
        self.out(f"fault injection: {verb} {host} at step {step} ({FAULTS[fault]})")
        at = time.time()
        try:
            if fault == "reclaim":
                self.backend.reclaim(host)
            elif fault == "kill":
                self.backend.kill(host)
            elif fault == "hang":
                self.backend.freeze(host)
            else:
                self.backend.slow_link(host)
        except BackendError as e:
            self.out(f"fault injection failed: {e}")
            return
        self.reclaims.append(Reclaim(host=host, step=step, at=at, fault=fault))
        if self.opts.restore_after_s is not None and fault == "reclaim":
            self._start(self._restore_threads, self._restore_later, host, name="restore")

    def _restore_later(self, host: str) -> None:
        if self._stopping.wait(self.opts.restore_after_s):
            return
        with contextlib.suppress(BackendError):
            self.backend.restore(host)

    def wait_for_reclaim(self) -> None:
        """The job may end before the reclaim has finished taking the host away."""
        for thread in self._reclaim_threads:
            thread.join(timeout=300)

    def wait_for_restores(self) -> None:
        """Before a resubmit: a delayed restore under way finishes first."""
        for thread in self._restore_threads:
            thread.join(timeout=(self.opts.restore_after_s or 0) + 60)

    def restore_for_resubmit(self) -> None:
        """A spot node group replaces a reclaimed node; here the reclaimed host comes back, and a host
        that hung is cleared (its frozen workers go)."""
        live = self.backend.live_host_names()
        for record in self.reclaims:
            if record.host not in live or record.fault != "reclaim":
                self.backend.restore(record.host)

    def stop(self) -> None:
        """Teardown is next: no delayed restore starts any more; wait for the threads to end."""
        self._stopping.set()
        for thread in self._reclaim_threads + self._restore_threads:
            thread.join(timeout=60)


class _ProgressBar:
    """tqdm's bar over the steps, fed from the backend's progress records (absent: no bar)."""

    def __init__(self, job_name: str, total_steps: int | None, enabled: bool):
        self._bar = None
        if enabled and total_steps:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", desc=job_name, dynamic_ncols=True,
                             file=sys.stderr, mininterval=0.5)

    def write(self, text: str, out: Callable[[str], None]) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            out(text)

    def show(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        if self._bar is None or step == self._bar.n:
            return
        self._bar.n = step
        self._bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}",
                              workers=record.get("world_size", "?"), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class _Follower:
    """Follows one attempt: echoes its log lines (a thread), polls its progress for the bar and the
    planned reclaim, until the log ends or the job's time is up. The job's time (`job_timeout_s`)
    counts from its first line of output: waiting for nodes and pods is the backend's startup deadline.
    An error in the log thread (the job cannot start, kubectl failed) is raised here at once."""

    def __init__(self, backend: Backend, handle: JobHandle, job: JobSpec, opts: FlowOptions,
                 out: Callable[[str], None], reclaimer: _Reclaimer | None):
        self.backend, self.handle, self.job, self.opts, self.out = backend, handle, job, opts, out
        self.reclaimer = reclaimer
        self.progress = backend if isinstance(backend, Progress) else None
        self.bar = _ProgressBar(job.name, job.trainer.steps, opts.progress_bar and self.progress is not None)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.started_at: float | None = None   # monotonic time of the first line
        self.tail: collections.deque[str] = collections.deque(maxlen=25)
        self._log_thread = threading.Thread(target=self._echo, daemon=True)

    def _echo(self) -> None:
        try:
            for line in self.backend.logs(self.handle):
                if self.started_at is None:
                    self.started_at = time.monotonic()
                self.tail.append(line)
                if self.opts.echo_logs or is_trainer_message(line):
                    self.bar.write(f"  | {line}", self.out)
        except BaseException as e:   # handed to run(), in the flow's thread
            self._error = e
        finally:
            self._done.set()

    def time_left(self) -> float | None:
        """Seconds of the job's time left (None: no limit); the full time until its first line."""
        if self.opts.job_timeout_s is None:
            return None
        if self.started_at is None:
            return self.opts.job_timeout_s
        return max(0.0, self.started_at + self.opts.job_timeout_s - time.monotonic())

    def run(self) -> None:
        self._log_thread.start()
        try:
            while not self._done.wait(self.opts.poll_s):
                left = self.time_left()
                if left is not None and left <= 0:
                    raise BackendError(f"job {self.job.name} did not finish within "
                                       f"{self.opts.job_timeout_s:g}s (--job-timeout)")
                record = self.progress.progress(self.handle) if self.progress is not None else None
                if record is None:
                    continue
                self.bar.show(record)
                if self.reclaimer is not None:
                    self.reclaimer.at(int(record.get("step", 0)))
            if self._error is not None:
                raise self._error
        finally:
            self.bar.close()


def _reclaimer_for(backend: Backend, opts: FlowOptions, out: Callable[[str], None]) -> _Reclaimer | None:
    """The planned fault, or None; a backend that cannot inject it fails here, before anything starts."""
    if opts.reclaim_at_step is None:
        return None
    if not (isinstance(backend, FaultInjection) and isinstance(backend, Progress)):
        raise BackendError(f"the {backend.name} backend cannot inject faults (reclaim/restore); "
                           "drop the reclaim option")
    if opts.fault not in FAULTS:
        raise BackendError(f"fault {opts.fault!r}: allowed are {', '.join(FAULTS)}")
    if opts.fault != "reclaim" and not isinstance(backend, HardFaults):
        raise BackendError(f"the {backend.name} backend cannot inject --fault {opts.fault}")
    return _Reclaimer(backend, opts, opts.reclaim_at_step, out)


def _attempt_of(handle: JobHandle, result: JobResult, hosts: list[str], started_at: float) -> Attempt:
    details = handle.details
    return Attempt(result.exit_code, result.summary, hosts, result.message, metrics=result.metrics,
                   started_at=started_at, ended_at=time.time(), node_group=details.get("node_group"),
                   instance_types=tuple(details.get("instance_types", ())),
                   capacity_type=details.get("capacity_type"))


def _show_failure(attempt_no: int, result: JobResult, follower: _Follower,
                  out: Callable[[str], None]) -> None:
    out(f"attempt {attempt_no} failed (exit code {result.exit_code}); its last output:")
    for line in without_launcher_traceback(list(follower.tail)):
        out(f"  | {line}")


def _cancel(backend: Backend, handle: JobHandle, out: Callable[[str], None]) -> None:
    """End the attempt's job on the cluster before teardown: on AWS compute-off takes many minutes,
    during which the job would keep its GPU nodes busy."""
    if not isinstance(backend, Cancel):
        return
    with _ignore_interrupts():
        try:
            backend.cancel(handle)
        except Exception as e:
            out(f"could not cancel job {handle.name}: {e}")


def _teardown(backend: Backend, completed: bool, out: Callable[[str], None]) -> None:
    with _ignore_interrupts():
        try:
            backend.down()
        except Exception as e:
            if completed:
                raise
            # Already failing: report the teardown problem, keep the original error.
            out(f"teardown after the failure also failed: {e}")


def run_job(backend: Backend, job: JobSpec, opts: FlowOptions | None = None,
            out: Callable[[str], None] = print) -> FlowResult:
    """Run `job` on `backend` from stand-up to teardown; see the module docstring."""
    opts = opts or FlowOptions()
    reclaimer = _reclaimer_for(backend, opts, out)
    attempts: list[Attempt] = []
    storage: Storage | None = None
    completed = False
    with _signals_raise_interrupt():
        try:
            backend.up()
            storage = backend.storage(job.name)
            if opts.dataset is not None:
                ensure_dataset(storage, opts.dataset, out=out)
            job = dataclasses.replace(job, trainer=trainer_config_for(job, storage, opts.dataset),
                                      env={**storage.env, **job.env})
            job = _with_preflight_floor(backend, job)
            if reclaimer is not None:
                reclaimer.before_first_submit()
            gate = None
            if needs_gate(job):
                gate, gate_result, decision = _preflight_gate(backend, job, opts, out)
                if not decision.passed:
                    completed = True
                    if gate_result.exit_code not in (0, EXIT_PREFLIGHT_FAILED):   # its own failure, as is
                        return _result_of(job, [gate], gate_result, reclaimer, storage)
                    return FlowResult(job=job.name, succeeded=False, exit_code=EXIT_PREFLIGHT_FAILED,
                                      attempts=[gate], summary=None, metrics=gate.metrics, reclaimed=[],
                                      storage=storage, message=f"preflight: {decision.failure}",
                                      reclaims=list(reclaimer.reclaims) if reclaimer else [])
                job = dataclasses.replace(job, exclude_nodes=decision.exclude_nodes)
            resubmits = restarts = 0
            attempt_no = 0
            while True:
                attempt_no += 1
                started_at = time.time()
                handle = backend.submit(job)
                hosts = list(handle.details.get("hosts", []))
                out(f"attempt {attempt_no}: submitted {job.name} on {', '.join(hosts) or backend.name}")
                follower = _Follower(backend, handle, job, opts, out, reclaimer)
                try:
                    follower.run()
                    last = backend.wait(handle, timeout_s=follower.time_left())
                except BaseException:
                    if not opts.keep_up:   # a timeout, an interrupt, an error: the job ends too
                        _cancel(backend, handle, out)
                    raise
                if reclaimer is not None:
                    reclaimer.wait_for_reclaim()
                attempt = _attempt_of(handle, last, hosts, started_at)
                if attempts and attempts[-1].cost is not None:   # the previous failure's cost, now known
                    attempts[-1].cost = failure_cost(
                        attempts[-1].metrics, attempts[-1].ended_at,
                        last.summary.resumed_from_step if last.summary else attempts[-1].cost.resumed_from,
                        attempt.metrics)
                attempts.append(attempt)
                completed_steps = last.exit_code != 0 and _final_checkpoint_written(storage, job, last)
                decision = decide(last.exit_code, completed=completed_steps,
                                  resubmits_left=opts.max_resubmits - resubmits,
                                  restarts_left=opts.max_restarts - restarts)
                attempt.decision = decision.reason
                if decision.next is Next.DONE:
                    if last.exit_code != 0:
                        out(f"attempt {attempt_no}: {decision.reason}")
                        last = dataclasses.replace(last, succeeded=True, exit_code=0, message="")
                    break
                if last.exit_code != EXIT_INTERRUPTED_RESUMABLE and not opts.echo_logs:
                    _show_failure(attempt_no, last, follower, out)
                if decision.next is Next.FAIL:
                    if last.exit_code not in (EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE):
                        out(f"attempt {attempt_no} {decision.reason}")
                    break
                if decision.next is Next.RESTART:
                    restarts += 1
                    attempt.cost = failure_cost(attempt.metrics, attempt.ended_at, None, [])
                else:
                    resubmits += 1
                if reclaimer is not None:
                    reclaimer.wait_for_restores()
                    reclaimer.restore_for_resubmit()
                out(f"attempt {attempt_no} {decision.reason}")
            completed = True
            result = dataclasses.replace(_result_of(job, attempts, last, reclaimer, storage), preflight=gate)
            if opts.keep_export_in is not None and result.summary is not None and result.summary.export:
                from cluster.keep_export import keep_export

                try:
                    result.export_kept = keep_export(storage, result.summary.export, opts.keep_export_in)
                except BackendError as e:  # the run is done; `ringtrain export` can make one again
                    out(f"warning: {e}")
            return result
        except KeyboardInterrupt:
            raise FlowInterrupted("interrupted: tearing down") from None
        finally:
            if reclaimer is not None:
                reclaimer.stop()
            if not opts.keep_up:
                _teardown(backend, completed, out)


def _preflight_gate(backend: Backend, job: JobSpec, opts: FlowOptions,
                    out: Callable[[str], None]) -> tuple[Attempt, JobResult, GateDecision]:
    """Run the elastic `job`'s preflight as a static job of its own and decide what the job does."""
    pre = preflight_job(job)
    started_at = time.time()
    handle = backend.submit(pre)
    hosts = list(handle.details.get("hosts", []))
    out(f"preflight: the allreduce test across {', '.join(hosts) or backend.name}, as a static job before "
        "the elastic one (a worker joining an elastic job cannot run it)")
    follower = _Follower(backend, handle, pre, dataclasses.replace(opts, progress_bar=False), out, None)
    try:
        follower.run()
        last = backend.wait(handle, timeout_s=follower.time_left())
    except BaseException:
        if not opts.keep_up:
            _cancel(backend, handle, out)
        raise
    attempt = _attempt_of(handle, last, hosts, started_at)
    nodes = handle.details.get("nodes", {})
    decision = decide_gate(last.exit_code, preflight_record(last.metrics), nodes, job)
    attempt.decision = decision.note or decision.failure
    out(f"preflight: {attempt.decision}")
    return attempt, last, decision


def _with_preflight_floor(backend: Backend, job: JobSpec) -> JobSpec:
    """The backend's busbw floor as the trainer's --preflight-min-busbw, unless the job sets one."""
    floor = backend.preflight_floor(job) if isinstance(backend, PreflightFloor) else None
    health = job.trainer.health
    if floor is None or health.preflight_min_busbw_gbps is not None:
        return job
    health = dataclasses.replace(health, preflight_min_busbw_gbps=float(f"{floor / 1e9:g}"))
    return dataclasses.replace(job, trainer=dataclasses.replace(job.trainer, health=health))


def _final_checkpoint_written(storage: Storage | None, job: JobSpec, last: JobResult) -> bool:
    """Did the job reach --steps with its final checkpoint written (its manifest there)? Then it is
    done whatever happened to a host afterwards. The summary answers when the attempt printed one;
    else the checkpoint store does."""
    steps = job.trainer.steps
    if last.summary is not None and last.summary.steps >= steps and not last.summary.interrupted:
        return True
    if storage is None:
        return False
    return checkpoint_manifest_exists(storage, steps)


def checkpoint_manifest_exists(storage: Storage, step: int) -> bool:
    """Whether the checkpoint of `step` is complete in the job's checkpoint store: its manifest, written
    after every object it lists (train/checkpoint.py), is there."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = storage_client(storage)
    bucket, _, prefix = storage.checkpoint_uri.removeprefix("s3://").partition("/")
    try:
        client.head_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{step_dir(step)}/{MANIFEST}")
        return True
    except (ClientError, BotoCoreError):
        return False


def _result_of(job: JobSpec, attempts: list[Attempt], last: JobResult, reclaimer: _Reclaimer | None,
               storage: Storage | None) -> FlowResult:
    message = last.message if not last.succeeded else ""
    if last.exit_code == EXIT_BAD_INPUT:
        message = f"bad input: {last.message}"
    return FlowResult(job=job.name, succeeded=last.succeeded, exit_code=last.exit_code,
                      attempts=attempts, summary=last.summary, metrics=last.metrics,
                      reclaimed=[r.host for r in reclaimer.reclaims] if reclaimer else [],
                      storage=storage, message=message,
                      reclaims=list(reclaimer.reclaims) if reclaimer else [])


@contextlib.contextmanager
def _ignore_interrupts():
    """Teardown must finish: a second Ctrl-C during it is ignored (it is bounded by timeouts)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
