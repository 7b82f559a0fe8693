"""The image entrypoint's logic on CPU: hardware facts come from fakes (a fake sysfs tree, fake
nvidia-smi / fi_info / horovodrun / ssh-keygen on PATH); the 2-rank allreduce and the hand-over are real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.helpers import ENV_FILE, IMAGE_DIR, fake_executable, load_entry_module, load_image_module

ep = load_image_module("entrypoint")
entry_host = load_entry_module("host")
selftest = load_entry_module("selftest")
entry_settings = load_entry_module("settings")
supervisor = load_entry_module("supervisor")
ENTRYPOINT = IMAGE_DIR / "entrypoint.py"

CHECK_BUILD_CPU = """Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [ ] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [ ] MPI
""" + "    [X] Gloo    \n"  # the real output ends in trailing spaces
CHECK_BUILD_CUDA = (CHECK_BUILD_CPU.replace("[ ] MPI\n    [X] Gloo\n", "[X] MPI\n    [X] Gloo\n")
                    .replace("[ ] NCCL", "[X] NCCL"))
NVIDIA_SMI_2 = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)\n"
)
FI_INFO_EFA = "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    type: FI_EP_RDM\n"


def settings(**kw):
    base = dict(expect_gpus=None, expect_efa=None, require=entry_settings.DEFAULT_REQUIRE, timeout_s=30.0)
    base.update(kw)
    return entry_settings.Settings(**base)


def fake_host(tmp_path: Path, *, check_build: str | None = CHECK_BUILD_CUDA, check_build_rc: int = 0,
              nvidia_smi: str | None = None, fi_info: str | None = None, fi_info_rc: int = 0,
              nccl_log: str | None = None) -> entry_host.Host:
    """A Host whose PATH holds only the fakes asked for; its interpreter is this test's Python.

    With `nccl_log`, the fake horovodrun also runs an allreduce: every rank of `-np N` reports success,
    and the ranks print `nccl_log` only when NCCL_DEBUG=INFO reaches them (as NCCL logs nothing else)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if check_build is not None:
        fake_executable(bin_dir, "horovodrun", f"""
            import os, sys
            LOG = {nccl_log!r}
            if sys.argv[1:] == ["--check-build"]:
                sys.stdout.write({check_build!r}); sys.exit({check_build_rc})
            if LOG is None:
                sys.exit("fake horovodrun only answers --check-build")
            args = sys.argv[1:]
            n = int(args[args.index("-np") + 1])
            device = args[args.index("--device") + 1]
            subsys = os.environ.get("NCCL_DEBUG_SUBSYS", "")
            logging = os.environ.get("NCCL_DEBUG") == "INFO" and "NET" in subsys
            for r in range(n):
                if logging:
                    for line in LOG.splitlines():
                        print(f"[{{r}}]<stdout>:{{line}}")
                print(f"[{{r}}]<stdout>:{selftest.ALLREDUCE_OK} rank={{r}} size={{n}} device={{device}}")
        """)
    if nvidia_smi is not None:
        fake_executable(bin_dir, "nvidia-smi", f"""
            import sys
            assert sys.argv[1:] == ["-L"]
            print({nvidia_smi!r})
        """)
    if fi_info is not None:
        fake_executable(bin_dir, "fi_info", f"""
            import sys
            assert sys.argv[1:] == ["-p", "efa", "-t", "FI_EP_RDM"], sys.argv
            print({fi_info!r}); sys.exit({fi_info_rc})
        """)
    sysfs = tmp_path / "sys" / "class" / "infiniband"
    # A "python" that has no torch, so the GPU count's fallback finds none quickly.
    no_torch = fake_executable(bin_dir, "python-without-torch", "raise SystemExit('No module named torch')")
    return entry_host.Host(env={"PATH": str(bin_dir)}, sysfs_infiniband=sysfs, python=str(no_torch))


def make_rdma_device(sysfs: Path, name: str, driver: str) -> None:
    """/sys/class/infiniband/<name>/device/driver -> .../drivers/<driver>, as the kernel lays it out."""
    drivers = sysfs.parent.parent / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    device = sysfs / name / "device"
    device.mkdir(parents=True)
    (device / "driver").symlink_to(drivers)


# --------------------------------------------------------------------------------------------------
# check-build


