"""Addresses and Linux network namespaces for the local worker hosts.

As root every worker host is its own network namespace, joined by a veth pair to a bridge in the
root namespace: hosts get distinct addresses, reach each other and the root namespace (where
the object store listens on the bridge address) over real TCP. The launcher (where horovodrun runs,
the MPIJob's launcher pod) is one more namespace on the bridge. Inside each namespace the veth end is
named `eth0`, the name a pod's interface has on EKS, so the MPIJob's `--network-interfaces eth0` names
the right interface on the launcher and on every worker, locally as on the cluster.

Without root (or without `ip netns`) the hosts are loopback addresses of this machine (127.x.y.z
all reach `lo`), each with its own sshd: still distinct hosts to Horovod, no isolation.

Every cluster claims its own /24 (10.213.N.0/24, N picked at random) by creating its bridge:
`ip link add` is atomic, so two clusters started in parallel never share a subnet or names.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUBNET_PREFIX = "10.213"          # 10.213.N.0/24 per cluster, N in SUBNET_RANGE
SUBNET_RANGE = range(1, 255)
LOOPBACK_PREFIX = "127.213"       # fallback: hosts at 127.213.N.(10+i)
NETNS_PREFIX = "ringtrain-"       # every namespace this module creates starts with this
BRIDGE_PREFIX = "rtbr"            # bridges: rtbr<N>; host-side veths: rtv<N>h<i>
VETH_PREFIX = "rtv"
FIRST_HOST_OCTET = 10
LAUNCHER_OCTET = 2
LAUNCHER_INDEX = 0xFFFF           # the launcher's place in host_mac (no worker has it)
POD_INTERFACE = "eth0"            # the interface inside every namespace (cluster.mpijob.POD_INTERFACE)


class NetworkSetupError(RuntimeError):
    """Namespaces, bridge or veths could not be created."""


@dataclass(frozen=True)
class HostPlan:
    """Where one worker host lives. `netns` is None in the localhost fallback."""

    index: int
    name: str        # display name, e.g. "host-0"
    address: str     # the address Horovod and ssh use
    netns: str | None = None
    veth_outer: str | None = None   # root-namespace end, enslaved to the bridge
    veth_inner: str | None = None   # temporary name of the end moved into the namespace
    mac: str | None = None          # fixed per host: a restored host answers ARP caches as before


@dataclass(frozen=True)
class NetworkPlan:
    subnet_index: int
    isolated: bool            # True: namespaces + bridge; False: loopback addresses
    iface: str                # the interface name on launcher and workers (bridge name, or "lo")
    driver_address: str       # where hosts reach the object store (the bridge address, or loopback)
    hosts: tuple[HostPlan, ...]
    launcher: HostPlan | None = None   # the launcher's namespace (None in the loopback fallback)

    @property
    def bridge(self) -> str | None:
        return self.iface if self.isolated else None

    @property
    def pod_iface(self) -> str:
        """The interface workers and launcher talk over: eth0 in each namespace, or lo."""
        return POD_INTERFACE if self.isolated else "lo"

    @property
    def cidr(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet_index}.0/24"


def plan_network(subnet_index: int, num_hosts: int, *, isolated: bool) -> NetworkPlan:
    """Names and addresses for a cluster of `num_hosts` hosts on subnet N (pure)."""
    if subnet_index not in SUBNET_RANGE:
        raise ValueError(f"subnet index {subnet_index}: must be in 1..254")
    if not 1 <= num_hosts <= 200:
        raise ValueError(f"num_hosts={num_hosts}: must be between 1 and 200")
    n = subnet_index
    if isolated:
        hosts = tuple(
            HostPlan(
                index=i,
                name=f"host-{i}",
                address=f"{SUBNET_PREFIX}.{n}.{FIRST_HOST_OCTET + i}",
                netns=f"{NETNS_PREFIX}{n}-host-{i}",
                veth_outer=f"{VETH_PREFIX}{n}h{i}",
                veth_inner=f"rtp{n}h{i}",
                mac=host_mac(n, i),
            )
            for i in range(num_hosts)
        )
        launcher = HostPlan(index=LAUNCHER_INDEX, name="launcher",
                            address=f"{SUBNET_PREFIX}.{n}.{LAUNCHER_OCTET}",
                            netns=f"{NETNS_PREFIX}{n}-launcher", veth_outer=f"{VETH_PREFIX}{n}l",
                            veth_inner=f"rtp{n}l", mac=host_mac(n, LAUNCHER_INDEX))
        return NetworkPlan(n, True, f"{BRIDGE_PREFIX}{n}", f"{SUBNET_PREFIX}.{n}.1", hosts, launcher)
    hosts = tuple(
        HostPlan(index=i, name=f"host-{i}", address=f"{LOOPBACK_PREFIX}.{n}.{FIRST_HOST_OCTET + i}")
        for i in range(num_hosts)
    )
    return NetworkPlan(n, False, "lo", "127.0.0.1", hosts)


def host_mac(subnet_index: int, host_index: int) -> str:
    """A locally administered MAC fixed by (cluster, host) (pure).

    A replacement host must keep its MAC: peers keep answering to the cached one (gVisor's netstack,
    for one, does not re-resolve a REACHABLE neighbour whose MAC changed).
    """
    return f"02:72:74:{subnet_index:02x}:{host_index // 256:02x}:{host_index % 256:02x}"


def namespaces_available() -> tuple[bool, str]:
    """Whether this process can build isolated hosts, and if not, why (said to the user)."""
    if os.geteuid() != 0:
        return False, "not running as root"
    if shutil.which("ip") is None:
        return False, "the 'ip' tool (iproute2) is not installed"
    probe = f"{NETNS_PREFIX}probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except NetworkSetupError as e:
        return False, f"cannot create network namespaces ({e})"
    with contextlib.suppress(NetworkSetupError):
        _ip("netns", "del", probe)
    return True, ""


def _ip(*args: str, netns: str | None = None) -> str:
    return _run(["ip", *args] if netns is None else ["ip", "-n", netns, *args])


def _run(cmd: list[str]) -> str:
    """Run a network setup command; NetworkSetupError naming it when it fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetworkSetupError(f"`{' '.join(cmd)}` failed: {e}") from e
    if out.returncode != 0:
        raise NetworkSetupError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.returncode}")
    return out.stdout


