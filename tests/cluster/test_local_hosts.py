"""Local worker hosts: distinct ssh hosts, discovery, spot-style reclaim and restore, clean teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.local import network
from cluster.local.hosts import LocalHosts
from cluster.local.leftovers import leftovers
from train.contract import cpu_share

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

WORKER = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def on_term(*_):
    marker.write_text("SIGTERM")
    sys.exit(75)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(120)
"""


def _isolation(request) -> bool:
    isolated = request.param
    if isolated:
        ok, why = network.namespaces_available()
        if not ok:
            pytest.skip(f"needs Linux network namespaces (root and iproute2): {why}")
    return isolated


@pytest.fixture(params=[True, False], ids=["netns", "localhost"])
def isolated(request):
    return _isolation(request)


def _ssh(h: LocalHosts, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*h.ssh_command(host), command], capture_output=True, text=True, timeout=timeout)


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _cores_seen_on(h: LocalHosts, host: str) -> list[int]:
    done = _ssh(h, host, f"{sys.executable} -c 'import os; print(sorted(os.sched_getaffinity(0)))'")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _expected_cores(index: int) -> list[int]:
    share = cpu_share(sorted(os.sched_getaffinity(0)), index, 2)
    return list(share) if share else sorted(os.sched_getaffinity(0))


def test_hosts_reclaim_and_restore_like_spot_nodes(tmp_path, isolated):
    hosts = LocalHosts(num_hosts=2, workdir=tmp_path / "cluster", isolated=isolated, log=lambda m: None)
    worker_script = tmp_path / "worker.py"
    worker_script.write_text(WORKER)
    marker = tmp_path / "marker"
    changes: list[list[str]] = []   # the live hosts each time they changed (what discovery is built from)
    with hosts:
        hosts.on_change(lambda: changes.append([h.name for h in hosts.live()]))
        plan = hosts.plan
        assert plan is not None and plan.isolated is isolated
        # Each host is its own ssh host; in namespaces it also has its own name and address.
        for host in hosts.hosts:
            done = _ssh(hosts, host.name, "hostname")
            assert done.returncode == 0, done.stderr
            if isolated:
                assert done.stdout.splitlines()[0] == host.name
                addrs = _ssh(hosts, host.name, "ip -4 -o addr show")
                assert f"{host.address}/24" in addrs.stdout
                assert f"{hosts.driver_address}/24" not in addrs.stdout  # the store is on another host
                assert f"{hosts.launcher.address}/24" not in addrs.stdout  # so is the launcher
            # ... and its own share of the machine's cores, which what it runs inherits.
            assert _cores_seen_on(hosts, host.name) == _expected_cores(hosts.hosts.index(host))
        assert [h.name for h in hosts.live()] == ["host-0", "host-1"]

        # A worker process (marked the way Horovod marks its workers) on host-1.
        session = subprocess.Popen(
            [*hosts.ssh_command("host-1"), f"env HOROVOD_RANK=1 {sys.executable} {worker_script} {marker}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert session.stdout.readline().strip() == "ready"
            host1 = hosts.get("host-1")
            _wait_for(lambda: hosts.workers_on(host1), 20, "the worker on host-1")

            hosts.reclaim("host-1", grace_s=10)
            # The worker got SIGTERM (not an abrupt kill) and could exit on its own ...
            assert marker.read_text() == "SIGTERM"
            # ... then the host went away: out of discovery (the listeners heard it at once), unreachable,
            # namespace gone.
            assert changes[0] == ["host-0"] and [h.name for h in hosts.live()] == ["host-0"]
            assert _ssh(hosts, "host-1", "true", timeout=40).returncode != 0
            if isolated:
                assert not network.netns_exists(host1.plan.netns)
            assert _ssh(hosts, "host-0", "true").returncode == 0
        finally:
            session.kill()
            session.wait(timeout=10)

        hosts.restore("host-1")
        assert _ssh(hosts, "host-1", "echo back").stdout.strip() == "back"
        assert _cores_seen_on(hosts, "host-1") == _expected_cores(1)  # a restored host gets its cores back
        assert changes[-1] == ["host-0", "host-1"]
        sshd_pids = [h.sshd.pid for h in hosts.hosts]
        port = hosts.keys.port

    left = leftovers(subnet_index=plan.subnet_index, isolated=isolated, workdir=tmp_path / "cluster" / "ssh",
                     listen=[(h.address, port) for h in plan.hosts])
    left = [x for x in left if not x.startswith("temp dir")]  # tmp_path is pytest's to remove
    assert left == []
    for pid in sshd_pids:
        alive = subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0
        assert not alive, f"sshd {pid} still running"


OWNER = """
import sys, time
from cluster.local.backend import LocalBackend
b = LocalBackend(2, isolated={isolated}, log=lambda m: None)
b.up()
print("UP", b.workdir, b.hosts.plan.subnet_index, b.store.host, b.store.port, b.hosts.keys.port, flush=True)
time.sleep(300)
"""


def test_a_cluster_whose_owner_was_killed_is_reaped_by_the_next_up(isolated):
    from cluster.local.reaper import reap_stale_clusters

    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(isolated=isolated)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline().split()
        assert line and line[0] == "UP", line
    finally:
        owner.kill()  # SIGKILL: no teardown can run
        owner.wait(timeout=10)
    workdir, subnet, store = Path(line[1]), int(line[2]), (line[3], int(line[4]))
    plan = network.plan_network(subnet, 2, isolated=isolated)
    listen = [store] + [(h.address, int(line[5])) for h in plan.hosts]
    left = dict(subnet_index=subnet, isolated=isolated, workdir=workdir, listen=listen)
    assert leftovers(**left), "the killed owner should have left its cluster behind"

    messages: list[str] = []
    assert reap_stale_clusters(messages.append) >= 1
    assert leftovers(**left) == []
    assert any(workdir.name in m for m in messages)
