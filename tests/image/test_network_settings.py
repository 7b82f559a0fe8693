"""EFA settings only on EFA node groups: image/nccl-efa.env's [efa] section (NCCL_NET_PLUGIN=ofi, ...)
applies where the node group has EFA interfaces, [socket] (NCCL's own TCP transport) elsewhere, [common]
everywhere. The MPIJob names the node group's network on the worker pods (RINGTRAIN_NETWORK); the
entrypoint applies the section in its worker modes and writes it to /etc/environment for the ranks; the
launcher, whose environment horovodrun exports to every rank, carries none of it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.backend import Storage
from cluster.job import JobSpec
from cluster.mpijob import (
    SYSTEM_NODES,
    WorkerNodes,
    launcher_container,
    render_mpijob,
    worker_container,
    worker_selftest_container,
)
from tests.image.helpers import ENV_FILE, IMAGE_DIR, load_entry_module, load_image_module

ep = load_image_module("entrypoint")
entry_host = load_entry_module("host")
entry_settings = load_entry_module("settings")
ENTRYPOINT = IMAGE_DIR / "entrypoint.py"


def sections() -> dict[str, dict[str, str]]:
    return entry_settings.parse_env_file(ENV_FILE.read_text(), str(ENV_FILE))


# --------------------------------------------------------------------------------------------------
# The env file


def test_the_efa_plugin_and_efa_settings_live_only_in_the_efa_section():
    s = sections()
    assert s["efa"] == {"FI_EFA_USE_HUGE_PAGE": "0", "NCCL_NET_PLUGIN": "ofi"}
    assert not [k for k in s["common"] if k.startswith(("FI_", "NCCL_NET"))], s["common"]


def test_socket_groups_use_ncclS_own_transport_with_its_aws_socket_counts():
    """NCCL_NET_PLUGIN=none loads no external plugin (NVIDIA/nccl src/plugin/net.cc), so not the
    aws-ofi-nccl the image carries as libnccl-net.so either; 2 threads x 8 sockets are what NCCL's socket
    transport picks on an AWS ENA device (src/transport/net_socket.cc), which a pod's veth hides from it.
    Their product stays within NCCL's MAX_SOCKETS (64)."""
    socket = sections()["socket"]
    assert socket == {"NCCL_NET_PLUGIN": "none", "NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8"}
    assert int(socket["NCCL_SOCKET_NTHREADS"]) * int(socket["NCCL_NSOCKS_PERTHREAD"]) <= 64


