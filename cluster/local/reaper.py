"""Clean up after local clusters whose owner died without tearing down (SIGKILL, power loss).

Teardown runs on errors, Ctrl-C, SIGTERM and SIGHUP; only a process killed outright cannot run it.
Every local cluster records its owner in `<workdir>/owner.json` (pid and start time, the store's
address) and its network plan in `<workdir>/cluster/plan.json`; the next `up()` reaps every
cluster whose owner is gone: it stops the processes that belong to it (by id), deletes its
namespaces, veths, bridge and /etc/netns entries, and removes its work dir. Live clusters (another
run, another test in parallel) are left alone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil

from cluster.local import network, procs
from cluster.local.objectstore import SERVER_MODULE

WORKDIR_PREFIX = "ringtrain-local-"
OWNER_FILE = "owner.json"
PLAN_FILE = "plan.json"


def owner_record(pid: int, create_time: float, store: tuple[str, int] | None = None) -> dict:
    return {"pid": pid, "create_time": create_time, "store": list(store) if store else None}


def write_owner(workdir: Path, store: tuple[str, int] | None = None) -> None:
    me = psutil.Process()
    tmp = workdir / (OWNER_FILE + ".tmp")
    tmp.write_text(json.dumps(owner_record(me.pid, me.create_time(), store)))
    tmp.replace(workdir / OWNER_FILE)


def write_plan(cluster_dir: Path, plan: network.NetworkPlan, created_mount_point: bool = False) -> None:
    """The plan a reaper needs; `created_mount_point`: this cluster created /etc/mpi (and may remove it)."""
    record = {"subnet_index": plan.subnet_index, "isolated": plan.isolated, "hosts": len(plan.hosts),
              "created_mount_point": created_mount_point}
    (cluster_dir / PLAN_FILE).write_text(json.dumps(record))


def owner_alive(record: dict) -> bool:
    """Whether the process that owns a cluster still runs (pid plus start time: pids are reused)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        return abs(proc.create_time() - float(record["create_time"])) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def stale_workdirs(tmp_root: Path | None = None) -> list[Path]:
    root = tmp_root or Path(tempfile.gettempdir())
    stale = []
    for d in sorted(root.glob(f"{WORKDIR_PREFIX}*")):
        owner = d / OWNER_FILE
        if not d.is_dir() or not owner.exists():
            continue  # not ours, or an owner still writing its record
        try:
            record = json.loads(owner.read_text())
        except (OSError, json.JSONDecodeError):
            record = {}
        if not owner_alive(record):
            stale.append(d)
    return stale


def _processes_of(workdir: Path, store: list | None) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        text = " ".join(cmd)
        if str(workdir) in text:
            found.append(p)   # sshd (-f <workdir>/...), horovodrun (its key), trainers (metrics file)
        elif store and SERVER_MODULE in text and f"-H {store[0]} -p {store[1]}" in text:
            found.append(p)   # the object store (ObjectStore's command line)
    return found


def reap(workdir: Path, log: Callable[[str], None] = print) -> None:
    """Remove everything of one dead cluster."""
    try:
        record = json.loads((workdir / OWNER_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        record = {}
    try:
        plan = json.loads((workdir / "cluster" / PLAN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        plan = {}
    victims = {p.pid: p for p in _processes_of(workdir, record.get("store"))}
    if plan.get("isolated"):
        n = int(plan["subnet_index"])
        for ns in network.list_namespaces(f"{network.NETNS_PREFIX}{n}-"):
            for pid in network.netns_pids(ns):
                with contextlib.suppress(psutil.Error):
                    victims.setdefault(pid, psutil.Process(pid))
    procs.stop_processes(victims.values(), grace_s=3)
    if plan.get("isolated"):
        full = network.plan_network(int(plan["subnet_index"]), int(plan.get("hosts", 1)), isolated=True)
        for host in [*full.hosts, *([full.launcher] if full.launcher else [])]:
            with contextlib.suppress(network.NetworkSetupError):
                network.delete_host_netns(host)
        if plan.get("created_mount_point"):
            network.MountPoint(network.CONFIG_MOUNT_PATH, created=True).release()
        with contextlib.suppress(network.NetworkSetupError):
            network.delete_bridge(full)
    shutil.rmtree(workdir, ignore_errors=True)
    subnet = f", subnet {network.SUBNET_PREFIX}.{plan['subnet_index']}.0/24" if plan.get("isolated") else ""
    log(f"local backend: cleaned up after a dead cluster "
        f"({workdir.name}: {len(victims)} process(es){subnet})")


def reap_stale_clusters(log: Callable[[str], None] = print, tmp_root: Path | None = None) -> int:
    dead = stale_workdirs(tmp_root)
    for d in dead:
        reap(d, log)
    return len(dead)
