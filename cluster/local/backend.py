"""The local backend: a real cluster on this machine.

    up()      worker hosts (network namespaces reached over ssh, or localhost processes without
              root), an S3-compatible store (moto server) on the address the hosts reach, and the
              same two buckets the AWS stack creates: <prefix>-datasets, <prefix>-checkpoints
    render()  the job as the MPIJob EKS would run (cluster.mpijob.render_mpijob, the one rendering),
              with this cluster's parameters (its store, its interface, its sshd port)
    submit()  renders the job and runs that object with the local executor (cluster/local/executor.py):
              worker pods on the hosts, the operator's /etc/mpi files, the launcher container's
              command and environment on the launcher host; horovodrun reaches the workers by ssh
    wait()    the job's exit code through cluster.exit_codes, the mapping the AWS backend uses
    reclaim() / restore()   spot-style fault injection on one host
    down()    stops every process it started, removes namespaces, bridge, store and temp dir

Everything lives under one temporary directory, removed by down().
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from cluster.backend import Backend, BackendError, JobHandle, JobResult, Storage
from cluster.exit_codes import failure_message, job_exit_code
from cluster.job import JobSpec
from cluster.launch import BLACKLIST_COOLDOWN_S
from cluster.local import procs, reaper
from cluster.local.executor import LocalExecutor, RunningLauncher
from cluster.local.hosts import HostError, LocalHosts
from cluster.local.network import NetworkSetupError
from cluster.local.objectstore import ObjectStore, free_port
from cluster.local.ssh import SshSetupError
from cluster.mpijob import SYSTEM_NODES, WorkerNodes, render_mpijob, shm_size_limit
from infra.storage_layout import bucket_names, checkpoint_uri, dataset_uri
from train.contract import cores_per_worker
from train.summary import last_summary

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the rendered MPIJob names where EKS would name the stack's: the same namespace and service
# account (infra/platform.py), and an image tag standing for this checkout (nothing is pulled).
LOCAL_NAMESPACE = "training"
LOCAL_SERVICE_ACCOUNT = "trainer"
LOCAL_IMAGE = "ringtrain-local:checkout"
# `--fault slow-link`: the host's link capped at 10 Mbit/s (1.25 MB/s) both ways.
SLOW_LINK_RATE = "10mbit"
# The preflight's allreduce busbw floor on local hosts, bytes/s. Gloo over the bridge moved 16 MB/s at
# 1 MiB and 160-210 MB/s at 8 MiB between two ranks on this project's 2-core machine with every core
# busy with other work (2026-12-06); the slow link moves 1.25 MB/s. 5 MB/s is 3x under the first and
# 4x over the second.
LOCAL_PREFLIGHT_FLOOR = 5e6


def storage_for(prefix: str, job_name: str, dataset: str, endpoint_url: str | None,
                env: dict[str, str]) -> Storage:
    datasets, checkpoints = bucket_names(prefix)
    return Storage(dataset_uri=dataset_uri(datasets, dataset),
                   checkpoint_uri=checkpoint_uri(checkpoints, job_name),
                   endpoint_url=endpoint_url, env=dict(env))


def local_worker_nodes(cpus: int, memory_bytes: int) -> WorkerNodes:
    """The local hosts as the renderer's worker nodes: no GPUs or EFA; the machine's memory and cores,
    which every host shares (nothing enforces these locally)."""
    gib = max(1, memory_bytes // 2 ** 30)
    return WorkerNodes(node_group="local", instance_types=("local",), gpus_per_node=0, efa_interfaces=0,
                       capacity_type="ON_DEMAND", memory_limit=f"{gib}Gi", cpu_request=str(cpus),
                       shm_size_limit=shm_size_limit(gib))


@dataclasses.dataclass
class _RunningJob:
    launcher: RunningLauncher
    lines: list[str]
    queue: queue.Queue
    reader: threading.Thread
    metrics_file: Path
    log_file: Path

    @property
    def proc(self) -> subprocess.Popen:
        return self.launcher.proc


class LocalBackend(Backend):
    name = "local"

    def __init__(self, num_hosts: int = 2, *, slots_per_host: int = 1, isolated: bool | None = None,
                 prefix: str = "ringtrain-local", dataset: str = "demo", reclaim_grace_s: float = 10.0,
                 reclaim_notice_s: float = 0.0, log: Callable[[str], None] = print):
        self.prefix = prefix
        self.dataset = dataset
        self.reclaim_grace_s = reclaim_grace_s
        self.reclaim_notice_s = reclaim_notice_s
        self.log = log
        self._num_hosts = num_hosts
        self._slots = slots_per_host
        self._isolated = isolated
        self.workdir: Path | None = None
        self.hosts: LocalHosts | None = None
        self.store: ObjectStore | None = None
        self._jobs: dict[str, _RunningJob] = {}
        self._submissions = 0

    # ------------------------------------------------------------------ lifecycle
    def up(self) -> None:
        if self.hosts is not None:
            return
        reaper.reap_stale_clusters(self.log)
        self.workdir = Path(tempfile.mkdtemp(prefix=reaper.WORKDIR_PREFIX))
        try:
            reaper.write_owner(self.workdir)
            self.hosts = LocalHosts(num_hosts=self._num_hosts, workdir=self.workdir / "cluster",
                                    slots_per_host=self._slots, isolated=self._isolated, log=self.log)
            self.hosts.up()
            if not self.hosts.isolated and self.hosts.fallback_reason:
                self.log(f"local backend: no network namespaces ({self.hosts.fallback_reason}); "
                         "falling back to worker hosts as processes on localhost")
            self.store = ObjectStore(host=self.hosts.driver_address)
            self.store.port = free_port(self.store.host)
            reaper.write_owner(self.workdir, (self.store.host, self.store.port))
            self.store.start()
            client = self.store.client()
            for bucket in bucket_names(self.prefix):
                client.create_bucket(Bucket=bucket)
        except (HostError, NetworkSetupError, SshSetupError, RuntimeError, OSError) as e:
            self.down()
            raise BackendError(f"local cluster did not come up: {e}") from e
        except BaseException:
            self.down()
            raise
        self.log(f"local cluster up: {self.hosts.describe()}; object store {self.store.endpoint_url}; "
                 f"work dir {self.workdir}")

    def down(self) -> None:
        errors = []
        for name in list(self._jobs):
            job = self._jobs.pop(name)
            procs.stop_popen_tree(job.proc)
            job.launcher.remove_listener()
            job.reader.join(timeout=10)
        if self.hosts is not None:
            try:
                self.hosts.down()
            except Exception as e:
                errors.append(str(e))
            self.hosts = None
        if self.store is not None:
            self.store.stop()
            self.store = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        if errors:
            raise BackendError("; ".join(errors))

    # ------------------------------------------------------------------ storage
    def storage(self, job_name: str) -> Storage:
        store = self._store()
        return storage_for(self.prefix, job_name, self.dataset, store.endpoint_url, store.env())

    # ------------------------------------------------------------------ jobs
    def render(self, job: JobSpec) -> dict:
        """The MPIJob this backend runs for `job`: the AWS backend's rendering with this cluster's
        parameters (storage, network interface, sshd port, the machine as the worker nodes)."""
        hosts = self._hosts()
        keys = hosts.keys
        assert keys is not None
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return render_mpijob(job, image=LOCAL_IMAGE, storage=self.storage(job.name),
                             namespace=LOCAL_NAMESPACE, service_account=LOCAL_SERVICE_ACCOUNT,
                             workers=local_worker_nodes(len(os.sched_getaffinity(0)), memory),
                             launcher=SYSTEM_NODES, network_interface=hosts.iface, ssh_port=keys.port,
                             blacklist_cooldown_s=BLACKLIST_COOLDOWN_S)

    def submit(self, job: JobSpec) -> JobHandle:
        hosts = self._hosts()
        live = hosts.live()
        if not live:
            raise BackendError("no live hosts to run on (all reclaimed); restore one first")
        if job.name in self._jobs and self._jobs[job.name].proc.poll() is None:
            raise BackendError(f"job {job.name!r} is still running")
        if not job.elastic and len(live) < job.num_hosts:
            self.log(f"only {len(live)} of {job.num_hosts} hosts are up: running {job.name} on {len(live)}")
            job = dataclasses.replace(job, num_hosts=len(live), min_hosts=None)
        self._submissions += 1
        jobdir = self._workdir() / "jobs" / f"{job.name}-{self._submissions}"
        jobdir.mkdir(parents=True)
        trainer = job.trainer
        metrics_file = jobdir / "metrics.jsonl"
        if trainer.metrics.metrics_file is None:
            trainer = dataclasses.replace(trainer, metrics=dataclasses.replace(trainer.metrics,
                                                                               metrics_file=str(metrics_file)))
        # Local hosts are namespaces on one machine: all of the job's workers share its cores (the
        # trainer alone would only divide a host's cores among that host's workers).
        threads = cores_per_worker(len(os.sched_getaffinity(0)), job.num_procs)
        env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", **job.env}
        job = dataclasses.replace(job, trainer=trainer, env=env)
        mpijob = self.render(job)
        (jobdir / "mpijob.json").write_text(json.dumps(mpijob, indent=2))
        log_file = jobdir / "output.log"
        try:
            launcher = LocalExecutor(hosts, jobdir, self.log).start(mpijob, subprocess.PIPE)
        except (HostError, NetworkSetupError, OSError) as e:
            raise BackendError(f"could not start job {job.name}: {e}") from e
        (jobdir / "command.json").write_text(json.dumps(launcher.argv))
        proc = launcher.proc
        lines: list[str] = []
        q: queue.Queue = queue.Queue()

        def read() -> None:
            with open(log_file, "w") as f:
                for line in proc.stdout:
                    line = line.rstrip("\n")
                    lines.append(line)
                    f.write(line + "\n")
                    f.flush()
                    q.put(line)
            q.put(None)

        reader = threading.Thread(target=read, name=f"logs-{job.name}", daemon=True)
        reader.start()
        self._jobs[job.name] = _RunningJob(launcher, lines, q, reader, metrics_file, log_file)
        return JobHandle(name=job.name, backend=self.name,
                         details={"command": launcher.argv, "process": launcher.command, "mpijob": mpijob,
                                  "log_file": str(log_file),
                                  "metrics_file": str(metrics_file), "elastic": job.elastic,
                                  "hosts": [h.name for h in hosts.hosts if h.pod],
                                  "nodes": {h.pod.hostname: h.name for h in hosts.hosts if h.pod}})

    def logs(self, handle: JobHandle) -> Iterator[str]:
        job = self._job(handle)
        while True:
            line = job.queue.get()
            if line is None:
                job.queue.put(None)  # a second reader ends too
                return
            yield line

    def progress(self, handle: JobHandle) -> dict | None:
        """The trainer's latest metrics record (step, loss, samples_per_sec, world_size), if any."""
        records = _read_metrics(self._job(handle).metrics_file, last_only=True)
        return records[-1] if records else None

    def wait(self, handle: JobHandle, timeout_s: float | None = None) -> JobResult:
        job = self._job(handle)
        try:
            rc = job.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BackendError(f"job {handle.name} still running after {timeout_s:g}s") from None
        job.reader.join(timeout=30)
        job.launcher.remove_listener()
        summary = last_summary(job.lines)
        code = job_exit_code(rc, job.lines)
        message = "" if code == 0 else failure_message(code, job.lines)
        return JobResult(name=handle.name, succeeded=code == 0, exit_code=code, summary=summary,
                         metrics=_read_metrics(job.metrics_file), message=message)

    def cancel(self, handle: JobHandle) -> None:
        procs.stop_popen_tree(self._job(handle).proc)

    def preflight_floor(self, job: JobSpec) -> float | None:
        """The allreduce busbw floor (bytes/s) this cluster's links must reach (train/preflight.py)."""
        return LOCAL_PREFLIGHT_FLOOR

    # ------------------------------------------------------------------ fault injection
    def host_names(self) -> list[str]:
        return [h.name for h in self._hosts().hosts]

    def live_host_names(self) -> list[str]:
        return [h.name for h in self._hosts().live()]

    def reclaim(self, host: str, grace_s: float | None = None, notice_s: float | None = None) -> None:
        try:
            self._hosts().reclaim(host, self.reclaim_grace_s if grace_s is None else grace_s,
                                  self.reclaim_notice_s if notice_s is None else notice_s)
        except HostError as e:
            raise BackendError(str(e)) from e

    def kill(self, host: str) -> None:
        try:
            if not self._hosts().kill(host):
                raise BackendError(f"kill {host}: no worker process on it")
        except HostError as e:
            raise BackendError(str(e)) from e

    def freeze(self, host: str) -> None:
        try:
            if not self._hosts().freeze(host):
                raise BackendError(f"hang {host}: no worker process on it")
        except HostError as e:
            raise BackendError(str(e)) from e

    def slow_link(self, host: str) -> None:
        try:
            self._hosts().slow_link(host, SLOW_LINK_RATE)
        except (HostError, NetworkSetupError, ValueError) as e:
            raise BackendError(f"slow link {host}: {e}") from e

    def restore(self, host: str) -> None:
        try:
            self._hosts().restore(host)
        except (HostError, NetworkSetupError) as e:
            raise BackendError(f"could not restore {host}: {e}") from e

    def describe(self) -> str:
        hosts, store = self._hosts(), self._store()
        lines = [f"hosts: {hosts.describe()}"]
        for h in hosts.hosts:
            state = "up" if h.live else "reclaimed"
            lines.append(f"  {h.name}  {h.address}  {state}  ssh: {' '.join(hosts.ssh_command(h.name))}")
        lines.append(f"object store: {store.endpoint_url}  buckets: {', '.join(bucket_names(self.prefix))}")
        if hosts.launcher is not None:
            lines.append(f"launcher host: {hosts.launcher.address} (namespace {hosts.launcher.netns})")
        return "\n".join(lines)

    # ------------------------------------------------------------------ internals
    def _hosts(self) -> LocalHosts:
        if self.hosts is None:
            raise BackendError("the local cluster is not up (call up() first)")
        return self.hosts

    def _store(self) -> ObjectStore:
        if self.store is None:
            raise BackendError("the local cluster is not up (call up() first)")
        return self.store

    def _workdir(self) -> Path:
        if self.workdir is None:
            raise BackendError("the local cluster is not up (call up() first)")
        return self.workdir

    def _job(self, handle: JobHandle) -> _RunningJob:
        try:
            return self._jobs[handle.name]
        except KeyError:
            raise BackendError(f"no job {handle.name!r} on this local cluster") from None


def _read_metrics(path: Path, last_only: bool = False) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if last_only:
        lines = lines[-2:]  # the very last one may be half-written
    records = []
    for ln in lines:
        try:
            records.append(json.loads(ln))
        except json.JSONDecodeError:
            continue
    return records