@pytest.mark.parametrize("text, complaint", [
    ("A=1\n[common]\n[efa]\n[socket]\n", "A comes before any [section] header"),
    ("[common]\n[efa]\n[gpu]\n", "section [gpu]: each of common, efa, socket once"),
    ("[common]\n[efa]\n[common]\n", "section [common]: each of common, efa, socket once"),
    ("[common]\nA=1\n[efa]\n", "no section [socket]"),
    ("[common]\nA=1\n[efa]\nA=2\n[socket]\n", "A in both [common] and [efa]"),
])
def test_a_malformed_env_file_is_refused_with_one_message(text, complaint):
    with pytest.raises(entry_settings.UsageError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        entry_settings.parse_env_file(text, "x.env")


# --------------------------------------------------------------------------------------------------
# Which network: RINGTRAIN_NETWORK, else the node's EFA devices


def test_resolve_network():
    assert entry_settings.resolve_network({"RINGTRAIN_NETWORK": "efa"}, 0) == "efa"
    assert entry_settings.resolve_network({"RINGTRAIN_NETWORK": "socket"}, 4) == "socket"
    assert entry_settings.resolve_network({}, 4) == "efa"
    assert entry_settings.resolve_network({"RINGTRAIN_NETWORK": "auto"}, 0) == "socket"
    with pytest.raises(entry_settings.UsageError, match="RINGTRAIN_NETWORK='ib': use efa, socket or auto"):
        entry_settings.resolve_network({"RINGTRAIN_NETWORK": "ib"}, 0)


def _node(tmp_path: Path, efa_devices: int, env: dict[str, str]) -> entry_host.Host:
    """A host whose sysfs shows `efa_devices` RDMA devices bound to the efa driver."""
    sysfs = tmp_path / "sys-class-infiniband"
    sysfs.mkdir(parents=True, exist_ok=True)
    driver = tmp_path / "drivers" / "efa"
    driver.mkdir(parents=True, exist_ok=True)
    for i in range(efa_devices):
        (sysfs / f"rdmap{i}s27" / "device").mkdir(parents=True)
        (sysfs / f"rdmap{i}s27" / "device" / "driver").symlink_to(driver)
    return entry_host.Host(env=env, sysfs_infiniband=sysfs, python=sys.executable)


def _train_env(tmp_path: Path, env: dict[str, str], efa_devices: int = 0) -> dict[str, str]:
    """The environment `entrypoint.py train` hands the trainer."""
    env = {"RINGTRAIN_ENV_FILE": str(ENV_FILE), **env}
    execs = []
    rc = ep.main(["train"], env=env, exec_fn=lambda cmd, e: execs.append(dict(e)),
                 host=_node(tmp_path, efa_devices, env))
    assert rc == 0
    return execs[0]


def test_a_socket_worker_gets_ncclS_transport_and_nothing_of_efa(tmp_path):
    env = _train_env(tmp_path, {"RINGTRAIN_NETWORK": "socket"})
    assert env["NCCL_NET_PLUGIN"] == "none" and env["NCCL_NSOCKS_PERTHREAD"] == "8"
    assert "FI_EFA_USE_HUGE_PAGE" not in env
    assert env["OPAL_PREFIX"] == "/opt/amazon/openmpi", "[common] still applies"


def test_an_efa_worker_gets_the_plugin(tmp_path):
    env = _train_env(tmp_path, {"RINGTRAIN_NETWORK": "efa"})
    assert env["NCCL_NET_PLUGIN"] == "ofi" and env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert "NCCL_NSOCKS_PERTHREAD" not in env


def test_unset_the_nodes_efa_devices_decide(tmp_path):
    assert _train_env(tmp_path / "a", {}, efa_devices=0)["NCCL_NET_PLUGIN"] == "none"
    assert _train_env(tmp_path / "b", {}, efa_devices=2)["NCCL_NET_PLUGIN"] == "ofi"


def test_a_pods_own_value_still_wins(tmp_path):
    env = _train_env(tmp_path, {"RINGTRAIN_NETWORK": "efa", "NCCL_NET_PLUGIN": "none"})
    assert env["NCCL_NET_PLUGIN"] == "none"


def test_a_bad_network_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "RINGTRAIN_ENV_FILE": str(ENV_FILE), "RINGTRAIN_NETWORK": "ib"}
    res = subprocess.run([sys.executable, str(ENTRYPOINT), "train"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "entrypoint: error: RINGTRAIN_NETWORK='ib': use efa, socket or auto (the node's EFA devices decide)"]


def test_the_launcher_exports_no_network_setting(tmp_path):
    """horovodrun puts the launcher's environment on every rank's command line: it must not carry a network
    section, even where it is told the workers' network."""
    code = "import os; print(os.environ.get('NCCL_NET_PLUGIN'), os.environ.get('FI_EFA_USE_HUGE_PAGE'), " \
           "os.environ['PMIX_MCA_gds'])"
    keys = {k for s in sections().values() for k in s}
    env = {k: v for k, v in os.environ.items() if k not in keys}
    env.update(RINGTRAIN_ENV_FILE=str(ENV_FILE), RINGTRAIN_NETWORK="efa")
    res = subprocess.run([sys.executable, str(ENTRYPOINT), "launcher", "--", sys.executable, "-c", code],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "None None hash"


# --------------------------------------------------------------------------------------------------
# sshd mode: the ranks' environment


ETC_ENVIRONMENT = 'PATH="/opt/venv/bin:/usr/bin"\nNCCL_SOCKET_IFNAME=^docker,lo,veth\n'


def _start_sshd(tmp_path: Path, monkeypatch, network: str) -> str:
    ssh_dir, key_dir = tmp_path / "ssh", tmp_path / "etc-ssh"
    ssh_dir.mkdir(exist_ok=True)
    key_dir.mkdir(exist_ok=True)
    (ssh_dir / "authorized_keys").write_text("ssh-ed25519 AAAA launcher\n")
    (key_dir / "ssh_host_ed25519_key").write_text("key")
    etc_environment = tmp_path / "environment"
    if not etc_environment.exists():
        etc_environment.write_text(ETC_ENVIRONMENT)
    monkeypatch.setattr(ep, "DEFAULT_HOST_KEY_DIR", key_dir)
    monkeypatch.setattr(ep, "SSHD_RUN_DIR", tmp_path / "run-sshd")
    monkeypatch.setattr(ep, "ETC_ENVIRONMENT_PATH", str(etc_environment))
    env = {"RINGTRAIN_ENV_FILE": str(ENV_FILE), "RINGTRAIN_SSH_DIR": str(ssh_dir),
           "RINGTRAIN_NETWORK": network}
    rc = ep.main(["sshd"], env=env, host=_node(tmp_path, 0, env), supervise_fn=lambda cmd, e, grace: 0)
    assert rc == 0
    return etc_environment.read_text()


def test_sshd_mode_writes_the_network_section_for_the_ranks(tmp_path, monkeypatch):
    text = _start_sshd(tmp_path, monkeypatch, "efa")
    assert text == ETC_ENVIRONMENT + "FI_EFA_USE_HUGE_PAGE=0\nNCCL_NET_PLUGIN=ofi\n"
    assert _start_sshd(tmp_path, monkeypatch, "efa") == text, "a restarted container writes the same lines"
    switched = _start_sshd(tmp_path, monkeypatch, "socket")
    socket_lines = "NCCL_NET_PLUGIN=none\nNCCL_SOCKET_NTHREADS=2\nNCCL_NSOCKS_PERTHREAD=8\n"
    assert switched == ETC_ENVIRONMENT + socket_lines


# --------------------------------------------------------------------------------------------------
# The MPIJob names the node group's network on the worker pods only


P5 = WorkerNodes(node_group="p5", instance_types=("p5.48xlarge",), gpus_per_node=8, efa_interfaces=32,
                 capacity_type="ON_DEMAND", memory_limit="1800Gi", cpu_request="180", shm_size_limit="900Gi")
G5 = dataclasses.replace(P5, node_group="g5", instance_types=("g5.12xlarge",), gpus_per_node=4,
                         efa_interfaces=0, memory_limit="170Gi", cpu_request="46", shm_size_limit="85Gi")


def _render(workers: WorkerNodes, env: dict[str, str] | None = None) -> dict:
    job = JobSpec(name="j1", num_hosts=2, slots_per_host=workers.gpus_per_node, env=env or {})
    storage = Storage(dataset_uri="s3://d/datasets/x", checkpoint_uri="s3://c/checkpoints/j1")
    return render_mpijob(job, image="repo/ringtrain:1.0.0", storage=storage, namespace="training",
                         service_account="sa", workers=workers, launcher=SYSTEM_NODES)


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


@pytest.mark.parametrize("workers, network", [(P5, "efa"), (G5, "socket")])
def test_worker_pods_name_their_node_groups_network(workers, network):
    manifest = _render(workers)
    for container in (worker_selftest_container(manifest), worker_container(manifest)):
        assert _env(container)["RINGTRAIN_NETWORK"] == network
        # ... which the image's own resolver accepts as that network
        assert entry_settings.resolve_network(_env(container), 0) == network
    assert "RINGTRAIN_NETWORK" not in _env(launcher_container(manifest))


def test_a_job_may_choose_the_network_itself():
    manifest = _render(P5, env={"RINGTRAIN_NETWORK": "socket"})
    names = [e["name"] for e in worker_container(manifest)["env"]]
    assert names.count("RINGTRAIN_NETWORK") == 1
    assert _env(worker_container(manifest))["RINGTRAIN_NETWORK"] == "socket"
