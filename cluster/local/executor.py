"""Run a rendered MPIJob on the local hosts the way MPI Operator v0.8.2 runs it on Kubernetes.

    executor = LocalExecutor(hosts, workdir)
    launcher = executor.start(mpijob, output)   # worker pods, /etc/mpi, then the launcher container
    launcher.proc.wait()

What it reproduces (cluster/mpi_operator.py has the operator's side, with its sources):
- Worker pod i, `<job>-worker-<i>`, runs on one worker host: that host's sshd is restarted as the pod's,
  with the pod's hostname and the worker container's environment plus what the operator adds, and the
  pod's names (`<pod>.<job>.<ns>.svc`, `<pod>`) resolve in every namespace (/etc/hosts), as the job's
  headless Service makes them resolve on the cluster.
- The operator's ConfigMap, written in its format: `hostfile` (0444) and `discover_hosts.sh` (0555),
  which lists the Running worker pods and is rewritten whenever a host goes or comes back. In the
  launcher's namespace they are at /etc/mpi (`ip netns exec` binds /etc/netns/<ns>/mpi over it).
- The scheduler's part for the one constraint the flow adds: a host the worker template's node affinity
  excludes by name (matchFields metadata.name NotIn, cluster.mpijob.exclude_nodes_fields) gets no
  worker; a worker with no host left stays Pending (not started, not in discover_hosts.sh).
- launcherCreationPolicy WaitForWorkersReady: each worker's readiness probe (its tcpSocket port)
  passes before the launcher starts; AtStartup: the launcher starts at once.
- The launcher container runs on the launcher host (its own namespace, hostname `<job>-launcher`):
  the image's ENTRYPOINT followed by the container's `args`, exactly as rendered, with the container's
  `env` plus the operator's launcher variables over this machine's environment.

What this executor supplies itself, as the image and the kubelet would: the ENTRYPOINT is this
checkout's image/entrypoint.py run by this venv's Python (the Dockerfile's ENTRYPOINT is the same file
run by the image's venv); PATH starts with this venv's bin (the image's) and, before it, the `ssh`
wrapper holding the cluster's key (on the cluster the operator mounts the key at sshAuthMountPath).
Without root (loopback fallback) no namespace can hold /etc/mpi: the files live in the job's directory
and the launcher's arguments and environment name that directory instead of /etc/mpi; pod names
resolve through the ssh client's configuration instead of /etc/hosts. docs/ARCHITECTURE.md lists what
cannot be faithful locally.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import mpi_operator
from cluster.backend import BackendError
from cluster.local import network
from cluster.local.hosts import Host, LocalHosts, Pod
from cluster.mpijob import excluded_nodes, launcher_container, worker_container

REPO_ROOT = Path(__file__).resolve().parents[2]
# The image's ENTRYPOINT, as this checkout provides it (image/Dockerfile: ENTRYPOINT [python, entrypoint.py]).
IMAGE_ENTRYPOINT = (sys.executable, str(REPO_ROOT / "image" / "entrypoint.py"))
READY_TIMEOUT_S = 60.0


@dataclass
class RunningLauncher:
    """The launcher container of one MPIJob, running."""

    name: str
    proc: subprocess.Popen
    argv: list[str]             # the container's: the image's ENTRYPOINT and the rendered args
    command: list[str]          # what was started: argv on the launcher host (its namespace)
    env: dict[str, str]
    config_dir: Path
    remove_listener: Callable[[], None]


def volume_path(value: str, config_dir: Path | None) -> str:
    """`value` with the operator's /etc/mpi mount path pointing at `config_dir` (pure): the loopback
    fallback's stand-in for the mount; unchanged where the launcher's namespace has /etc/mpi."""
    if config_dir is None:
        return value
    mount = mpi_operator.CONFIG_MOUNT_PATH
    if value == mount or value.startswith(mount + "/"):
        return str(config_dir) + value[len(mount):]
    return value


def launcher_process(mpijob: Mapping[str, Any], environ: Mapping[str, str], path_prefix: Sequence[str],
                     config_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The launcher container's argv and environment (pure): the image's ENTRYPOINT, then the
    container's args; the container's env and the operator's launcher variables over `environ`, with
    `path_prefix` put before PATH. `config_dir` stands in for /etc/mpi where it cannot be mounted."""
    container = launcher_container(mpijob)
    if container.get("command"):
        raise BackendError("the launcher container overrides the image's ENTRYPOINT (`command`); "
                           "the rendered MPIJob sets `args` only")
    argv = [*IMAGE_ENTRYPOINT, *(volume_path(a, config_dir) for a in container["args"])]
    added = mpi_operator.container_env(container, mpi_operator.launcher_env(mpijob))
    env = {**environ, **{k: volume_path(v, config_dir) for k, v in added.items()}}
    env["PATH"] = os.pathsep.join([*path_prefix, env.get("PATH", os.defpath)])
    return argv, env