def test_parse_check_build_reads_sections():
    sections = selftest.parse_check_build(CHECK_BUILD_CPU)
    assert sections["Available Frameworks"]["PyTorch"] is True
    assert sections["Available Controllers"] == {"MPI": False, "Gloo": True}
    assert sections["Available Tensor Operations"]["NCCL"] is False
    assert selftest.missing_from_build(sections, entry_settings.DEFAULT_REQUIRE) == ["MPI", "NCCL"]
    sections = selftest.parse_check_build(CHECK_BUILD_CUDA)
    assert selftest.missing_from_build(sections, entry_settings.DEFAULT_REQUIRE) == []


def test_mpi_as_tensor_operation_does_not_count_as_the_mpi_controller():
    only_op = CHECK_BUILD_CUDA.replace("[X] MPI\n    [X] Gloo\n", "[ ] MPI\n    [X] Gloo\n", 1)
    only_op = only_op.replace("    [ ] MPI\n    [X] Gloo    ", "    [X] MPI\n    [X] Gloo    ")
    assert selftest.missing_from_build(selftest.parse_check_build(only_op), ["MPI"]) == ["MPI"]


def test_check_build_passes_on_the_cuda_build(tmp_path):
    r = selftest.check_horovod_build(fake_host(tmp_path), settings())
    assert r.ok and "PyTorch, Gloo, MPI, NCCL" in r.detail


def test_check_build_names_what_the_cpu_build_lacks(tmp_path):
    r = selftest.check_horovod_build(fake_host(tmp_path, check_build=CHECK_BUILD_CPU), settings())
    assert not r.ok and r.detail == "Horovod was built without MPI, NCCL"


def test_check_build_fails_without_horovodrun_or_when_it_fails(tmp_path):
    no_horovodrun = fake_host(tmp_path, check_build=None)
    assert "not installed" in selftest.check_horovod_build(no_horovodrun, settings()).detail
    broken = fake_host(tmp_path / "b", check_build="ImportError: libmpi.so.40", check_build_rc=1)
    r = selftest.check_horovod_build(broken, settings())
    assert not r.ok and "exited 1" in r.detail and "libmpi" in r.detail


# --------------------------------------------------------------------------------------------------
# GPUs


def test_gpu_count_from_nvidia_smi(tmp_path):
    host = fake_host(tmp_path, nvidia_smi=NVIDIA_SMI_2)
    assert selftest.visible_gpus(host, 30) == (2, "nvidia-smi")
    assert selftest.check_gpus(2, "nvidia-smi", None).ok
    r = selftest.check_gpus(2, "nvidia-smi", 8)
    assert not r.ok and r.detail == "2 visible (nvidia-smi), need at least 8"


def test_no_gpu_fails_by_default_and_is_skipped_when_not_expected(tmp_path):
    count, source = selftest.visible_gpus(fake_host(tmp_path), 30)
    assert count == 0
    assert not selftest.check_gpus(count, source, None).ok
    skipped = selftest.check_gpus(count, source, 0)
    assert skipped.ok and skipped.skipped


def test_allreduce_runs_nccl_on_every_gpu_with_two_or_with_efa():
    assert [selftest.plan_allreduce(n, efa=False) for n in (0, 1, 2, 8)] == [
        ("cpu", 2), ("cpu", 2), ("cuda", 2), ("cuda", 8)]
    # With EFA expected even one GPU runs NCCL: only NCCL can show the EFA provider in use.
    assert [selftest.plan_allreduce(n, efa=True) for n in (0, 1, 4)] == [("cpu", 2), ("cuda", 1), ("cuda", 4)]


# --------------------------------------------------------------------------------------------------
# EFA


def test_efa_devices_are_recognised_by_driver_not_name(tmp_path):
    sysfs = tmp_path / "sys" / "class" / "infiniband"
    make_rdma_device(sysfs, "rdmap16s27", "efa")
    make_rdma_device(sysfs, "rdmap32s27", "efa")
    make_rdma_device(sysfs, "mlx5_0", "mlx5_core")
    assert selftest.efa_devices(sysfs) == ["rdmap16s27", "rdmap32s27"]
    assert selftest.efa_devices(tmp_path / "absent") == []


