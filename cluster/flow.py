"""The one flow every backend runs.

    up -> storage -> dataset -> submit -> follow -> (resume) -> summary -> down

    result = run_job(backend, job, FlowOptions(...))

A job that ends with exit code 75 (interrupted by SIGTERM after a checkpoint: a spot reclaim) is
submitted again and the trainer resumes from its latest checkpoint, up to `max_resubmits` times.
Teardown (`backend.down()`) always runs, on errors and on Ctrl-C / SIGTERM too, unless the caller
asked to keep the cluster up.

Fault injection (`reclaim_at_step`) needs a backend with `reclaim(host)` / `restore(host)` and
`progress(handle)`; the local backend has them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.backend import Backend, BackendError, JobHandle, JobResult, Storage
from cluster.job import JobSpec
from train.contract import EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE
from train.summary import RunSummary

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DatasetSpec:
    """The generated dataset written into the datasets bucket if it is not there yet."""

    shards: int = 4
    samples_per_shard: int = 1024
    seed: int = 0


@dataclass(frozen=True)
class FlowOptions:
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    max_resubmits: int = 3
    reclaim_at_step: int | None = None     # fault injection: reclaim a host once this step is reached
    reclaim_host: str | None = None        # default: the last live host
    restore_after_s: float | None = None   # bring it back this long after the reclaim (None: before resubmit)
    keep_up: bool = False
    progress_bar: bool = True
    echo_logs: bool = False                # every line of the job's output, not only the trainer's messages
    job_timeout_s: float = 1800.0
    poll_s: float = 0.25


@dataclass
class Attempt:
    exit_code: int | None
    summary: RunSummary | None
    hosts: list[str]
    message: str = ""


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

    @property
    def resumed(self) -> bool:
        return any(a.summary is not None and a.summary.resumed_from_step is not None
                   for a in self.attempts[1:])


class FlowInterrupted(Exception):
    """Ctrl-C or SIGTERM while the flow ran; teardown has run."""


def trainer_args_for(job: JobSpec, storage: Storage) -> tuple[str, ...]:
    """The job's trainer arguments plus where its data and checkpoints live (pure)."""
    args = list(job.trainer_args)
    present = set(args)
    if "--data" not in present:
        args += ["--data", storage.dataset_uri]
    if "--checkpoint-dir" not in present:
        args += ["--checkpoint-dir", storage.checkpoint_uri]
    if storage.endpoint_url and "--s3-endpoint-url" not in present:
        args += ["--s3-endpoint-url", storage.endpoint_url]
    if job.elastic and "--elastic" not in present:
        args.append("--elastic")
    # The flow draws its own progress bar from the metrics; a tqdm bar per attempt would garble the log.
    if "--no-progress" not in present:
        args.append("--no-progress")
    return tuple(args)


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
    for i, a in enumerate(result.attempts, 1):
        where = a.summary.resumed_from_step if a.summary else None
        start = f"resumed from step {where}" if where is not None else "from scratch"
        end = ("interrupted (resumable)" if a.exit_code == EXIT_INTERRUPTED_RESUMABLE
               else f"exit {a.exit_code}")
        lines.append(f"  attempt {i}: {start}, reached step {a.summary.steps if a.summary else '?'}, {end}, "
                     f"hosts {', '.join(a.hosts) or '?'}"
                     + (f", elastic resets {a.summary.elastic_resets}"
                        if a.summary and a.summary.elastic_resets else ""))
    if result.reclaimed:
        lines.append(f"  reclaimed          {', '.join(result.reclaimed)}")
    if result.message:
        lines.append(f"  {result.message}")
    return "\n".join(lines)