def rate_limit_commands(plan: NetworkPlan, host: HostPlan, rate: str) -> list[list[str]]:
    """tc commands that cap a host's link at `rate` both ways (pure): a token bucket filter (tc-tbf(8))
    on the bridge end of its veth (traffic to the host) and on its eth0 inside the namespace (traffic
    from it). tbf, not netem: this machine's kernel has no sch_netem ("Specified qdisc kind is
    unknown"), and a rate cap is what a degraded link is."""
    if not (plan.isolated and host.netns and host.veth_outer):
        raise ValueError(f"{host.name}: a slow link needs network-namespace hosts (run as root)")
    tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    return [["tc", "qdisc", "replace", "dev", host.veth_outer, *tbf],
            ["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", plan.pod_iface, *tbf]]


def slow_down_link(plan: NetworkPlan, host: HostPlan, rate: str) -> None:
    """Cap the host's link at `rate` (tc tbf) until the host is stopped (its veth goes with it)."""
    for cmd in rate_limit_commands(plan, host, rate):
        _run(cmd)


def _subnets_in_use() -> set[int]:
    used = set()
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        for word in line.split():
            if word.startswith(f"{SUBNET_PREFIX}."):
                parts = word.split(".")
                if len(parts) >= 3 and parts[2].isdigit():
                    used.add(int(parts[2]))
    return used


def claim_subnet(num_hosts: int, rng: random.Random | None = None) -> NetworkPlan:
    """Create this cluster's bridge on a free 10.213.N.0/24 and return the plan around it."""
    rng = rng or random.Random()
    candidates = [n for n in SUBNET_RANGE if n not in _subnets_in_use()]
    rng.shuffle(candidates)
    for n in candidates[:50]:
        plan = plan_network(n, num_hosts, isolated=True)
        try:
            _ip("link", "add", plan.iface, "type", "bridge")
        except NetworkSetupError:
            continue  # taken by a cluster started in parallel: try another
        # Where br_netfilter is loaded (any Docker host), bridged frames go through iptables'
        # FORWARD chain, whose policy there is DROP: host-to-host traffic would vanish. This bridge
        # only joins our own namespaces, so keep it out of netfilter (best effort: older kernels lack it).
        with contextlib.suppress(NetworkSetupError):
            _ip("link", "set", plan.iface, "type", "bridge",
                "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0")
        try:
            _ip("addr", "add", f"{plan.driver_address}/24", "dev", plan.iface)
            _ip("link", "set", plan.iface, "up")
        except NetworkSetupError:
            delete_bridge(plan)
            raise
        return plan
    raise NetworkSetupError(f"no free subnet {SUBNET_PREFIX}.N.0/24 (tried {min(len(candidates), 50)})")


def loopback_plan(num_hosts: int, rng: random.Random | None = None) -> NetworkPlan:
    return plan_network((rng or random.Random()).choice(SUBNET_RANGE), num_hosts, isolated=False)


def delete_bridge(plan: NetworkPlan) -> None:
    if plan.bridge and link_exists(plan.bridge):
        _ip("link", "del", plan.bridge)


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=30).returncode == 0


def netns_exists(name: str) -> bool:
    return name in list_namespaces()


def list_namespaces(prefix: str = NETNS_PREFIX) -> list[str]:
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines() if line.split() and line.startswith(prefix)]