def test_efa_auto_without_devices_is_a_skip(tmp_path):
    r = selftest.check_efa(fake_host(tmp_path), settings())
    assert r.ok and r.skipped


def test_efa_devices_with_a_working_provider_pass(tmp_path):
    host = fake_host(tmp_path, fi_info=FI_INFO_EFA)
    make_rdma_device(host.sysfs_infiniband, "rdmap16s27", "efa")
    r = selftest.check_efa(host, settings())
    assert r.ok and not r.skipped and "rdmap16s27" in r.detail
    assert selftest.check_efa(host, settings(expect_efa=1)).ok


def test_efa_devices_without_the_provider_fail(tmp_path):
    host = fake_host(tmp_path, fi_info="fi_getinfo: -61 (No data available)", fi_info_rc=61)
    make_rdma_device(host.sysfs_infiniband, "rdmap16s27", "efa")
    r = selftest.check_efa(host, settings())
    assert not r.ok and "efa provider is not usable" in r.detail


def test_efa_devices_without_fi_info_fail(tmp_path):
    host = fake_host(tmp_path)
    make_rdma_device(host.sysfs_infiniband, "rdmap16s27", "efa")
    assert "fi_info is not installed" in selftest.check_efa(host, settings()).detail


def test_expected_efa_count_must_be_met(tmp_path):
    host = fake_host(tmp_path, fi_info=FI_INFO_EFA)
    make_rdma_device(host.sysfs_infiniband, "rdmap16s27", "efa")
    r = selftest.check_efa(host, settings(expect_efa=4))
    assert not r.ok and "1 EFA devices" in r.detail and "need 4" in r.detail
    none = selftest.check_efa(fake_host(tmp_path / "none", fi_info=FI_INFO_EFA), settings(expect_efa=1))
    assert not none.ok
    assert selftest.check_efa(host, settings(expect_efa=0)).skipped


# --------------------------------------------------------------------------------------------------
# Configuration and invocation


def test_invocations():
    env = {}
    assert entry_settings.parse_invocation(["selftest"], env) == entry_settings.Invocation("selftest", ())
    assert entry_settings.parse_invocation(["sshd"], env) == entry_settings.Invocation("sshd", ())
    parse, Invocation = entry_settings.parse_invocation, entry_settings.Invocation
    assert parse(["train", "--epochs", "3"], env) == Invocation("train", ("--epochs", "3"))
    assert parse(["train", "--", "--selftest"], env) == Invocation("train", ("--selftest",))
    launcher = entry_settings.parse_invocation(["launcher", "--", "horovodrun", "-np", "2"], env)
    assert launcher == entry_settings.Invocation("launcher", ("horovodrun", "-np", "2"))


@pytest.mark.parametrize(
    "argv, env, message",
    [
        ([], {}, "no mode given"),
        (["serve"], {}, "unknown mode 'serve'"),
        (["launcher"], {}, "needs the command to run"),
        (["sshd", "-p", "2222"], {}, "takes no arguments"),
        # The self-test never precedes the trainer or the launcher: it is the worker's init container.
        (["launcher", "--", "horovodrun"], {"RINGTRAIN_SELFTEST": "1"}, "mode 'launcher' runs no self-test"),
        (["launcher", "--selftest", "--", "horovodrun"], {}, "mode 'launcher' runs no self-test"),
        (["train"], {"RINGTRAIN_SELFTEST": "0"}, "mode 'train' runs no self-test"),
        (["train", "--selftest"], {}, "run `entrypoint.py selftest`, as the MPIJob's worker init container"),
    ],
)
def test_bad_invocations_are_refused_with_one_message(argv, env, message):
    with pytest.raises(entry_settings.UsageError, match=message):
        entry_settings.parse_invocation(argv, env)


def test_settings_parse_and_refuse():
    s = entry_settings.parse_settings({"RINGTRAIN_EXPECT_GPUS": "8", "RINGTRAIN_EXPECT_EFA": "auto"})
    default_require = entry_settings.DEFAULT_REQUIRE
    assert (s.expect_gpus, s.expect_efa, s.require, s.timeout_s) == (8, None, default_require, 180.0)
    with pytest.raises(entry_settings.UsageError, match="RINGTRAIN_EXPECT_GPUS='many'"):
        entry_settings.parse_settings({"RINGTRAIN_EXPECT_GPUS": "many"})
    with pytest.raises(entry_settings.UsageError, match="names Horovod; allowed: PyTorch"):
        entry_settings.parse_settings({"RINGTRAIN_SELFTEST_REQUIRE": "PyTorch,Horovod"})
    with pytest.raises(entry_settings.UsageError, match="RINGTRAIN_SELFTEST_TIMEOUT"):
        entry_settings.parse_settings({"RINGTRAIN_SELFTEST_TIMEOUT": "-5"})