def ensure_dataset(storage: Storage, spec: DatasetSpec, out: Callable[[str], None] = print,
                   timeout_s: float = 600) -> bool:
    """Write the generated dataset to storage.dataset_uri unless its index is there. True if written."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = storage.dataset_uri.removeprefix("s3://").partition("/")
    env = storage.env
    client = boto3.client(
        "s3", endpoint_url=storage.endpoint_url,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        region_name=env.get("AWS_DEFAULT_REGION"),
    )
    try:
        client.head_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/index.json")
        out(f"dataset {storage.dataset_uri} is there")
        return False
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise BackendError(f"cannot read {storage.dataset_uri}: {e}") from e
    except BotoCoreError as e:
        raise BackendError(f"cannot reach the object store at {storage.endpoint_url}: {e}") from e
    out(f"writing dataset {storage.dataset_uri} ({spec.shards} shards x {spec.samples_per_shard} samples)")
    cmd = [sys.executable, "-m", "train.data", "generate", "--out", storage.dataset_uri,
           "--shards", str(spec.shards), "--samples-per-shard", str(spec.samples_per_shard),
           "--seed", str(spec.seed)]
    import os

    env_all = {**os.environ, **env}
    if storage.endpoint_url:
        env_all["AWS_ENDPOINT_URL"] = storage.endpoint_url
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=env_all, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BackendError(f"dataset generation did not finish within {timeout_s:g}s") from None
    if done.returncode != 0:
        raise BackendError(f"dataset generation failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
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


class _Follower:
    """Follows one attempt: echoes log lines, draws progress, fires the planned reclaim."""

    def __init__(self, backend: Backend, handle: JobHandle, job: JobSpec, opts: FlowOptions,
                 out: Callable[[str], None], reclaim: Callable[[], None] | None):
        self.backend, self.handle, self.job, self.opts, self.out = backend, handle, job, opts, out
        self.reclaim = reclaim
        self.fault_thread: threading.Thread | None = None   # the reclaim, once fired
        self.bar = None
        self._done = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=25)
        self._log_thread = threading.Thread(target=self._echo, daemon=True)

    def _write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            self.out(text)

    def _echo(self) -> None:
        try:
            for line in self.backend.logs(self.handle):
                self.tail.append(line)
                if self.opts.echo_logs or is_trainer_message(line):
                    self._write(f"  | {line}")
        finally:
            self._done.set()

    def run(self, total_steps: int | None) -> None:
        progress = getattr(self.backend, "progress", None)
        if self.opts.progress_bar and progress is not None and total_steps:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, unit="step", desc=self.job.name, dynamic_ncols=True,
                            file=sys.stderr, mininterval=0.5)
        self._log_thread.start()
        deadline = time.monotonic() + self.opts.job_timeout_s
        try:
            while not self._done.wait(self.opts.poll_s):
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"job {self.job.name} did not finish within {self.opts.job_timeout_s:g}s")
                rec = progress(self.handle) if progress is not None else None
                if rec is None:
                    continue
                step = int(rec.get("step", 0))
                if self.bar is not None and step != self.bar.n:
                    self.bar.n = step
                    self.bar.set_postfix(loss=f"{rec.get('loss', float('nan')):.4f}",
                                         workers=rec.get("world_size", "?"), refresh=False)
                    self.bar.refresh()
                if self.reclaim is not None and self.opts.reclaim_at_step is not None \
                        and step >= self.opts.reclaim_at_step:
                    fire, self.reclaim = self.reclaim, None
                    # In a thread: the reclaim waits out the workers' grace period while we follow on.
                    self.fault_thread = threading.Thread(target=fire, name="reclaim", daemon=True)
                    self.fault_thread.start()
        finally:
            if self.bar is not None:
                self.bar.close()
                self.bar = None


def _steps_of(job: JobSpec) -> int | None:
    args = list(job.trainer_args)
    if "--steps" in args:
        i = args.index("--steps")
        if i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
    return None


def run_job(backend: Backend, job: JobSpec, opts: FlowOptions | None = None,
            out: Callable[[str], None] = print) -> FlowResult:
    """Run `job` on `backend` from stand-up to teardown; see the module docstring."""
    opts = opts or FlowOptions()
    injects = opts.reclaim_at_step is not None
    fault_api = ("reclaim", "restore", "progress", "live_host_names")
    if injects and not all(hasattr(backend, a) for a in fault_api):
        raise BackendError(f"the {backend.name} backend cannot inject faults (reclaim/restore); "
                           "drop the reclaim option")
    attempts: list[Attempt] = []
    reclaimed: list[str] = []
    storage: Storage | None = None
    last: JobResult | None = None
    restore_threads: list[threading.Thread] = []
    fault_threads: list[threading.Thread] = []
    stopping = threading.Event()   # tells a pending delayed restore not to start once we tear down
    completed = False
    with _signals_raise_interrupt():
        try:
            backend.up()
            storage = backend.storage(job.name)
            ensure_dataset(storage, opts.dataset, out=out)
            job = dataclasses.replace(job, trainer_args=trainer_args_for(job, storage),
                                      env={**storage.env, **job.env})
            total = _steps_of(job)

            def do_reclaim() -> None:
                live = backend.live_host_names()  # type: ignore[attr-defined]
                host = opts.reclaim_host or (live[-1] if live else None)
                if host is None:
                    return
                out(f"fault injection: reclaiming {host} (spot-style: SIGTERM, then the host goes away)")
                try:
                    backend.reclaim(host)  # type: ignore[attr-defined]
                except BackendError as e:
                    out(f"fault injection failed: {e}")
                    return
                reclaimed.append(host)
                if opts.restore_after_s is not None:
                    def later() -> None:
                        if stopping.wait(opts.restore_after_s):
                            return
                        with contextlib.suppress(BackendError):
                            backend.restore(host)  # type: ignore[attr-defined]
                    t = threading.Thread(target=later, name="restore", daemon=True)
                    restore_threads.append(t)
                    t.start()

            for attempt_no in range(1, opts.max_resubmits + 2):
                handle = backend.submit(job)
                hosts = list(handle.details.get("hosts", []))
                out(f"attempt {attempt_no}: submitted {job.name} on {', '.join(hosts) or backend.name}")
                follower = _Follower(backend, handle, job, opts, out,
                                     do_reclaim if injects and not fault_threads else None)
                try:
                    follower.run(total)
                finally:
                    if follower.fault_thread is not None:
                        fault_threads.append(follower.fault_thread)
                last = backend.wait(handle, timeout_s=opts.job_timeout_s)
                # The job may end before the reclaim has finished taking the host away.
                for t in fault_threads:
                    t.join(timeout=300)
                attempts.append(Attempt(last.exit_code, last.summary, hosts, last.message))
                if last.exit_code not in (0, EXIT_INTERRUPTED_RESUMABLE) and not opts.echo_logs:
                    out(f"attempt {attempt_no} failed (exit code {last.exit_code}); its last output:")
                    for line in without_launcher_traceback(list(follower.tail)):
                        out(f"  | {line}")
                if last.exit_code != EXIT_INTERRUPTED_RESUMABLE:
                    break
                for t in restore_threads:
                    t.join(timeout=(opts.restore_after_s or 0) + 60)
                if attempt_no > opts.max_resubmits:
                    break
                # A spot node group replaces a reclaimed node; here the reclaimed host comes back.
                for host in reclaimed:
                    if host not in backend.live_host_names():  # type: ignore[attr-defined]
                        backend.restore(host)  # type: ignore[attr-defined]
                out(f"attempt {attempt_no} was interrupted after a checkpoint: resubmitting to resume")
            assert last is not None
            message = last.message if not last.succeeded else ""
            if last.exit_code == EXIT_BAD_INPUT:
                message = f"bad input: {last.message}"
            completed = True
            return FlowResult(job=job.name, succeeded=last.succeeded, exit_code=last.exit_code,
                              attempts=attempts, summary=last.summary, metrics=last.metrics,
                              reclaimed=reclaimed, storage=storage, message=message)
        except KeyboardInterrupt:
            raise FlowInterrupted("interrupted: tearing down") from None
        finally:
            stopping.set()
            for t in fault_threads + restore_threads:
                t.join(timeout=60)
            if not opts.keep_up:
                with _ignore_interrupts():
                    try:
                        backend.down()
                    except Exception as e:
                        if completed:
                            raise
                        # Already failing: report the teardown problem, keep the original error.
                        out(f"teardown after the failure also failed: {e}")


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