def worker_pods(mpijob: Mapping[str, Any], hosts: Sequence[Host]) -> dict[str, Pod]:
    """Worker pod i on the i-th host, live hosts first (pure); the pods' names and environment. Hosts the
    workers' node affinity excludes get none; workers left without a host stay Pending (none here)."""
    name = mpijob["metadata"]["name"]
    namespace = mpijob["metadata"]["namespace"]
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]
    replicas = int(worker["replicas"])
    excluded = excluded_nodes(worker["template"]["spec"])
    targets = [h for h in hosts if h.live and h.name not in excluded] + \
        [h for h in hosts if not h.live and h.name not in excluded]
    if replicas > len(targets) and not excluded:
        raise BackendError(f"MPIJob {name} has {replicas} workers but the local cluster {len(targets)} hosts")
    env = mpi_operator.container_env(worker_container(mpijob), mpi_operator.WORKER_ENV)
    pods = {}
    for i, host in enumerate(targets[:replicas]):
        pod = mpi_operator.worker_pod_name(name, i)
        pods[host.name] = Pod(hostname=pod, names=(mpi_operator.pod_fqdn(pod, name, namespace), pod),
                              env=tuple(sorted(env.items())))
    return pods


def _write(path: Path, text: str, mode: int) -> None:
    """Replace a ConfigMap file atomically (the kubelet swaps a ConfigMap volume's files atomically too)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


class LocalExecutor:
    """Runs MPIJob objects on LocalHosts; one launcher at a time per job name."""

    def __init__(self, hosts: LocalHosts, workdir: Path, log: Callable[[str], None] = print):
        self.hosts = hosts
        self.workdir = Path(workdir)
        self.log = log

    def config_dir(self) -> Path:
        """Where the job's /etc/mpi files are written: bound over /etc/mpi in the launcher's namespace."""
        launcher = self.hosts.launcher
        return network.etc_dir(launcher) / "mpi" if launcher else self.workdir / "etc-mpi"

    def start(self, mpijob: Mapping[str, Any], output: Any) -> RunningLauncher:
        """Create the worker pods and the job's ConfigMap, wait as the launcher creation policy says,
        then start the launcher container with its output to `output` (a file or subprocess.PIPE)."""
        name = mpijob["metadata"]["name"]
        pods = worker_pods(mpijob, self.hosts.hosts)
        self.hosts.run_pods(pods)
        config_dir = self.config_dir()
        config_dir.mkdir(parents=True, exist_ok=True)
        _write(config_dir / "hostfile", mpi_operator.hostfile(mpijob), mpi_operator.HOSTFILE_MODE)

        def discover() -> None:
            running = [h.pod.hostname for h in self.hosts.hosts if h.live and h.pod]
            _write(config_dir / "discover_hosts.sh", mpi_operator.discover_hosts(mpijob, running),
                   mpi_operator.DISCOVER_HOSTS_MODE)

        discover()
        remove_listener = self.hosts.on_change(discover)
        try:
            if mpijob["spec"].get("launcherCreationPolicy", "AtStartup") == "WaitForWorkersReady":
                self._wait_ready(mpijob, [h for h in self.hosts.hosts if h.pod])
            launcher = self.hosts.launcher
            keys = self.hosts.keys
            assert keys is not None
            path_prefix = [str(keys.bin_dir), str(Path(sys.executable).parent)]
            argv, env = launcher_process(mpijob, os.environ, path_prefix, None if launcher else config_dir)
            command = network.in_netns(launcher, argv, hostname=mpi_operator.launcher_pod_name(name)) \
                if launcher else argv
            proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace",
                                    start_new_session=True)
        except BaseException:
            remove_listener()
            raise
        return RunningLauncher(name=name, proc=proc, argv=argv, command=command, env=env,
                               config_dir=config_dir, remove_listener=remove_listener)

    def _wait_ready(self, mpijob: Mapping[str, Any], hosts: Sequence[Host]) -> None:
        """Each worker's readiness probe, as the kubelet runs it: a TCP connect to its tcpSocket port."""
        probe = worker_container(mpijob).get("readinessProbe", {}).get("tcpSocket")
        if not probe:
            return
        deadline = time.monotonic() + READY_TIMEOUT_S
        for host in hosts:
            while True:
                try:
                    with socket.create_connection((host.address, int(probe["port"])), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        pod = host.pod.hostname if host.pod else host.name
                        raise BackendError(f"worker {pod} did not become ready (port {probe['port']}) "
                                           f"within {READY_TIMEOUT_S:g}s") from None
                    time.sleep(0.1)