def test_env_file_parsing_and_defaults_never_override():
    sections = entry_settings.parse_env_file(ENV_FILE.read_text())
    defaults = entry_settings.network_defaults(sections, "efa")
    assert defaults["FI_EFA_USE_HUGE_PAGE"] == "0" and defaults["OMPI_MCA_pml"] == "^ucx"
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    applied = entry_settings.apply_env_defaults(env, defaults)
    assert env["NCCL_SOCKET_IFNAME"] == "eth0", "a value the pod sets wins"
    assert "NCCL_SOCKET_IFNAME" not in applied and env["FI_EFA_USE_HUGE_PAGE"] == "0"
    with pytest.raises(entry_settings.UsageError, match="x.env:3: 'export A=1' is not KEY=VALUE"):
        entry_settings.parse_env_file("# c\n[common]\nexport A=1\n", "x.env")
    with pytest.raises(entry_settings.UsageError, match="A is set twice"):
        entry_settings.parse_env_file("[common]\nA=1\nA=2\n")


# --------------------------------------------------------------------------------------------------
# The self-test as a whole and the hand-over (main with an injected exec)


def test_failed_selftest_exits_1_and_hands_over_to_nothing(tmp_path, capsys):
    host = fake_host(tmp_path, check_build=CHECK_BUILD_CPU)
    execs = []
    rc = ep.main(["selftest"], env={"RINGTRAIN_EXPECT_GPUS": "0"},
                 exec_fn=lambda cmd, env: execs.append(cmd), host=host)
    out = capsys.readouterr().out
    assert rc == entry_settings.EXIT_SELFTEST_FAILED and execs == []
    assert "selftest: FAIL horovod check-build: Horovod was built without MPI, NCCL" in out
    assert "selftest: FAIL allreduce: not run" in out
    assert "selftest: FAILED" in out


def test_the_launcher_never_reads_the_selftest_settings(tmp_path):
    """The launcher image has no GPU: its mode must not parse (or run) anything of the self-test."""
    execs = []
    rc = ep.main(["launcher", "--", "horovodrun", "-np", "2"], env={"RINGTRAIN_EXPECT_EFA": "lots"},
                 exec_fn=lambda cmd, env: execs.append(cmd), host=fake_host(tmp_path))
    assert rc == 0 and execs == [["horovodrun", "-np", "2"]]


NCCL_OVER_EFA = (
    "ip-10-0-1-5:77:77 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)\n"
    "ip-10-0-1-5:77:77 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)\n"
    "ip-10-0-1-5:77:77 [0] NCCL INFO Using network Libfabric\n"
)
NCCL_OVER_SOCKETS = (
    "ip-10-0-1-5:77:77 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so\n"
    "ip-10-0-1-5:77:77 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.5<0>\n"
    "ip-10-0-1-5:77:77 [0] NCCL INFO Using network Socket\n"
)
NVIDIA_SMI_4 = "".join(f"GPU {i}: NVIDIA A10G (UUID: GPU-{i}{i}{i})\n" for i in range(4))


def efa_node(tmp_path: Path, nccl_log: str, *, check_build: str = CHECK_BUILD_CUDA) -> entry_host.Host:
    """A g5.12xlarge-like node: 4 GPUs, one EFA device with a working libfabric provider."""
    host = fake_host(tmp_path, check_build=check_build, nvidia_smi=NVIDIA_SMI_4, fi_info=FI_INFO_EFA,
                     nccl_log=nccl_log)
    make_rdma_device(host.sysfs_infiniband, "rdmap0s6", "efa")
    return host


