"""The entrypoint's sshd mode passes the pod's SIGTERM on to the trainers (spot safety on the cluster).

The /proc reading and the command-line matcher are checked on fakes; the forwarding itself runs for
real: the entrypoint's main() in its own process, a fake sshd (a script) that starts trainer-like
processes (`python -m train` from a fake `train` package, so the real matcher sees a real command line),
and a real SIGTERM; once as an ordinary process, once as PID 1 of its own PID namespace, as in a pod.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.image.helpers import IMAGE_DIR, fake_executable, load_entry_module, load_image_module

ep = load_image_module("entrypoint")
entry_settings = load_entry_module("settings")
supervisor = load_entry_module("supervisor")

# --------------------------------------------------------------------------------------------------
# The matcher and /proc, on fakes


@pytest.mark.parametrize(
    "argv, module",
    [
        (["python", "-m", "train"], "train"),
        (["/opt/venv/bin/python", "-m", "train", "--steps", "5"], "train"),
        (["python3.11", "-u", "-m", "train"], "train"),
        (["python3", "-mtrain"], "train"),
        (["python3", "-um", "train"], "train"),
        (["python", "-W", "ignore", "-X", "dev", "-m", "train"], "train"),
        (["python", "-Wignore", "-m", "train"], "train"),
        (["python", "-m", "train.tools"], "train.tools"),
        (["python", "-m", "horovod.runner.task_fn", "-m", "train"], "horovod.runner.task_fn"),
        (["python", "train.py", "-m", "train"], None),           # a script; its -m is its own argument
        (["python", "-c", "import train", "-m", "train"], None),
        (["python", "-m"], None),
        (["sshd", "-m", "train"], None),                          # not an interpreter
        (["/bin/bash", "-c", "python -m train"], None),           # the shell around it, not the trainer
        ([], None),
    ],
)
def test_python_module_reads_the_interpreter_options(argv, module):
    assert supervisor.python_module(argv) == module
    assert supervisor.is_trainer_cmdline(argv) is (module == "train")


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], state: str = "S", comm: str = "x") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))


def test_trainer_pids_on_a_fake_proc_tree(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 1, 0, ["/opt/venv/bin/python", "/opt/ringtrain/entrypoint.py", "sshd"])
    fake_proc(proc, 20, 1, ["/usr/sbin/sshd", "-D", "-e"])
    fake_proc(proc, 30, 20, ["bash", "-c", "cd /w ; HOROVOD_RANK=0 python -m train"], comm="bash")
    fake_proc(proc, 31, 30, ["python", "-m", "train"], comm="python (rank 0)")  # ')' and ' ' in comm
    fake_proc(proc, 32, 20, ["/opt/venv/bin/python3", "-u", "-m", "train", "--steps", "5"], state="R")
    fake_proc(proc, 33, 20, [], state="Z")                        # exited trainer, not reaped yet
    fake_proc(proc, 34, 20, ["python", "-m", "train"], state="Z")
    fake_proc(proc, 35, 20, ["python", "-m", "train.tools"])
    fake_proc(proc, 40, 0, ["python", "-m", "train"])             # `kubectl exec`: parent outside the pod
    (proc / "50").mkdir()                                         # vanished while being read
    (proc / "net").mkdir()
    (proc / "self").symlink_to(proc / "1")

    assert supervisor.trainer_pids(proc) == {31, 32, 40}
    assert supervisor.trainer_pids(proc, under=1) == {31, 32}
    assert supervisor.trainer_pids(proc, under=30) == {31}
    assert supervisor.trainer_pids(proc, under=31) == set()
    # The matcher is injectable.
    assert supervisor.trainer_pids(proc, matcher=lambda argv: argv[:1] == ("/usr/sbin/sshd",)) == {20}
    info = supervisor.read_processes(proc)
    assert info[31] == supervisor.ProcInfo(31, 30, "S", ("python", "-m", "train"))
    assert 50 not in info and info[33].argv == ()


def test_descends_from_survives_a_cycle():
    procs = {5: supervisor.ProcInfo(5, 6, "S", ()), 6: supervisor.ProcInfo(6, 5, "S", ())}
    assert not supervisor.descends_from(5, 1, procs)


def test_exit_codes_read_like_a_shell():
    assert supervisor.exit_code(3 << 8) == 3
    assert supervisor.exit_code(signal.SIGKILL) == 137


def test_stop_grace_setting():
    assert entry_settings.parse_stop_grace({}) == 100.0
    assert entry_settings.parse_stop_grace({"RINGTRAIN_STOP_GRACE_S": "30"}) == 30.0
    for bad in ("soon", "-1", "111", "7200"):  # one range, the trainer's and the MPIJob's (train.contract)
        message = rf"RINGTRAIN_STOP_GRACE_S='{bad}': allowed are 0\.\.110 seconds"
        with pytest.raises(entry_settings.UsageError, match=message):
            entry_settings.parse_stop_grace({"RINGTRAIN_STOP_GRACE_S": bad})


def test_bad_stop_grace_stops_sshd_mode_before_anything_starts(tmp_path, capsys):
    supervised = []
    rc = ep.main(["sshd"], env={"RINGTRAIN_STOP_GRACE_S": "soon", "RINGTRAIN_SSH_DIR": str(tmp_path)},
                 supervise_fn=lambda *a: supervised.append(a) or 0)
    assert rc == entry_settings.EXIT_USAGE and supervised == []
    assert capsys.readouterr().err.strip().splitlines() == [
        "entrypoint: error: RINGTRAIN_STOP_GRACE_S='soon': allowed are 0..110 seconds (the worker pod's "
        "terminationGracePeriodSeconds is 120, the spot notice, less 10 s for the entrypoint to stop sshd)"]


# --------------------------------------------------------------------------------------------------
# The real thing: processes, signals, /proc

# A trainer stand-in, run as `python -m train` from its own directory: like train/stop.py it turns
# SIGTERM into a stop; "obey" then "checkpoints" (0.3 s) and exits 75, "stubborn" carries on.
FAKE_TRAINER = """
import os, signal, sys, time
from pathlib import Path

