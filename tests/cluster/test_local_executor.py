"""The local executor runs a rendered MPIJob the way MPI Operator v0.8.2 does: pods named and resolvable as
the operator names them, its /etc/mpi files in its format, the launcher container's command verbatim."""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path

import pytest

from cluster.backend import Storage
from cluster.job import JobSpec, trainer_config
from cluster.local import network
from cluster.local.backend import local_worker_nodes
from cluster.local.executor import IMAGE_ENTRYPOINT, LocalExecutor, launcher_process, volume_path, worker_pods
from cluster.local.hosts import Host, LocalHosts
from cluster.mpijob import SYSTEM_NODES, launcher_container, render_mpijob

REPO = Path(__file__).resolve().parents[2]
STORAGE = Storage(dataset_uri="s3://d/datasets/x", checkpoint_uri="s3://c/checkpoints/j",
                  endpoint_url="http://10.0.0.1:9000", env={"AWS_ENDPOINT_URL": "http://10.0.0.1:9000"})


def render(job: JobSpec, iface: str = "eth0", ssh_port: int = 22) -> dict:
    return render_mpijob(job, image="ringtrain-local:checkout", storage=STORAGE, namespace="training",
                         service_account="trainer", workers=local_worker_nodes(2, 8 * 2 ** 30),
                         launcher=SYSTEM_NODES, network_interface=iface, ssh_port=ssh_port)


STATIC = JobSpec(name="j", num_hosts=2, env={"NCCL_DEBUG": "INFO"}, trainer=trainer_config(("--steps", "3")))


def test_the_launcher_runs_the_images_entrypoint_with_the_containers_args_and_env_verbatim():
    mpijob = render(STATIC)
    argv, env = launcher_process(mpijob, {"PATH": "/usr/bin", "HOME": "/root"}, ["/ssh-bin", "/venv/bin"])
    container = launcher_container(mpijob)
    assert argv == [*IMAGE_ENTRYPOINT, *container["args"]]
    assert IMAGE_ENTRYPOINT[1].endswith("image/entrypoint.py")
    for item in container["env"]:
        assert env[item["name"]] == item["value"]
    # What the operator adds to the launcher (launcherEnvVars, ompiEnvVars, nvidiaDisableEnvVars):
    assert env["K_MPI_JOB_ROLE"] == "launcher"
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ""
    assert env["PATH"] == "/ssh-bin:/venv/bin:/usr/bin" and env["HOME"] == "/root"
    overridden = copy.deepcopy(mpijob)
    launcher_container(overridden)["command"] = ["/bin/sh"]
    with pytest.raises(Exception, match="overrides the image's ENTRYPOINT"):
        launcher_process(overridden, {}, [])


def test_the_dockerfiles_entrypoint_is_the_script_the_local_launcher_runs():
    entrypoints = [ln for ln in (REPO / "image" / "Dockerfile").read_text().splitlines()
                   if ln.startswith("ENTRYPOINT")]
    assert entrypoints and all(Path(IMAGE_ENTRYPOINT[1]).name in ln for ln in entrypoints)


def test_without_a_namespace_the_etc_mpi_mount_is_the_jobs_directory():
    mpijob = render(STATIC)
    argv, env = launcher_process(mpijob, {}, [], config_dir=Path("/w/etc-mpi"))
    assert "/w/etc-mpi/hostfile" in argv and "/etc/mpi/hostfile" not in argv
    assert env["OMPI_MCA_orte_default_hostfile"] == "/w/etc-mpi/hostfile"
    assert volume_path("/etc/mpix", Path("/w")) == "/etc/mpix" and volume_path("/x", None) == "/x"


def _host(i: int, live: bool) -> Host:
    plan = network.plan_network(9, 3, isolated=True).hosts[i]
    return Host(plan=plan, slots=1, live=live)


def test_worker_pods_are_placed_live_hosts_first_with_the_operators_names_and_the_worker_env():
    mpijob = render(JobSpec(name="e", num_hosts=2, elastic=True, min_hosts=1, env={"A": "1"}))
    pods = worker_pods(mpijob, [_host(0, False), _host(1, True), _host(2, True)])
    assert {h: p.hostname for h, p in pods.items()} == {"host-1": "e-worker-0", "host-2": "e-worker-1"}
    assert pods["host-1"].names == ("e-worker-0.e.training.svc", "e-worker-0")
    env = dict(pods["host-1"].env)
    assert env["K_MPI_JOB_ROLE"] == "worker" and env["A"] == "1"
    with pytest.raises(Exception, match="has 2 workers but the local cluster 1 hosts"):
        worker_pods(mpijob, [_host(0, True)])