ETC_NETNS = Path("/etc/netns")
# Where the MPI Operator mounts the job's ConfigMap (hostfile, discover_hosts.sh) in the launcher pod
# (cluster/mpi_operator.py). `ip netns exec` can bind /etc/netns/<ns>/mpi over it only if it exists.
CONFIG_MOUNT_PATH = Path("/etc/mpi")


@dataclass
class MountPoint:
    """A directory in /etc that `ip netns exec` binds a namespace's own copy over; removed again by the
    cluster that created it, once no cluster's launcher namespace still uses it."""

    path: Path
    created: bool

    def release(self) -> None:
        if not self.created or any(ns.endswith("-launcher") for ns in list_namespaces()):
            return
        with contextlib.suppress(OSError):
            self.path.rmdir()  # only if empty: someone else's files stay
        self.created = False


def claim_mount_point(path: Path) -> MountPoint:
    if path.is_dir():
        return MountPoint(path, created=False)
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        return MountPoint(path, created=False)
    except OSError as e:
        raise NetworkSetupError(f"cannot create the mount point {path}: {e}") from e
    return MountPoint(path, created=True)


def hosts_file_for(plan: NetworkPlan, aliases: dict[str, list[str]] | None = None) -> str:
    """/etc/hosts as seen inside every namespace of the cluster (pure): each host's name, and the names
    of the pods running on it (`aliases`, host name -> names: `<pod>.<job>.<ns>.svc` and `<pod>`), the
    way the cluster's DNS resolves the job's headless Service.

    A host's own name must resolve to its own address, not to 127.0.0.1 as the machine's name
    does: Gloo falls back to resolving the hostname for the address it announces to its peers.
    """
    aliases = aliases or {}
    lines = ["127.0.0.1 localhost"]
    members = [*plan.hosts, *([plan.launcher] if plan.launcher else [])]
    lines += [" ".join([h.address, h.name, *aliases.get(h.name, [])]) for h in members]
    return "\n".join(lines) + "\n"


def write_hosts_file(host: HostPlan, text: str) -> None:
    """Rewrite a namespace's /etc/hosts in place: processes already running in the namespace see the
    file through a bind mount of this inode (`ip netns exec`), so it must not be replaced."""
    if not host.netns:
        return
    path = ETC_NETNS / host.netns / "hosts"
    with open(path, "r+" if path.exists() else "w") as f:
        f.write(text)
        f.truncate()


def etc_dir(host: HostPlan) -> Path:
    """What `ip netns exec` bind-mounts over /etc/* for the namespace's processes (one entry each)."""
    assert host.netns
    return ETC_NETNS / host.netns


def create_host_netns(plan: NetworkPlan, host: HostPlan, hosts_file: str) -> None:
    """The host's namespace, its loopback, and a veth into the bridge carrying the host's address."""
    assert host.netns and host.veth_outer and host.veth_inner and plan.bridge
    _ip("netns", "add", host.netns)
    try:
        etc_dir(host).mkdir(parents=True, exist_ok=True)
        write_hosts_file(host, hosts_file)
        _ip("link", "set", "lo", "up", netns=host.netns)
        _ip("link", "add", host.veth_outer, "type", "veth", "peer", "name", host.veth_inner)
        _ip("link", "set", host.veth_inner, "netns", host.netns)
        _ip("link", "set", host.veth_inner, "name", plan.pod_iface, netns=host.netns)
        if host.mac:
            _ip("link", "set", plan.pod_iface, "address", host.mac, netns=host.netns)
        _ip("addr", "add", f"{host.address}/24", "dev", plan.pod_iface, netns=host.netns)
        _ip("link", "set", plan.pod_iface, "up", netns=host.netns)
        _ip("link", "set", host.veth_outer, "master", plan.bridge)
        _ip("link", "set", host.veth_outer, "up")
    except NetworkSetupError:
        delete_host_netns(host)
        raise


def netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def delete_host_netns(host: HostPlan) -> None:
    """Remove the namespace (its veth end goes with it) and the root-side veth if still there."""
    if host.netns and netns_exists(host.netns):
        _ip("netns", "del", host.netns)
    if host.netns:
        shutil.rmtree(ETC_NETNS / host.netns, ignore_errors=True)
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only if empty: other clusters may still use it
    if host.veth_outer and link_exists(host.veth_outer):
        try:
            _ip("link", "del", host.veth_outer)
        except NetworkSetupError:
            # Deleting the namespace removes the pair asynchronously: gone by now is fine.
            if link_exists(host.veth_outer):
                raise


def in_netns(host: HostPlan, command: list[str], hostname: str | None = None) -> list[str]:
    """`command` run as that host: inside its network namespace with its own hostname (UTS
    namespace; `hostname`, default the host's name), as on a separate machine. Unchanged in the
    loopback fallback."""
    if not host.netns:
        return command
    return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', hostname or host.name, *command]