out = Path(os.environ["FAKE_OUT"])

def on_term(signum, frame):
    (out / f"sigterm.{os.getpid()}").write_text(repr(time.time()))
    if os.environ["FAKE_TRAINER"] == "obey":
        time.sleep(0.3)
        (out / f"exit.{os.getpid()}").write_text(repr(time.time()))
        sys.exit(75)

signal.signal(signal.SIGTERM, on_term)
(out / f"ready.{os.getpid()}").write_text("")
end = time.time() + 120
while time.time() < end:
    time.sleep(0.05)
sys.exit(1)
"""

# The sshd stand-in: starts the trainers (as sshd's sessions would) and a bystander that is no trainer,
# reports how the trainers ended and when its own SIGTERM came. Other behaviours by FAKE_SSHD.
FAKE_SSHD = """
import json, os, signal, subprocess, sys, time
from pathlib import Path

out, mode = Path(os.environ["FAKE_OUT"]), os.environ["FAKE_SSHD"]
assert sys.argv[1:] == ["-D", "-e"], sys.argv
(out / "sshd.pid").write_text(str(os.getpid()))
if mode.startswith("exit-"):
    sys.exit(int(mode[5:]))
if mode == "kill-self":
    os.kill(os.getpid(), signal.SIGKILL)
terms = []
signal.signal(signal.SIGTERM, lambda s, f: terms.append(time.time()))
if mode == "orphan":
    # A child that leaves a grandchild behind: the orphan must be re-parented to the entrypoint and reaped.
    leave = "import os, subprocess, sys; subprocess.Popen([sys.executable, sys.argv[1], str(os.getpid())])"
    subprocess.run([sys.executable, "-c", leave, os.environ["FAKE_ORPHAN"]], check=True)
else:
    pkg = os.environ["FAKE_TRAINER_DIR"]
    cmd = json.loads(os.environ.get("FAKE_TRAINER_CMD", "null")) or [sys.executable, "-m", "train"]
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    trainers = [subprocess.Popen(cmd, cwd=pkg) for _ in range(int(os.environ["FAKE_TRAINERS"]))]
    for t in trainers:
        (out / f"spawned.{t.pid}").write_text("")
    done_at = None
    while True:
        rcs = [t.poll() for t in trainers]
        if done_at is None and all(rc is not None for rc in rcs):
            done_at = time.time()
        if done_at is not None or (terms and time.time() > terms[0] + 0.5):
            break
        time.sleep(0.02)
    (out / "trainers").write_text(repr({"rcs": rcs, "done_at": done_at, "bystander_rc": bystander.poll()}))
    bystander.kill()
