"""The local hosts: worker hosts (nodes), each a network host with its own sshd, and the launcher host.

    with LocalHosts(num_hosts=2, workdir=tmp) as hosts:
        hosts.live()                      # hosts that are up now
        hosts.run_pods({"host-0": Pod(...)})  # a job's worker pods: name, environment
        hosts.reclaim("host-1", grace_s)  # spot reclaim: SIGTERM its workers, then the host goes away
        hosts.restore("host-1")           # a replacement node with the same name and address

A worker host runs at most one worker pod at a time: its sshd, started with the pod's hostname and
environment, and resolvable in every namespace under the pod's names (`<pod>.<job>.<ns>.svc`), as the
job's headless Service makes it on Kubernetes. Listeners added with `on_change` hear when the set of
running hosts changes (the local executor rewrites the operator's discover_hosts.sh then).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from cluster.local import network, procs, reaper, ssh
from cluster.local.network import HostPlan, NetworkPlan
from train.contract import cpu_share


class HostError(RuntimeError):
    """A worker host could not be started, found, reclaimed or restored."""


@dataclass(frozen=True)
class Pod:
    """A worker pod placed on a host: its hostname, the names it resolves under, its container's env."""

    hostname: str
    names: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def pick_port(addresses: list[str], start: int = 20000, end: int = 60000, tries: int = 50) -> int:
    """A TCP port free on every given address (the same sshd port on all hosts, as on a cluster)."""
    import random

    rng = random.Random()
    for _ in range(tries):
        port = rng.randrange(start, end)
        if all(_port_free(a, port) for a in addresses):
            return port
    raise HostError(f"no TCP port free on all of {addresses} after {tries} tries")


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


@dataclass
class Host:
    plan: HostPlan
    slots: int
    # This host's share of the machine's cores: a machine of its own, as far as the CPU goes (the
    # trainer pins its workers within it). None when the machine has fewer cores than hosts.
    cpus: tuple[int, ...] | None = None
    sshd: subprocess.Popen | None = None
    live: bool = False
    pod: Pod | None = None      # the worker pod this host runs (its sshd is the pod's)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def address(self) -> str:
        return self.plan.address

    def environment(self) -> dict[str, str] | None:
        """The environment its sshd starts with: the pod's container env over this machine's, if it runs
        a pod (None: inherit). As in a pod, sshd does not pass it on to the sessions it opens."""
        return {**os.environ, **dict(self.pod.env)} if self.pod else None