def test_on_efa_nodes_nccl_must_report_the_efa_provider(tmp_path):
    lines = []
    ok = selftest.run_selftest(efa_node(tmp_path, NCCL_OVER_EFA), settings(expect_gpus=4, expect_efa=1),
                         emit=lines.append)
    assert ok, lines
    assert "selftest: PASS allreduce (4 ranks, NCCL on GPU): all 4 ranks got the expected sum" in lines
    assert any(line.startswith("selftest: PASS nccl over efa: ") and "Selected provider is efa" in line
               for line in lines), lines
    assert lines[-1] == "selftest: passed (5/5 ok)"


def test_nccl_over_sockets_fails_the_efa_node_early(tmp_path):
    lines = []
    ok = selftest.run_selftest(efa_node(tmp_path, NCCL_OVER_SOCKETS), settings(expect_gpus=4, expect_efa=1),
                         emit=lines.append)
    assert not ok
    (failure,) = [line for line in lines if "nccl over efa" in line]
    assert failure.startswith("selftest: FAIL nccl over efa: NCCL used network 'Socket', not the EFA "
                              "provider: the job would run over TCP")
    assert lines[-1] == "selftest: FAILED (4/5 ok)"


def test_the_efa_check_reads_nccls_own_log(tmp_path):
    """The EFA line only appears because the self-test turns NCCL's INFO log on for the allreduce."""
    host = efa_node(tmp_path, NCCL_OVER_EFA)
    result, output = selftest.check_allreduce(host, settings(), "cuda", 4)
    assert result.ok and selftest.NCCL_USES_EFA.search(output)
    quiet, _ = selftest.check_allreduce(host, settings(), "cpu", 2)  # Gloo: no NCCL log asked for
    assert quiet.ok and "NCCL INFO" not in _


def test_efa_not_expected_means_no_nccl_provider_check(tmp_path):
    lines = []
    node = efa_node(tmp_path, NCCL_OVER_SOCKETS)
    ok = selftest.run_selftest(node, settings(expect_gpus=4), emit=lines.append)
    assert ok and not any("nccl over efa" in line for line in lines), lines


def test_efa_expected_without_a_working_horovod_is_reported_not_run(tmp_path):
    lines = []
    host = efa_node(tmp_path, NCCL_OVER_EFA, check_build=CHECK_BUILD_CPU)
    assert not selftest.run_selftest(host, settings(expect_gpus=4, expect_efa=1), emit=lines.append)
    assert "selftest: FAIL nccl over efa: not run: Horovod's build check failed" in lines


def test_train_hands_over_to_the_trainer_with_env_defaults(tmp_path):
    execs = []
    env = {"RINGTRAIN_ENV_FILE": str(ENV_FILE), "FI_EFA_USE_HUGE_PAGE": "1"}
    rc = ep.main(["train", "--", "--steps", "5"], env=env,
                 exec_fn=lambda cmd, e: execs.append((cmd, dict(e))), host=fake_host(tmp_path))
    assert rc == 0
    (cmd, seen_env), = execs
    assert cmd == [fake_host(tmp_path).python, "-m", "train", "--steps", "5"]
    assert seen_env["OPAL_PREFIX"] == "/opt/amazon/openmpi"     # default applied
    assert seen_env["FI_EFA_USE_HUGE_PAGE"] == "1"              # the caller's value kept


def test_bad_configuration_exits_2_with_one_line(tmp_path, capsys):
    execs = []
    rc = ep.main(["selftest"], env={"RINGTRAIN_EXPECT_EFA": "lots"},
                 exec_fn=lambda cmd, env: execs.append(cmd), host=fake_host(tmp_path))
    err = capsys.readouterr().err
    assert rc == entry_settings.EXIT_USAGE and execs == []
    assert err.strip().splitlines() == [
        "entrypoint: error: RINGTRAIN_EXPECT_EFA='lots': use 'auto' or a whole number (0 skips the check)"]