end = time.time() + 60
while not terms and time.time() < end:
    time.sleep(0.02)
(out / "sshd_sigterm").write_text(repr(terms[0] if terms else None))
"""

# The orphan: waits until its parent has gone, says who its parent is now, exits (and must be reaped).
ORPHAN = """
import os, sys, time
from pathlib import Path
parent = int(sys.argv[1])
end = time.time() + 10
while os.getppid() == parent and time.time() < end:
    time.sleep(0.02)
Path(os.environ["FAKE_OUT"], "orphan").write_text(f"{os.getpid()} {os.getppid()}")
"""

# The entrypoint's own main(), with the paths a real node has (/etc/ssh, /run/sshd, /usr/sbin/sshd)
# pointed into the test's directory.
RUN_ENTRYPOINT = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("entrypoint", {path!r})
ep = importlib.util.module_from_spec(spec)
sys.modules["entrypoint"] = ep
spec.loader.exec_module(ep)
ep.DEFAULT_HOST_KEY_DIR, ep.SSHD_RUN_DIR, ep.SSHD = {keys!r}, {run!r}, {sshd!r}
from pathlib import Path
ep.DEFAULT_HOST_KEY_DIR, ep.SSHD_RUN_DIR = Path(ep.DEFAULT_HOST_KEY_DIR), Path(ep.SSHD_RUN_DIR)
sys.exit(ep.main(["sshd"]))
"""