def test_a_host_the_workers_node_affinity_excludes_gets_no_worker_and_a_worker_left_over_waits():
    job = JobSpec(name="e", num_hosts=3, elastic=True, min_hosts=2, exclude_nodes=("host-1",))
    pods = worker_pods(render(job), [_host(0, True), _host(1, True), _host(2, True)])
    # as the scheduler would: worker 2 has no allowed host left and stays Pending (no pod here)
    assert {h: p.hostname for h, p in pods.items()} == {"host-0": "e-worker-0", "host-2": "e-worker-1"}


@pytest.fixture(params=[True, False], ids=["netns", "localhost"])
def cluster(request, tmp_path):
    if request.param:
        ok, why = network.namespaces_available()
        if not ok:
            pytest.skip(f"needs Linux network namespaces (root and iproute2): {why}")
    hosts = LocalHosts(num_hosts=2, workdir=tmp_path / "cluster", isolated=request.param, log=lambda m: None)
    with hosts:
        yield hosts


PROBE = ("for f in /etc/mpi/hostfile /etc/mpi/discover_hosts.sh; do stat -c '%a' $f; cat $f; done; "
         "/etc/mpi/discover_hosts.sh; hostname; for n in $(/etc/mpi/discover_hosts.sh); do "
         "ssh $n 'hostname; echo $K_MPI_JOB_ROLE'; done")


def _run(hosts: LocalHosts, mpijob: dict, tmp_path: Path) -> str:
    done = LocalExecutor(hosts, tmp_path / "job").start(mpijob, subprocess.PIPE)
    try:
        out, _ = done.proc.communicate(timeout=120)
    finally:
        done.remove_listener()
    assert done.proc.returncode == 0, out
    return out


@pytest.mark.slow
def test_a_job_runs_as_the_operator_runs_it(cluster, tmp_path):
    """Launcher args replaced by a probe: what the launcher container sees of the operator's world."""
    hosts = cluster
    job = JobSpec(name="j", num_hosts=2, elastic=True, min_hosts=1)
    mpijob = render(job, hosts.iface, hosts.keys.port)
    launcher_container(mpijob)["args"] = ["launcher", "--", "sh", "-c", PROBE]
    if not hosts.isolated:
        # No mount namespace: the probe's paths are in the string, so name the job's directory there.
        config = LocalExecutor(hosts, tmp_path / "job").config_dir()
        launcher_container(mpijob)["args"][-1] = PROBE.replace("/etc/mpi", str(config))
    out = _run(hosts, mpijob, tmp_path).splitlines()
    fqdns = ["j-worker-0.j.training.svc", "j-worker-1.j.training.svc"]
    # The operator's ConfigMap, in its format and modes (newConfigMap, updateDiscoverHostsInConfigMap).
    assert out[:3] == ["444", f"{fqdns[0]} slots=1", f"{fqdns[1]} slots=1"]
    assert out[3:7] == ["555", "#!/bin/sh", f"echo {fqdns[0]}", f"echo {fqdns[1]}"]
    assert out[7:9] == fqdns
    rest = out[9:]
    if hosts.isolated:
        # The launcher pod's hostname; each worker reached by its pod name, which is its hostname.
        assert rest[0] == "j-launcher"
        rest = rest[1:]
    else:
        rest = rest[1:]  # the machine's own hostname
    # Sessions do not inherit the pod's environment (sshd does not pass it on, as in a pod).
    expect = [("j-worker-0" if hosts.isolated else None), "", ("j-worker-1" if hosts.isolated else None), ""]
    assert [line for line, want in zip(rest, expect, strict=True) if want is not None] == \
        [want for want in expect if want is not None]

    # A host that goes leaves the discovery script at once; one that comes back is listed again.
    mpijob = render(job, hosts.iface, hosts.keys.port)
    launcher_container(mpijob)["args"] = ["launcher", "--", "true"]
    running = LocalExecutor(hosts, tmp_path / "job2").start(mpijob, subprocess.DEVNULL)
    script = running.config_dir / "discover_hosts.sh"
    try:
        assert running.proc.wait(timeout=60) == 0
        hosts.reclaim("host-1", grace_s=1)
        assert script.read_text() == f"#!/bin/sh\necho {fqdns[0]}\n"
        assert stat.S_IMODE(os.stat(script).st_mode) == 0o555
        hosts.restore("host-1")
        assert script.read_text() == f"#!/bin/sh\necho {fqdns[0]}\necho {fqdns[1]}\n"
    finally:
        running.remove_listener()