def test_sshd_mode_checks_mounted_keys_makes_host_keys_then_supervises_sshd(tmp_path, monkeypatch, capsys):
    ssh_dir, key_dir, run_dir = tmp_path / "ssh", tmp_path / "etc-ssh", tmp_path / "run-sshd"
    ssh_dir.mkdir()
    key_dir.mkdir()
    host = fake_host(tmp_path)
    fake_executable(tmp_path / "bin", "ssh-keygen", f"""
        import sys, pathlib
        assert sys.argv[1:] == ["-A"]
        pathlib.Path({str(key_dir)!r}, "ssh_host_ed25519_key").write_text("key")
    """)
    monkeypatch.setattr(ep, "DEFAULT_HOST_KEY_DIR", key_dir)
    monkeypatch.setattr(ep, "SSHD_RUN_DIR", run_dir)
    execs, supervised = [], []
    env = {"RINGTRAIN_SSH_DIR": str(ssh_dir)}

    def supervise(cmd, e, grace_s):
        supervised.append((cmd, grace_s))
        return 0

    def run_main():
        return ep.main(["sshd"], env=env, exec_fn=lambda cmd, e: execs.append(cmd), host=host,
                       supervise_fn=supervise)

    assert run_main() == entry_settings.EXIT_USAGE and supervised == []
    assert "no authorized_keys in" in capsys.readouterr().err

    (ssh_dir / "authorized_keys").write_text("ssh-rsa AAAA launcher\n")
    assert run_main() == 0
    # sshd runs as a child of the entrypoint (which stays PID 1 to forward SIGTERM), never exec'd.
    grace_s = 100.0  # RINGTRAIN_STOP_GRACE_S's default (train.contract)
    assert execs == [] and supervised == [(["/usr/sbin/sshd", "-D", "-e"], grace_s)]
    assert "generated host keys" in capsys.readouterr().out
    assert (key_dir / "ssh_host_ed25519_key").exists() and run_dir.is_dir()
    # Keys exist now: the next start does not regenerate them.
    assert supervisor.prepare_sshd(ssh_dir, key_dir, run_dir, host) == []


def test_launcher_really_execs_the_command_with_the_env_defaults(tmp_path):
    """No fake exec: the entrypoint process is replaced by the command, whose exit status comes back."""
    code = "import os, sys; print(os.environ['PMIX_MCA_gds'], os.environ['NCCL_SOCKET_IFNAME']); sys.exit(7)"
    sections = entry_settings.parse_env_file(ENV_FILE.read_text())
    env = {k: v for k, v in os.environ.items() if not any(k in s for s in sections.values())}
    env["RINGTRAIN_ENV_FILE"] = str(ENV_FILE)
    res = subprocess.run([sys.executable, str(ENTRYPOINT), "launcher", "--", sys.executable, "-c", code],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 7, res.stderr
    assert res.stdout.strip() == "hash ^docker,lo,veth"


def test_launcher_with_a_missing_command_says_so(tmp_path):
    res = subprocess.run([sys.executable, str(ENTRYPOINT), "launcher", "--", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60, env={"PATH": os.defpath})
    assert res.returncode == 127
    missing = tmp_path / "nope"
    assert res.stderr.strip() == f"entrypoint: error: cannot run {missing}: No such file or directory"


# --------------------------------------------------------------------------------------------------
# The real thing on CPU: horovodrun, two Gloo ranks, through the entrypoint's own code path


@pytest.mark.slow
def test_selftest_runs_a_real_two_rank_gloo_allreduce():
    env = dict(os.environ, RINGTRAIN_EXPECT_GPUS="0", RINGTRAIN_EXPECT_EFA="0",
               RINGTRAIN_SELFTEST_REQUIRE="PyTorch,Gloo", RINGTRAIN_SELFTEST_TIMEOUT="120",
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', os.defpath)}")
    res = subprocess.run([sys.executable, str(ENTRYPOINT), "selftest"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "selftest: PASS horovod check-build: built with PyTorch, Gloo" in res.stdout
    assert "selftest: PASS allreduce (2 ranks, Gloo on CPU): all 2 ranks got the expected sum" in res.stdout
    assert res.stdout.strip().splitlines()[-1] == "selftest: passed (4/4 ok)"


@pytest.mark.slow
def test_allreduce_check_fails_when_a_rank_cannot_start(tmp_path):
    """The same horovodrun path, with a worker that cannot run: the check reports it and nothing hangs."""
    broken_python = fake_executable(tmp_path, "broken-python", "raise SystemExit(3)")
    host = entry_host.Host(env=dict(os.environ), python=str(broken_python))
    host.which = lambda name: str(Path(sys.executable).parent / name)  # the real horovodrun
    r, _ = selftest.check_allreduce(host, settings(timeout_s=120), "cpu")
    assert not r.ok and "ranks ok: []" in r.detail