@dataclass
class LocalHosts:
    """N worker hosts on this machine; `isolated=None` picks namespaces when possible."""

    num_hosts: int
    workdir: Path
    slots_per_host: int = 1
    isolated: bool | None = None
    log: Callable[[str], None] = print
    startup_timeout_s: float = 30.0
    plan: NetworkPlan | None = None
    fallback_reason: str = ""
    keys: ssh.SshKeys | None = None
    hosts: list[Host] = field(default_factory=list)
    mpi_mount: network.MountPoint | None = None
    _listeners: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _closed: bool = False   # set by down(): a late restore() must not rebuild a host

    # ---------------------------------------------------------------- lifecycle
    def up(self) -> LocalHosts:
        if self.plan is not None:
            return self
        if not 1 <= self.num_hosts <= 200:
            raise HostError(f"num_hosts={self.num_hosts}: must be between 1 and 200")
        ssh.check_ssh_tools()
        if self.isolated is None:
            self.isolated, self.fallback_reason = network.namespaces_available()
        elif self.isolated:
            ok, why = network.namespaces_available()
            if not ok:
                raise HostError(f"isolated hosts need network namespaces: {why}")
        try:
            self.plan = (network.claim_subnet(self.num_hosts) if self.isolated
                         else network.loopback_plan(self.num_hosts))
            self.workdir.mkdir(parents=True, exist_ok=True)
            reaper.write_plan(self.workdir, self.plan)  # so a dead owner's cluster can be found and reaped
            port = 22 if self.isolated else pick_port([h.address for h in self.plan.hosts])
            self.keys = ssh.create_keys(self.workdir / "ssh", port)
            machine = sorted(os.sched_getaffinity(0))
            self.hosts = [Host(plan=h, slots=self.slots_per_host, cpus=cpu_share(machine, i, self.num_hosts))
                          for i, h in enumerate(self.plan.hosts)]
            if self.plan.launcher is not None:
                # The launcher pod's node: its own namespace on the bridge, where /etc/mpi can be mounted.
                self.mpi_mount = network.claim_mount_point(network.CONFIG_MOUNT_PATH)
                reaper.write_plan(self.workdir, self.plan, created_mount_point=self.mpi_mount.created)
                network.create_host_netns(self.plan, self.plan.launcher, self._hosts_file())
            for host in self.hosts:
                self._start_host(host)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every host and remove namespaces, veths and the bridge. Safe to call twice."""
        with self._lock:
            self._closed = True
        errors = []
        for host in self.hosts:
            try:
                self._stop_host(host)
            except Exception as e:  # keep tearing down the rest
                errors.append(f"{host.name}: {e}")
        if self.plan is not None and self.plan.launcher is not None:
            try:
                network.delete_host_netns(self.plan.launcher)
            except Exception as e:
                errors.append(f"launcher: {e}")
        if self.mpi_mount is not None:
            self.mpi_mount.release()
            self.mpi_mount = None
        if self.plan is not None and self.plan.isolated:
            try:
                network.delete_bridge(self.plan)
            except Exception as e:
                errors.append(f"bridge {self.plan.bridge}: {e}")
        if errors:
            raise HostError("teardown incomplete: " + "; ".join(errors))

    def __enter__(self) -> LocalHosts:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---------------------------------------------------------------- queries
    @property
    def iface(self) -> str:
        """The interface Horovod talks over, the same name on launcher and workers (eth0, or lo)."""
        return self._plan().pod_iface

    @property
    def driver_address(self) -> str:
        return self._plan().driver_address

    @property
    def launcher(self) -> HostPlan | None:
        """The launcher's namespace; None in the loopback fallback (the launcher runs on localhost)."""
        return self._plan().launcher

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (under the hosts' lock) whenever a host starts or stops; returns a remover."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)
        return remove

    def run_pods(self, pods: dict[str, Pod]) -> None:
        """Place a job's worker pods (host name -> pod; every other host runs none): the names resolve in
        every namespace, and each live host's sshd is restarted as its pod's (hostname, environment)."""
        unknown = [name for name in pods if name not in [h.name for h in self.hosts]]
        if unknown:
            raise HostError(f"no host {', '.join(unknown)} (hosts: {', '.join(h.name for h in self.hosts)})")
        with self._lock:
            for host in self.hosts:
                host.pod = pods.get(host.name)
            self._write_hosts_files()
        for host in self.hosts:
            if host.live:
                self._stop_host(host, keep_namespace=True)
                self._start_host(host)

    def live(self) -> list[Host]:
        return [h for h in self.hosts if h.live]

    def get(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name or h.address == name:
                return h
        raise HostError(f"no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def describe(self) -> str:
        if self.isolated:
            kind = f"network namespaces on bridge {self._plan().bridge} ({self._plan().cidr})"
        else:
            kind = f"processes on localhost (loopback addresses; {self.fallback_reason or 'requested'})"
        return f"{len(self.hosts)} hosts as {kind}"

    def ssh_command(self, host: str) -> list[str]:
        h = self.get(host)
        return [str(self._keys().bin_dir / "ssh"), h.address]

    def names(self) -> dict[str, str]:
        """Every pod name -> the address it resolves to (for the ssh client where no /etc/hosts can)."""
        return {name: h.address for h in self.hosts if h.pod for name in h.pod.names}

    def host_processes(self, host: Host) -> list[psutil.Process]:
        """Everything running on a host: its sshd, its sessions, the workers under them."""
        found: dict[int, psutil.Process] = {}
        if host.sshd is not None and host.sshd.poll() is None:
            with contextlib.suppress(psutil.Error):
                found[host.sshd.pid] = psutil.Process(host.sshd.pid)
            for p in procs.descendants(host.sshd.pid):
                found[p.pid] = p
        if host.plan.netns and network.netns_exists(host.plan.netns):
            for pid in network.netns_pids(host.plan.netns):
                with contextlib.suppress(psutil.Error):
                    found.setdefault(pid, psutil.Process(pid))
        return list(found.values())

    def workers_on(self, host: Host) -> list[psutil.Process]:
        return procs.worker_processes(self.host_processes(host))

    # ---------------------------------------------------------------- fault injection
    def reclaim(self, name: str, grace_s: float = 10.0, notice_s: float = 0.0) -> None:
        """Spot reclaim: the host leaves discovery, `notice_s` later its workers get SIGTERM, and after
        at most `grace_s` more the host goes away.

        `notice_s` models EC2's interruption notice: a node that is being drained stops being listed
        as a ready worker before its pods are signalled, so an elastic job can shrink around it.
        """
        host = self.get(name)
        if not host.live:
            raise HostError(f"{host.name} is not up")
        with self._lock:
            host.live = False
            self._changed()   # the node leaves the cluster's host list at once
        if notice_s > 0:
            self.log(f"reclaim {host.name} ({host.address}): interruption notice, out of discovery; "
                     f"SIGTERM in {notice_s:g}s")
            time.sleep(notice_s)
        workers = self.workers_on(host)
        self.log(f"reclaim {host.name} ({host.address}): SIGTERM to {len(workers)} worker process(es), "
                 f"host goes away in at most {grace_s:g}s")
        procs.signal_all(workers, 15)
        psutil.wait_procs(workers, timeout=grace_s)
        self._stop_host(host)
        self.log(f"reclaim {host.name}: host is gone")

    def kill(self, name: str) -> int:
        """A hard failure: SIGKILL to the host's workers, no notice, no checkpoint (a node crash, an OOM
        kill, a reclaim without a drain). The host stays up. Returns how many were killed."""
        workers = self.workers_on(self.get(name))
        self.log(f"kill {name}: SIGKILL to {len(workers)} worker process(es)")
        procs.signal_all(workers, signal.SIGKILL)
        return len(workers)

    def freeze(self, name: str) -> int:
        """A hang: SIGSTOP to the host's workers (a wedged node that neither answers nor fails). Its
        peers block in their next collective until their watchdog ends them."""
        workers = self.workers_on(self.get(name))
        self.log(f"hang {name}: SIGSTOP to {len(workers)} worker process(es)")
        procs.signal_all(workers, signal.SIGSTOP)
        return len(workers)

    def slow_link(self, name: str, rate: str) -> None:
        """A degraded link: the host's traffic capped at `rate` both ways (tc tbf), until it restarts."""
        host = self.get(name)
        network.slow_down_link(self._plan(), host.plan, rate)
        self.log(f"slow link {name}: capped at {rate} both ways (tc tbf)")

    def restore(self, name: str) -> None:
        """Bring a faulted host back: a reclaimed one returns (a replacement node: same name, address
        and keys); on a live one, frozen workers left by a hang are killed."""
        host = self.get(name)
        if host.live:
            frozen = [p for p in self.workers_on(host) if _stopped(p)]
            procs.signal_all(frozen, signal.SIGKILL)
            return
        self._start_host(host)
        self.log(f"restore {host.name} ({host.address}): host is back")

    # ---------------------------------------------------------------- internals
    def _plan(self) -> NetworkPlan:
        if self.plan is None:
            raise HostError("hosts are not up")
        return self.plan

    def _keys(self) -> ssh.SshKeys:
        if self.keys is None:
            raise HostError("hosts are not up")
        return self.keys

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _hosts_file(self) -> str:
        return network.hosts_file_for(self._plan(), {h.name: list(h.pod.names) for h in self.hosts if h.pod})

    def _write_hosts_files(self) -> None:
        plan, text = self._plan(), self._hosts_file()
        for member in [*plan.hosts, *([plan.launcher] if plan.launcher else [])]:
            if member.netns and network.etc_dir(member).exists():
                network.write_hosts_file(member, text)
        if not plan.isolated:
            # No /etc/hosts of their own here: the launcher's ssh client maps the pod names instead.
            ssh.write_client_config(self._keys(), self.names())

    def _start_host(self, host: Host) -> None:
        plan, keys = self._plan(), self._keys()
        with self._lock:
            if self._closed:
                raise HostError(f"cannot start {host.name}: the cluster is being torn down")
        if plan.isolated and not network.netns_exists(host.plan.netns):
            network.create_host_netns(plan, host.plan, self._hosts_file())
        config = ssh.write_sshd_config(keys, host.name, host.address)
        log_path = self.workdir / f"sshd.{host.name}.log"
        pod = host.pod
        with open(log_path, "ab") as log_file:
            host.sshd = subprocess.Popen(
                network.in_netns(host.plan, ssh.sshd_command(config), hostname=pod.hostname if pod else None),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
                env=host.environment(),
            )
        if host.cpus:
            # Before sshd listens (we wait for that below), so every session, and every worker it
            # starts, inherits the host's cores.
            os.sched_setaffinity(host.sshd.pid, host.cpus)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if host.sshd.poll() is not None:
                tail = log_path.read_text(errors="replace")[-500:]
                raise HostError(f"sshd for {host.name} on {host.address}:{keys.port} exited "
                                f"(code {host.sshd.returncode}): {tail.strip()}")
            try:
                with socket.create_connection((host.address, keys.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise HostError(f"sshd for {host.name} did not answer on {host.address}:{keys.port} "
                                    f"within {self.startup_timeout_s:g}s") from None
                time.sleep(0.1)
        with self._lock:
            host.live = True
            self._changed()

    def _stop_host(self, host: Host, keep_namespace: bool = False) -> None:
        with self._lock:
            if host.live:
                host.live = False
                if self.plan is not None:
                    self._changed()
        procs.stop_processes(self.host_processes(host), grace_s=3)
        if host.sshd is not None:
            try:
                host.sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                host.sshd.kill()
                host.sshd.wait(timeout=5)
            host.sshd = None
        if host.plan.netns and not keep_namespace:
            network.delete_host_netns(host.plan)


def _stopped(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False