class Pod:
    """One worker container's worth of processes, set up in tmp_path."""

    def __init__(self, tmp_path: Path, sshd_mode: str = "trainers", trainer: str = "obey", trainers: int = 2,
                 grace_s: float = 20, sshd_path: Path | None = None, env: dict[str, str] | None = None,
                 trainer_dir: Path | None = None):
        self.out = tmp_path / "out"
        self.out.mkdir()
        pkg = tmp_path / "fake-trainer" / "train"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "__main__.py").write_text(FAKE_TRAINER)
        self.fake_trainer_dir = pkg.parent
        self.trainer_dir = trainer_dir or pkg.parent
        (tmp_path / "orphan.py").write_text(ORPHAN)
        ssh_dir, keys = tmp_path / "ssh", tmp_path / "etc-ssh"
        ssh_dir.mkdir()
        keys.mkdir()
        (ssh_dir / "authorized_keys").write_text("ssh-ed25519 AAAA launcher\n")
        (keys / "ssh_host_ed25519_key").write_text("host key\n")
        sshd = sshd_path or fake_executable(tmp_path / "bin", "sshd", FAKE_SSHD)
        self.script = tmp_path / "run_entrypoint.py"
        self.script.write_text(RUN_ENTRYPOINT.format(path=str(IMAGE_DIR / "entrypoint.py"), keys=str(keys),
                                                     run=str(tmp_path / "run-sshd"), sshd=str(sshd)))
        self.env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "RINGTRAIN_SSH_DIR": str(ssh_dir), "RINGTRAIN_STOP_GRACE_S": str(grace_s),
            "RINGTRAIN_ENV_FILE": str(tmp_path / "no-env-file"),
            "FAKE_OUT": str(self.out), "FAKE_SSHD": sshd_mode, "FAKE_TRAINER": trainer,
            "FAKE_TRAINERS": str(trainers), "FAKE_TRAINER_DIR": str(self.trainer_dir),
            "FAKE_ORPHAN": str(tmp_path / "orphan.py"), **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.log = tmp_path / "entrypoint.log"
        self.namespaced = False

    def start(self, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
        self.namespaced = bool(prefix)
        # Output to a file, not a pipe: a trainer that outlives the entrypoint would hold a pipe open.
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([*prefix, sys.executable, str(self.script)], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)
        return self.proc

    def wait_for(self, predicate, what: str, timeout_s: float = 30) -> None:
        end = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > end:
                self.kill()
                pytest.fail(f"timed out waiting for {what}; entrypoint output:\n{self.output()}")
            if self.proc.poll() is not None:
                pytest.fail(f"entrypoint exited {self.proc.returncode} while waiting for {what}:\n"
                            f"{self.output()}")
            time.sleep(0.05)

    def trainer_pids(self) -> list[int]:
        return sorted(int(p.name.split(".")[1]) for p in self.out.glob("ready.*"))

    def result(self, name: str):
        return eval((self.out / name).read_text())  # written by our own fakes with repr()

    def finish(self, timeout_s: float) -> tuple[int, float]:
        start = time.monotonic()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"entrypoint still running {timeout_s} s after SIGTERM:\n{self.output()}")
        return self.proc.returncode, time.monotonic() - start

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.log.read_text()

    def kill(self) -> None:
        """Leave nothing behind: a trainer that outlived the entrypoint (the stubborn one) included.

        Only our own fakes (by working directory or command line) are killed; namespaced runs report
        pids of their namespace, which die with it (unshare --kill-child)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.namespaced:
            return
        sshd = self.out / "sshd.pid"
        spawned = [int(p.name.split(".")[1]) for p in self.out.glob("spawned.*")]
        for pid in spawned + ([int(sshd.read_text())] if sshd.exists() else []):
            try:
                if os.readlink(f"/proc/{pid}/cwd") == str(self.fake_trainer_dir) or \
                        str(self.out.parent) in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


@pytest.fixture
def pods():
    made: list[Pod] = []
    yield lambda *a, **kw: made.append(Pod(*a, **kw)) or made[-1]
    for pod in made:
        pod.kill()


def assert_trainers_stopped_before_sshd(pod: Pod, n: int) -> None:
    pids = pod.trainer_pids()
    assert len(pids) == n
    got = {int(p.name.split(".")[1]) for p in pod.out.glob("sigterm.*")}
    assert got == set(pids), "every trainer process got SIGTERM"
    trainers = pod.result("trainers")
    assert trainers["rcs"] == [75] * n, "each trainer stopped its own way (checkpoint, exit 75)"
    assert trainers["bystander_rc"] is None, "a process that is no trainer was left alone"
    last_exit = max(pod.result(f"exit.{pid}") for pid in pids)   # written just before each exit(75)
    sshd_sigterm = pod.result("sshd_sigterm")
    assert sshd_sigterm is not None and sshd_sigterm >= last_exit, \
        "sshd was stopped only after the trainers had exited"


@pytest.mark.slow
def test_sigterm_reaches_the_trainers_then_sshd_stops(tmp_path, pods):
    pod = pods(tmp_path)
    proc = pod.start()
    pod.wait_for(lambda: len(pod.trainer_pids()) == 2, "two trainers to start")
    proc.send_signal(signal.SIGTERM)
    rc, took = pod.finish(timeout_s=15)
    out = pod.output()
    assert rc == 0, out
    assert took < 10, f"took {took:.1f} s"
    assert_trainers_stopped_before_sshd(pod, 2)
    assert "entrypoint: SIGTERM: stopping the trainers, then sshd" in out
    assert "entrypoint: 2 trainer processes exited after" in out


@pytest.mark.slow
def test_sigterm_as_pid_1_of_its_own_pid_namespace(tmp_path, pods):
    """As in a pod: the entrypoint is PID 1, sees only its namespace's /proc, and signals all trainers."""
    prefix = ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child")
    probe = subprocess.run([*prefix, "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"needs unprivileged user and PID namespaces (unshare): {probe.stderr.strip()[-200:]}")
    pod = pods(tmp_path)
    unshare = pod.start(prefix)
    pod.wait_for(lambda: len(pod.trainer_pids()) == 2, "two trainers to start")
    # unshare --fork ignores SIGTERM itself; the kubelet's signal goes to PID 1, i.e. its child.
    (init,) = [p for p in os.listdir("/proc") if p.isdigit() and parent_of(int(p)) == unshare.pid]
    os.kill(int(init), signal.SIGTERM)
    rc, took = pod.finish(timeout_s=15)
    out = pod.output()
    assert rc == 0, out
    assert took < 10, f"took {took:.1f} s"
    assert_trainers_stopped_before_sshd(pod, 2)


@pytest.mark.slow
def test_trainers_that_do_not_stop_are_waited_for_only_until_the_grace_ends(tmp_path, pods):
    pod = pods(tmp_path, trainer="stubborn", trainers=1, grace_s=1)
    proc = pod.start()
    pod.wait_for(lambda: len(pod.trainer_pids()) == 1, "the trainer to start")
    proc.send_signal(signal.SIGINT)
    rc, took = pod.finish(timeout_s=15)
    out = pod.output()
    (pid,) = pod.trainer_pids()
    assert rc == 0, out
    assert 1 <= took < 8, f"took {took:.1f} s"
    assert (pod.out / f"sigterm.{pid}").exists()
    assert "entrypoint: SIGINT: stopping the trainers, then sshd" in out
    assert f"entrypoint: warning: trainer processes [{pid}] still running after 1 s" in out
    assert pod.result("sshd_sigterm") is not None


@pytest.mark.slow
@pytest.mark.parametrize("mode, code", [("exit-3", 3), ("kill-self", 137)])
def test_sshd_dying_by_itself_ends_the_entrypoint_with_its_code(tmp_path, pods, mode, code):
    pod = pods(tmp_path, sshd_mode=mode)
    pod.start()
    rc, _ = pod.finish(timeout_s=30)
    out = pod.output()
    assert rc == code, out
    assert f"entrypoint: sshd exited by itself ({code}); stopping the trainers" in out


@pytest.mark.slow
def test_a_missing_sshd_is_reported(tmp_path, pods):
    pod = pods(tmp_path, sshd_path=tmp_path / "no-sshd")
    pod.start()
    rc, _ = pod.finish(timeout_s=30)
    assert rc == 127
    assert f"entrypoint: error: cannot run {tmp_path / 'no-sshd'}: No such file or directory" in pod.output()


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 1:].split()[1])


