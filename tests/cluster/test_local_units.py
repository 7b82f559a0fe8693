"""Pure parts of the local backend, the flow and `cluster.cli run`: plans, renderers, parsers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.backend import Storage
from cluster.cli import UsageError, build_parser, check_args, job_from_args, options_from_args
from cluster.exit_codes import failure_message, job_exit_code, worker_exit_codes
from cluster.flow import Attempt, FlowResult, format_summary, is_trainer_message, trainer_config_for
from cluster.job import JobSpec, trainer_config
from cluster.launch import horovodrun_command
from cluster.local import network, procs, ssh
from cluster.local.backend import storage_for
from cluster.run_data import DatasetSpec
from infra.storage_layout import bucket_names
from tests.summaries import run_summary
from train.config import to_argv
from train.contract import EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE, cores_per_worker

REPO = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")  # the console script


# ---------------------------------------------------------------- network plan
def test_isolated_plan_gives_distinct_hosts_on_the_cluster_subnet():
    plan = network.plan_network(37, 3, isolated=True)
    assert plan.iface == "rtbr37" and plan.bridge == "rtbr37"
    assert plan.driver_address == "10.213.37.1"
    assert [h.address for h in plan.hosts] == ["10.213.37.10", "10.213.37.11", "10.213.37.12"]
    assert [h.name for h in plan.hosts] == ["host-0", "host-1", "host-2"]
    assert all(h.netns.startswith(network.NETNS_PREFIX + "37-") for h in plan.hosts)
    # The launcher pod's host: one more namespace on the bridge; every namespace names its NIC eth0,
    # as a pod's interface is named on EKS (the MPIJob's --network-interfaces).
    assert plan.launcher.address == "10.213.37.2" and plan.launcher.netns == "ringtrain-37-launcher"
    assert plan.pod_iface == "eth0"
    assert len({h.mac for h in (*plan.hosts, plan.launcher)}) == 4
    # Linux interface names are at most 15 characters.
    big = network.plan_network(254, 200, isolated=True)
    names = [n for h in (*big.hosts, big.launcher) for n in (h.veth_outer, h.veth_inner)]
    assert all(len(n) <= 15 for n in names) and len(big.iface) <= 15


def test_loopback_plan_uses_lo_and_distinct_loopback_addresses():
    plan = network.plan_network(5, 2, isolated=False)
    assert plan.iface == plan.pod_iface == "lo" and plan.bridge is None and plan.driver_address == "127.0.0.1"
    assert plan.launcher is None  # the launcher runs on localhost
    assert [h.address for h in plan.hosts] == ["127.213.5.10", "127.213.5.11"]
    assert all(h.netns is None for h in plan.hosts)


@pytest.mark.parametrize("index,n", [(0, 2), (255, 2), (3, 0), (3, 201)])
def test_plan_rejects_out_of_range(index, n):
    with pytest.raises(ValueError):
        network.plan_network(index, n, isolated=True)


def test_host_mac_is_fixed_per_host_and_locally_administered():
    assert network.host_mac(37, 1) == network.host_mac(37, 1) == "02:72:74:25:00:01"
    assert network.host_mac(37, 1) != network.host_mac(38, 1)
    assert int(network.host_mac(200, 300).split(":")[0], 16) & 0b10  # locally administered bit


def test_namespace_hosts_file_maps_every_host_and_its_pods_names_to_its_address():
    plan = network.plan_network(9, 2, isolated=True)
    text = network.hosts_file_for(plan)
    assert "10.213.9.11 host-1" in text.splitlines()
    assert "10.213.9.10 host-0" in text.splitlines()
    assert "10.213.9.2 launcher" in text.splitlines()
    assert "127.0.0.1 localhost" in text.splitlines()
    pods = network.hosts_file_for(plan, {"host-1": ["j-worker-0.j.training.svc", "j-worker-0"]})
    assert "10.213.9.11 host-1 j-worker-0.j.training.svc j-worker-0" in pods.splitlines()


def test_in_netns_runs_the_command_inside_the_namespace_with_the_hosts_name():
    plan = network.plan_network(9, 2, isolated=True)
    cmd = network.in_netns(plan.hosts[0], ["/usr/sbin/sshd", "-D"])
    assert cmd[:4] == ["ip", "netns", "exec", "ringtrain-9-host-0"]
    assert "--uts" in cmd and cmd[-3:] == ["host-0", "/usr/sbin/sshd", "-D"]
    as_pod = network.in_netns(plan.hosts[0], ["x"], hostname="j-worker-0")
    assert as_pod[-2:] == ["j-worker-0", "x"]
    loop = network.plan_network(9, 2, isolated=False)
    assert network.in_netns(loop.hosts[0], ["x"]) == ["x"]


# ---------------------------------------------------------------- ssh and discovery
def test_sshd_config_accepts_only_the_cluster_key_on_one_address():
    text = ssh.sshd_config(address="10.1.2.3", port=2222, host_key=Path("/k/host"),
                           authorized_keys=Path("/k/auth"))
    lines = text.splitlines()
    for expected in ("ListenAddress 10.1.2.3", "Port 2222", "HostKey /k/host", "AuthorizedKeysFile /k/auth",
                     "PasswordAuthentication no", "UsePAM no"):
        assert expected in lines


def test_ssh_client_config_keeps_no_known_hosts_and_uses_the_cluster_key():
    text = ssh.ssh_client_config(port=2222, identity_file=Path("/k/id"), user="me")
    for expected in ("  User me", "  Port 2222", "  IdentityFile /k/id", "  UserKnownHostsFile /dev/null",
                     "  StrictHostKeyChecking no", "  BatchMode yes"):
        assert expected in text.splitlines()
    wrapper = ssh.ssh_wrapper_script("/usr/bin/ssh", Path("/k/cfg"))
    assert wrapper.endswith('exec /usr/bin/ssh -F /k/cfg "$@"\n')
    # Without namespaces the pods' names reach their hosts through the client's configuration.
    named = ssh.ssh_client_config(port=1, identity_file=Path("/k/id"), user="me",
                                  names={"j-worker-0.j.training.svc": "127.213.5.10"})
    assert named.startswith("Host j-worker-0.j.training.svc\n  HostName 127.213.5.10\nHost *\n")


def test_workers_are_the_processes_horovod_started():
    assert procs.is_worker_environment({"HOROVOD_RANK": "0", "PATH": "/bin"})
    assert not procs.is_worker_environment({"PATH": "/bin"})


# ---------------------------------------------------------------- storage, summary, exit codes
def test_local_storage_uses_the_stacks_bucket_layout():
    assert bucket_names("rt") == ("rt-datasets", "rt-checkpoints")
    s = storage_for("rt", "job-1", "demo", "http://10.0.0.1:9000", {"A": "b"})
    assert s.dataset_uri == "s3://rt-datasets/datasets/demo"
    assert s.checkpoint_uri == "s3://rt-checkpoints/checkpoints/job-1"
    assert s.endpoint_url == "http://10.0.0.1:9000" and s.env == {"A": "b"}


def test_worker_exit_codes_come_from_horovodruns_lines():
    lines = ["Process 1 exit with status code 75.", "x", "Process 0 exit with status code 143."]
    assert worker_exit_codes(lines) == {1: 75, 0: 143}


@pytest.mark.parametrize("rc,codes,summary,expected", [
    (0, {}, {"interrupted": False}, 0),
    (1, {1: 75}, {"interrupted": True}, EXIT_INTERRUPTED_RESUMABLE),  # horovodrun says 1; trainer said 75
    (1, {1: 75, 0: 75}, {}, EXIT_INTERRUPTED_RESUMABLE),               # summary lost, codes agree
    (1, {0: 2, 1: 2}, {}, EXIT_BAD_INPUT),
    # A worker exits 75 only after rank 0's checkpoint (the trainer's exit barrier); 143: killed.
    (1, {1: 75, 0: 143}, {}, EXIT_INTERRUPTED_RESUMABLE),
    (1, {1: 75, 0: 2}, {}, EXIT_BAD_INPUT),
    (1, {1: 143, 0: 3}, {}, 3),
    (1, {}, {}, 1),
])
def test_job_exit_code_recovers_the_trainers_meaning(rc, codes, summary, expected):
    lines = [f"Process {rank} exit with status code {code}." for rank, code in codes.items()]
    if summary:
        lines.append("[0]<stdout>:" + run_summary(**summary).line())
    assert job_exit_code(rc, lines) == expected
    assert job_exit_code(None, lines) is None  # the launcher has not ended


# ---------------------------------------------------------------- flow helpers
def test_the_flow_adds_data_checkpoints_endpoint_and_elastic_to_the_trainer_config():
    st = Storage(dataset_uri="s3://d/datasets/x", checkpoint_uri="s3://c/checkpoints/j", endpoint_url="http://e:1")
    job = JobSpec(name="j", num_hosts=2, elastic=True, trainer=trainer_config(("--steps", "10")))
    cfg = trainer_config_for(job, st, DatasetSpec())
    assert cfg.steps == 10 and cfg.data.source == "s3://d/datasets/x"
    assert cfg.checkpoint.uri == "s3://c/checkpoints/j" and cfg.s3_endpoint_url == "http://e:1"
    assert cfg.horovod.elastic and not cfg.metrics.progress
    assert to_argv(cfg) == ["--steps", "10", "--data", "s3://d/datasets/x", "--checkpoint-dir", "s3://c/checkpoints/j",
                            "--s3-endpoint-url", "http://e:1", "--elastic", "--no-progress"]
    # What the job already says wins, `--data synthetic` too; AWS storage has no endpoint.
    for data in ("s3://mine/x", "synthetic"):
        job2 = JobSpec(name="j", num_hosts=1, trainer=trainer_config(("--data", data)))
        cfg2 = trainer_config_for(job2, Storage("s3://d/x", "s3://c/y"), DatasetSpec())
        assert cfg2.data.source == data and cfg2.s3_endpoint_url is None and not cfg2.horovod.elastic
        assert to_argv(cfg2)[:2] == ["--data", data]


def test_the_launch_command_names_hosts_by_list_or_by_the_operators_hostfile():
    job = JobSpec(name="j", num_hosts=2, trainer=trainer_config(("--steps", "3")))
    cmd = horovodrun_command(job, hosts=["10.213.1.10:1", "10.213.1.11"], python="/venv/python",
                             network_interface="eth0")
    assert cmd[:6] == ["horovodrun", "--gloo", "-np", "2", "-H", "10.213.1.10:1,10.213.1.11:1"]
    assert cmd[-5:] == ["/venv/python", "-m", "train", "--steps", "3"]
    assert cmd[cmd.index("--network-interfaces") + 1] == "eth0"
    from_file = horovodrun_command(job, hostfile="/etc/mpi/hostfile")
    assert from_file[2:6] == ["-np", "2", "--hostfile", "/etc/mpi/hostfile"]
    for bad in ({}, {"hosts": ["a"], "hostfile": "/f"}):
        with pytest.raises(ValueError, match="either its hostfile or its host list"):
            horovodrun_command(job, **bad)
    with pytest.raises(ValueError, match="discovery script"):
        horovodrun_command(JobSpec(name="e", num_hosts=2, elastic=True))


def test_trainer_messages_are_shown_and_horovod_chatter_is_not():
    assert is_trainer_message("[0]<stderr>:train: error: --steps 0: must be >= 1")
    assert is_trainer_message("[1]<stderr>:ringtrain: elastic reset, now 1 workers")
    assert not is_trainer_message("Process 1 exit with status code 75.")
    assert not is_trainer_message("RuntimeError: Horovod detected that one or more processes exited")


def test_format_summary_shows_loss_throughput_checkpoints_and_the_resume():
    a1 = Attempt(75, run_summary(steps=50, initial_loss=2.3, final_loss=1.0, checkpoints_written=3,
                                 resumed_from_step=None, interrupted=True), ["host-0", "host-1"])
    a2 = Attempt(0, run_summary(steps=100, initial_loss=1.0, final_loss=0.25, checkpoints_written=2,
                                resumed_from_step=50, samples_per_sec=123.4, world_size=2),
                 ["host-0", "host-1"])
    r = FlowResult(job="demo", succeeded=True, exit_code=0, attempts=[a1, a2], summary=a2.summary, metrics=[],
                   reclaimed=["host-1"], storage=None)
    text = format_summary(r)
    assert "2.3000 -> 0.2500" in text
    assert "123.4" in text and "checkpoints        5 written\n" in text  # none deferred: nothing said
    a2.summary = dataclasses.replace(a2.summary, checkpoints_deferred=2)
    late = "checkpoints        5 written, 2 deferred past their step (the previous write was still going)"
    assert late in format_summary(r)
    assert "resumed from step 50" in text and "interrupted (resumable)" in text
    assert "host-1" in text.splitlines()[-1]
    assert r.resumed
    assert "tokens/s" not in text and "evaluation" not in text  # the demo counts no tokens, evaluates nothing
    a2.summary = dataclasses.replace(a2.summary, eval={"eval_loss": 4.8686, "eval_perplexity": 130.137},
                                     throughput={"tokens_per_sec": 3596.8, "mfu": 0.412})
    r.summary = a2.summary
    text = format_summary(r)
    assert "  tokens/s           3597, MFU 41.2% (last attempt)\n" in text
    assert f"  evaluation         loss 4.8686, perplexity 130.1370 (step {a2.summary.steps})\n" in text


# ---------------------------------------------------------------- CLI
def _args(*argv):
    return build_parser().parse_args(["run", *argv])


def test_cli_defaults_build_a_two_host_job_with_a_reclaim_halfway():
    a = _args()
    check_args(a)
    job = job_from_args(a)
    opts = options_from_args(a, job)
    assert job.num_hosts == 2 and not job.elastic
    assert job.trainer.steps == 300
    assert opts.reclaim_at_step == 150 and not opts.keep_up and opts.restore_after_s is None


def test_cli_gives_elastic_reclaims_an_interruption_notice():
    from cluster.cli import make_backend

    assert make_backend(_args()).reclaim_notice_s == 0
    assert make_backend(_args("--elastic")).reclaim_notice_s == 3
    assert make_backend(_args("--elastic", "--reclaim-notice", "0")).reclaim_notice_s == 0
    assert make_backend(_args("--reclaim-grace", "2")).reclaim_grace_s == 2
    assert make_backend(_args()).reclaim_grace_s == 30  # room for the image example's stop checkpoint


def test_cli_elastic_passes_trainer_args_and_restores_the_host_later():
    a = _args("--elastic", "--hosts", "3", "--min-hosts", "2", "--steps", "40", "--", "--lr", "0.1")
    check_args(a)
    job = job_from_args(a)
    opts = options_from_args(a, job)
    assert job.elastic and job.min_hosts == 2 and job.num_hosts == 3
    assert job.trainer.optim.lr == 0.1 and job.trainer.steps == 40
    assert opts.reclaim_at_step == 20 and opts.restore_after_s == 5.0
    assert options_from_args(_args("--no-reclaim"), job).reclaim_at_step is None


@pytest.mark.parametrize("argv,needle", [
    (["--hosts", "0"], "--hosts 0"),
    (["--steps", "0"], "--steps 0"),
    (["--reclaim-at-step", "301"], "--reclaim-at-step 301"),   # 300 (= --steps) is a late reclaim
    (["--max-restarts", "-1"], "--max-restarts -1"),
    (["--step-pace", "-1"], "--step-pace -1"),
    (["--hang-timeout", "5"], "only with --fault hang"),
    (["--fault", "kill", "--no-reclaim"], "choose one"),
    (["--min-hosts", "1"], "only with --elastic"),
    (["--elastic", "--min-hosts", "3"], "--min-hosts 3"),
    (["--reclaim-host", "host-7"], "host-0 .. host-1"),
    (["--backend", "aws"], "--stack"),
    (["--stack", "dev"], "only with --backend aws"),
    (["--job-name", "Bad_Name"], "--job-name"),
    (["stray"], "after `--`"),
])
def test_cli_rejects_bad_arguments_naming_what_is_wrong(argv, needle):
    # (--fault itself is an argparse choice: a wrong one exits 2 naming the choices)
    with pytest.raises(UsageError, match=None) as e:
        check_args(_args(*argv))
    assert needle in str(e.value)


def test_cli_bad_input_is_one_message_and_exit_2_without_traceback():
    done = subprocess.run([RINGTRAIN, "run", "--hosts", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "run: error: --hosts 0: must be between 1 and 32" in done.stderr
    assert "Traceback" not in done.stderr


HOROVODRUN_FAILURE = [
    "Process 1 exit with status code 2.",
    "Terminating remaining workers after failure of Process 1.",
    "Traceback (most recent call last):",
    '  File "/venv/bin/horovodrun", line 7, in <module>',
    "    sys.exit(run_commandline())",
    "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing",
    "Process name: 1",
    "Exit code: 2",
    "",
]


def test_failure_message_prefers_the_trainers_words_then_the_worker_exits():
    with_msg = ["[1]<stderr>:train: error: --lr -1.0: must be > 0", *HOROVODRUN_FAILURE]
    assert failure_message(2, with_msg) == "exit code 2: train: error: --lr -1.0: must be > 0"
    assert failure_message(2, HOROVODRUN_FAILURE) == "exit code 2: Process 1 exit with status code 2."
    assert failure_message(75, []) == "interrupted after a checkpoint (resumable)"


def test_horovodruns_own_traceback_is_dropped_from_failure_output():
    from cluster.flow import without_launcher_traceback

    assert without_launcher_traceback(HOROVODRUN_FAILURE) == HOROVODRUN_FAILURE[:2]
    # A worker's own traceback is the interesting part and stays.
    worker = ["[0]<stderr>:Traceback (most recent call last):", "[0]<stderr>:ValueError: boom"]
    assert without_launcher_traceback(worker) == worker
    other = ["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'k'"]
    assert without_launcher_traceback(other) == other


def test_cli_rejects_bad_trainer_arguments_before_standing_anything_up(capsys):
    from cluster import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--", "--lr", "-1"])
    assert e.value.code == 2
    assert "run: error: trainer arguments: --lr -1.0: must be > 0" in capsys.readouterr().err


def test_only_clusters_whose_owner_is_gone_count_as_stale(tmp_path):
    import json

    import psutil

    from cluster.local import reaper

    me = psutil.Process()
    live = tmp_path / "ringtrain-local-live"
    dead = tmp_path / "ringtrain-local-dead"
    reused = tmp_path / "ringtrain-local-reused"       # same pid, another process (pid reuse)
    starting = tmp_path / "ringtrain-local-starting"   # owner record not written yet
    other = tmp_path / "someone-else"
    for d in (live, dead, reused, starting, other):
        d.mkdir()
    (live / "owner.json").write_text(json.dumps(reaper.owner_record(me.pid, me.create_time())))
    (dead / "owner.json").write_text(json.dumps(reaper.owner_record(2**22 + 7, 0.0)))
    (reused / "owner.json").write_text(json.dumps(reaper.owner_record(me.pid, me.create_time() - 3600)))
    (other / "owner.json").write_text(json.dumps(reaper.owner_record(2**22 + 7, 0.0)))
    assert reaper.stale_workdirs(tmp_path) == [dead, reused]


def test_local_workers_share_the_machines_cores():
    assert cores_per_worker(2, 2) == 1
    assert cores_per_worker(16, 4) == 4
    assert cores_per_worker(2, 3) == 1   # never zero


def test_cli_task_travels_in_the_trainer_argv_and_demo_keeps_its_model_flag():
    demo = job_from_args(_args("--model", "cnn"))
    assert demo.trainer.task.name == "demo" and demo.trainer.task.args.model == "cnn"
    assert "--task" not in to_argv(demo.trainer) and to_argv(demo.trainer)[-2:] == ["--model", "cnn"]
    task = f"{Path(__file__).parents[1] / 'train' / 'user_task.py'}:ParityTask"
    a = _args("--task", task, "--", "--data", "synthetic", "--hidden", "8")
    check_args(a)
    job = job_from_args(a)
    assert to_argv(job.trainer)[:2] == ["--task", task]
    assert job.trainer.task.args.hidden == 8 and job.trainer.task.argv == ("--hidden", "8")
    assert to_argv(job.trainer)[-2:] == ["--hidden", "8"]
    with pytest.raises(UsageError) as e:
        check_args(_args("--task", "image", "--model", "cnn"))
    assert "--model cnn: the demo task's model; --task image takes its own flags after `--`" in str(e.value)


def test_the_etc_mpi_mount_point_goes_with_its_creator_once_no_launcher_uses_it(tmp_path, monkeypatch):
    path = tmp_path / "mpi"
    mine = network.claim_mount_point(path)
    assert mine.created and path.is_dir()
    theirs = network.claim_mount_point(path)
    assert not theirs.created
    theirs.release()
    assert path.is_dir()  # not theirs to remove
    namespaces = ["ringtrain-7-launcher"]
    monkeypatch.setattr(network, "list_namespaces", lambda prefix=network.NETNS_PREFIX: list(namespaces))
    mine.release()
    assert path.is_dir()  # another cluster's launcher still binds over it
    namespaces[:] = ["ringtrain-7-host-0"]
    mine.release()
    assert not path.exists()


def test_adasum_is_refused_for_a_multi_worker_cluster_launch():
    """The launcher is always `horovodrun --gloo`, and Horovod has Adasum only over MPI."""
    from cluster.job import JobSpec, trainer_config

    with pytest.raises(ValueError, match="--adasum with 2 workers: the cluster launch runs Horovod"):
        JobSpec(name="j", num_hosts=2, trainer=trainer_config(("--adasum",)))
    JobSpec(name="j", num_hosts=1, trainer=trainer_config(("--adasum",)))  # one worker: no Adasum


def test_the_fault_demo_paces_elastic_runs_and_gives_a_hang_its_watchdog_limit():
    from cluster.cli import ELASTIC_DEMO_STEP_PACE_S, HANG_DEMO_TIMEOUT_S, job_from_args, with_fault_settings
    from train.contract import FAULT_STEP_SLEEP_ENV

    a = _args("--elastic")
    job = with_fault_settings(job_from_args(a), a)
    assert job.env[FAULT_STEP_SLEEP_ENV] == f"{ELASTIC_DEMO_STEP_PACE_S:g}"
    a = _args("--fault", "hang")
    job = with_fault_settings(job_from_args(a), a)
    assert FAULT_STEP_SLEEP_ENV not in job.env
    assert job.trainer.health.hang_timeout_s == HANG_DEMO_TIMEOUT_S
    assert to_argv(job.trainer)[-2:] == ["--hang-timeout", f"{HANG_DEMO_TIMEOUT_S:g}"]
    a = _args("--fault", "hang", "--", "--hang-timeout", "300")   # the trainer's own default, named: kept
    assert with_fault_settings(job_from_args(a), a).trainer.health.hang_timeout_s == 300
    a = _args("--fault", "kill", "--max-restarts", "4")
    opts = options_from_args(a, job_from_args(a))
    assert (opts.fault, opts.max_restarts, opts.reclaim_at_step) == ("kill", 4, 150)