@pytest.mark.slow
def test_the_worker_pods_run_with_the_pods_environment(cluster, tmp_path):
    hosts = cluster
    mpijob = render(JobSpec(name="k", num_hosts=1, env={"RINGTRAIN_MARK": "pod-env"}), hosts.iface,
                    hosts.keys.port)
    pods = worker_pods(mpijob, hosts.hosts)
    hosts.run_pods(pods)
    (host,) = [h for h in hosts.hosts if h.pod]
    env = host.environment()
    assert env["RINGTRAIN_MARK"] == "pod-env" and env["K_MPI_JOB_ROLE"] == "worker"
    assert [h.environment() for h in hosts.hosts if not h.pod] == [None]
    # The pod's sshd was restarted as the pod's and answers (sshd cannot be asked for its env: it
    # overwrites its environ block with its process title).
    done = subprocess.run([*hosts.ssh_command(host.name), "hostname"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and (done.stdout.strip() == "k-worker-0" or not hosts.isolated)


@pytest.mark.slow
def test_submit_dry_run_prints_the_object_the_local_executor_runs(tmp_path, capsys):
    """`scripts/submit --dry-run` and the local backend render with the same function: for one job the two
    objects differ only in where they run (storage, image, nodes, interface), never in the launch."""
    import json

    from cluster import cli
    from cluster.local.backend import LocalBackend
    from cluster.mpijob import worker_container
    from tests.infra.harness import run_program

    exports = run_program("dev").exports
    outputs = tmp_path / "dev.json"
    outputs.write_text(json.dumps(exports))
    assert cli.main(["submit", "--stack", "dev", "--job-name", "same", "--hosts", "2", "--slots-per-host",
                     "1", "--node-group", "l4-spot", "--dataset", "demo", "--outputs", str(outputs),
                     "--dry-run", "--", "--steps", "5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    backend = LocalBackend(2, log=lambda m: None)
    with backend:
        local = backend.render(JobSpec(name="same", num_hosts=2, trainer=trainer_config(("--steps", "5"))))
        local_storage, iface = backend.storage("same"), backend.hosts.iface
    aws_storage = (f"s3://{exports['datasetsBucket']}/datasets/demo",
                   f"s3://{exports['checkpointsBucket']}/checkpoints/same")
    here = {local_storage.dataset_uri: aws_storage[0], local_storage.checkpoint_uri: aws_storage[1],
            iface: "eth0"}
    local_args = [here.get(a, a) for a in launcher_container(local)["args"]]
    # the one difference in the launch: on AWS the trainer also prints its metrics records into the log,
    # which is how they reach the flow there (issue 39); the local backend reads its metrics file
    aws_args = launcher_container(printed)["args"]
    assert aws_args.count("--metrics-lines") == 1
    assert local_args == [a for a in aws_args if a != "--metrics-lines"]
    assert set(local["spec"]) == set(printed["spec"])
    for key in ("slotsPerWorker", "launcherCreationPolicy", "mpiImplementation", "sshAuthMountPath"):
        assert local["spec"][key] == printed["spec"][key]
    assert worker_container(local)["args"] == worker_container(printed)["args"]
    # The local store's endpoint and credentials travel in env; on AWS the pod's IAM role supplies them,
    # and env carries the node group's network (issue 40 §2.2) and the stack's region (§1.8) only.
    assert set(worker_container(local)) - {"env"} == set(worker_container(printed)) - {"env"}
    aws_env = {e["name"] for e in worker_container(printed).get("env", [])}
    assert "AWS_SECRET_ACCESS_KEY" not in aws_env and "RINGTRAIN_NETWORK" in aws_env, aws_env