def state_of(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 1:].split()[0]


@pytest.mark.slow
def test_orphans_are_reparented_to_the_entrypoint_and_reaped(tmp_path, pods):
    pod = pods(tmp_path, sshd_mode="orphan")
    proc = pod.start()
    pod.wait_for(lambda: (pod.out / "orphan").exists(), "the orphan to report its new parent")
    orphan, new_parent = map(int, (pod.out / "orphan").read_text().split())
    assert new_parent == proc.pid, "the orphan came to the entrypoint (a subreaper, as PID 1 would be)"
    end = time.monotonic() + 10
    while state_of(orphan) is not None and parent_of(orphan) == proc.pid and time.monotonic() < end:
        time.sleep(0.05)
    assert state_of(orphan) is None or parent_of(orphan) != proc.pid, \
        f"orphan {orphan} left as a {state_of(orphan)!r} child of the entrypoint: not reaped"
    proc.send_signal(signal.SIGTERM)
    rc, _ = pod.finish(timeout_s=15)
    assert rc == 0, pod.output()


def test_the_stand_ins_command_lines_are_what_the_matcher_looks_for():
    """The fake trainer runs as `<this python> -m train` and the bystander as `-c` (else the real tests
    would prove nothing about the matcher)."""
    assert supervisor.is_trainer_cmdline([sys.executable, "-m", "train"])
    assert not supervisor.is_trainer_cmdline([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.slow
def test_the_real_trainer_checkpoints_and_exits_75_when_the_pod_is_told_to_stop(tmp_path, pods):
    """The whole chain with the real `python -m train` (one rank) under the fake sshd: SIGTERM to the
    entrypoint -> the trainer stops at a step boundary, writes its checkpoint, exits 75 -> sshd stops."""
    import json

    from tests.image.helpers import REPO_ROOT
    from train import data as data_mod
    from train.checkpoint import store as ckpt
    from train.storage import open_store
    from train.summary import parse_summary

    data_mod.generate(str(tmp_path / "data"), shards=1, samples_per_shard=256, seed=3)
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "train", "--no-progress", "--data", str(tmp_path / "data"),
           "--steps", "2000", "--log-every", "1", "--checkpoint-dir", str(ck), "--metrics-file", str(metrics)]
    pod = pods(tmp_path, trainers=1, trainer_dir=REPO_ROOT, env={
        "FAKE_TRAINER_CMD": json.dumps(cmd), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1", "RINGTRAIN_FAULT_STEP_SLEEP_S": "0.02"})
    proc = pod.start()
    pod.wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "3 training steps",
                 timeout_s=120)
    proc.send_signal(signal.SIGTERM)
    rc, took = pod.finish(timeout_s=60)
    out = pod.output()
    assert rc == 0, out[-3000:]
    assert pod.result("trainers")["rcs"] == [75], out[-3000:]
    summary = parse_summary(out)
    assert summary.interrupted is True and 3 <= summary.steps < 2000
    assert summary.checkpoints_written == 1
    assert ckpt.CheckpointStore(open_store(str(ck)), keep=3).valid_steps() == [summary.steps]
    assert "entrypoint: 1 trainer processes exited after" in out
