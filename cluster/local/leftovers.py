"""What a local cluster could leave behind, looked up on the live system (for tests and diagnosis)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil

from cluster.local import network


def leftovers(*, subnet_index: int | None, isolated: bool, workdir: Path | None,
              listen: list[tuple[str, int]] = ()) -> list[str]:
    """Everything of one cluster still there: namespaces, bridge, /etc/netns entries, temp dir,
    listening sockets, processes naming the cluster's temp dir. Empty when teardown was complete."""
    found = []
    if isolated and subnet_index is not None:
        prefix = f"{network.NETNS_PREFIX}{subnet_index}-"
        found += [f"netns {n}" for n in network.list_namespaces(prefix)]
        bridge = f"{network.BRIDGE_PREFIX}{subnet_index}"
        if subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0:
            found.append(f"bridge {bridge}")
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        found += [f"veth {ln.split(':')[1].strip()}" for ln in links.splitlines()
                  if any(f" {network.VETH_PREFIX}{subnet_index}{kind}" in ln for kind in "hl")]
        if network.ETC_NETNS.exists():
            found += [f"/etc/netns/{p.name}" for p in network.ETC_NETNS.iterdir()
                      if p.name.startswith(prefix)]
    if workdir is not None:
        if workdir.exists():
            found.append(f"temp dir {workdir}")
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info.get("cmdline") or [])
            if str(workdir) in cmd:
                found.append(f"process {p.info['pid']}: {cmd[:120]}")
    wanted = set(listen)
    if wanted:
        for c in psutil.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN and c.laddr and (c.laddr.ip, c.laddr.port) in wanted:
                found.append(f"listening socket {c.laddr.ip}:{c.laddr.port}")
    return found
