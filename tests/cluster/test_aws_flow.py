"""One `run` command, two backends: the ephemeral flow (up -> submit -> logs -> results -> down) end to end
on the local backend, including Ctrl-C, and the same command's AWS path failing cleanly without the
Pulumi CLI. (The AWS backend inside the flow is covered in test_aws_backend.py.)"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")  # the console script
UP_LINE = re.compile(r"local cluster up: (?P<hosts>.*); object store (?P<store>http://[\d.]+:\d+); "
                     r"work dir (?P<workdir>\S+)")


def run_cli(*args, timeout=600, env=None):
    return subprocess.run([RINGTRAIN, "run", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def assert_torn_down(output: str) -> None:
    """Everything the run's `local cluster up:` line named is gone."""
    m = UP_LINE.search(output)
    assert m, output[-2000:]
    assert not Path(m["workdir"]).exists(), f"work dir {m['workdir']} left behind"
    host, port = m["store"].removeprefix("http://").split(":")
    if ipaddress.ip_address(host).is_loopback:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((host, int(port))) != 0, f"object store {m['store']} still answers"
    else:
        # A bridge address (10.213.N.1) that was torn down is routed off this machine: connecting to it
        # would send traffic to a network that is not ours. Gone means no interface here holds it.
        addresses = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True)
        assert f" {host}/" not in addresses.stdout, f"object store address {host} still on an interface"
    bridge = re.search(r"bridge (\S+)", m["hosts"])
    if bridge:
        link = subprocess.run(["ip", "link", "show", bridge[1]], capture_output=True, text=True)
        assert link.returncode != 0, f"bridge {bridge[1]} left behind"


@pytest.mark.slow
def test_ephemeral_run_end_to_end_on_the_local_backend(tmp_path):
    # Paced steps: each checkpoint's write ends before the next is due (a checkpoint due sooner is
    # taken late, and the count below would depend on the machine's speed).
    done = run_cli("--hosts", "2", "--steps", "20", "--checkpoint-every", "5", "--no-reclaim",
                   "--no-progress", "--job-name", "flow-e2e", "--dataset-shards", "2",
                   "--samples-per-shard", "64", "--run-dir", str(tmp_path / "run"),
                   env={"RINGTRAIN_FAULT_STEP_SLEEP_S": "0.1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "job flow-e2e: done (exit code 0, 1 attempt(s))" in out
    assert re.search(r"steps\s+20\b", out)
    assert re.search(r"checkpoints\s+4 written\n", out)  # steps 5, 10, 15, 20, none deferred
    # the run's report: named in the output, a picture that is not blank
    picture = tmp_path / "run" / "report.png"
    assert f"report             {picture}" in done.stdout
    from PIL import Image, ImageStat

    with Image.open(picture) as img:
        assert img.size == (1000, 700)
        assert ImageStat.Stat(img.convert("L")).var[0] > 100
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "loss" in r]   # the training records (not the preflight's, eval's)
    # every checkpoint is in the records but the last, taken after the last record (at step 20)
    assert records[-1]["step"] == 20 and [c for r in records for c in r["checkpoints"]] == [5, 10, 15]
    assert_torn_down(out)


@pytest.mark.slow
def test_ctrl_c_mid_run_tears_the_local_cluster_down():
    proc = subprocess.Popen([RINGTRAIN, "run", "--hosts", "2", "--steps", "100000",
                             "--no-reclaim", "--no-progress", "--job-name", "flow-int",
                             "--dataset-shards", "1", "--samples-per-shard", "64"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "attempt 1: submitted" in line:
                time.sleep(3)  # training is running
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail("the run never submitted its job: " + "".join(lines)[-2000:])
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted; the cluster was torn down" in out
    assert "Traceback" not in out
    assert_torn_down(out)


def test_the_same_run_command_on_aws_fails_cleanly_without_the_pulumi_cli(tmp_path):
    env = {"PATH": str(Path(sys.executable).parent), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_CONFIG_FILE": str(tmp_path / "c"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "c"),
           "HOME": str(tmp_path)}
    done = run_cli("--backend", "aws", "--stack", "dev", "--no-progress", timeout=120, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "run: error: the Pulumi CLI (`pulumi`) is not on PATH" in done.stderr
    assert "Traceback" not in done.stderr
