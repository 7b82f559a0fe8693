"""The operator's subcommands of `ringtrain` (cluster/aws/cli.py): outputs for people and machines, one
clear error per bad input, and the paths that need the Pulumi CLI failing cleanly without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")  # the console script


def run(*args, env=None, input=None):
    return subprocess.run([RINGTRAIN, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
                          input=input)


def test_plan_json_for_machines(capsys):
    assert cli.main(["plan", "--stack", "prod", "--hours", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # prod full scale: 0.10 + 3 x 0.045 + 2 x 0.2016 + 8 x 55.04 = 440.9582 $/h; two hours:
    assert doc["cost"]["runHours"] == 2 and doc["cost"]["runUsd"] == pytest.approx(881.92)
    assert {g["name"] for g in doc["nodeGroups"]} == {"system", "h100-ondemand", "h100-spot"}


@pytest.mark.parametrize("args,code,message", [
    (["plan", "--stack", "nope"], 2, "plan: error: stack 'nope' has no Pulumi.nope.yaml"),
    (["plan", "--stack", "dev", "--hours", "-1"], 2, "argument --hours: -1: allowed are 0 .. 8784 hours"),
    (["down", "--stack", "dev", "--confirm", "dev"], 2, "down: error: --confirm: only with --delete-data"),
    (["submit", "--stack", "dev", "--job-name", "j", "--outputs", "/nonexistent.json", "--dry-run"], 2,
     "submit: error: --outputs /nonexistent.json: no such file"),
    (["submit", "--stack", "dev", "--job-name", "1st", "--outputs", "/nonexistent.json", "--dry-run"], 2,
     "submit: error: job name '1st': the MPI Operator names its pods <name>-worker-<i>"),
    (["submit", "--stack", "dev", "--job-name", "a" * 54, "--hosts", "11", "--dry-run"], 2,
     "allowed are at most 53 characters for 11 worker(s)"),
    (["run", "--backend", "aws", "--stack", "dev", "--job-name", "a" * 55], 2,
     "run: error: --job-name: job name 'aaaa"),
    (["run", "--backend", "aws", "--stack", "dev", "--job-timeout", "0"], 2,
     "--job-timeout and --startup-timeout: must be > 0 seconds"),
], ids=["unknown-stack", "negative-hours", "confirm-without-delete", "missing-outputs-file",
        "name-digit-first", "name-too-long-for-11", "run-name-too-long", "zero-job-timeout"])
def test_bad_input_is_one_clear_message(args, code, message):
    done = run(*args)
    assert done.returncode == code, done.stdout + done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_lifecycle_commands_need_the_pulumi_cli(tmp_path):
    env = {"PATH": str(Path(sys.executable).parent), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    for args in (["up", "--stack", "dev"], ["down", "--stack", "dev"], ["status", "--stack", "dev"],
                 ["status", "--stack", "dev", "--job", "j1"],
                 ["down", "--stack", "dev", "--delete-data", "--confirm", "dev"]):
        done = run(*args, env=env)
        assert done.returncode == 1, (args, done.stderr)
        assert f"{args[0]}: error: the Pulumi CLI (`pulumi`) is not on PATH" in done.stderr
        assert "Traceback" not in done.stderr


def test_submit_dry_run_renders_from_an_outputs_file_with_no_aws(dev_outputs_file, capsys):
    assert cli.main(["submit", "--stack", "dev", "--job-name", "dry", "--hosts", "2",
                     "--node-group", "l4-spot", "--outputs", str(dev_outputs_file), "--dry-run",
                     "--", "--steps", "50"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["kind"] == "MPIJob" and manifest["metadata"]["name"] == "dry"
    validate_schemas(manifest)
    spec = manifest["spec"]
    assert spec["slotsPerWorker"] == 4  # default: every GPU of g6.12xlarge / g6.24xlarge
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    exprs = {e["key"]: e["values"] for e in
             worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                 "nodeSelectorTerms"][0]["matchExpressions"]}
    assert exprs["ringtrain.io/node-pool"] == ["l4-spot"]
    cmd = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    assert cmd[:6] == ["launcher", "--", "horovodrun", "--gloo", "-np", "8"]
    assert cmd[cmd.index("train") + 1:][:2] == ["--steps", "50"]
    assert "s3://acme-ringtrain-dev-datasets/datasets/dry" in cmd


def test_submit_refuses_a_trainer_flag_before_rendering_anything(dev_outputs_file, capsys):
    """The trainer's own parser runs at submit time: a flag it refuses is named there, exit 2, no manifest."""
    with pytest.raises(SystemExit) as e:
        cli.main(["submit", "--stack", "dev", "--job-name", "dry", "--node-group", "l4-spot",
                  "--outputs", str(dev_outputs_file), "--dry-run", "--", "--steps", "50", "--stepz", "3"])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == (
        "submit: error: trainer arguments: unrecognized arguments: --stepz 3 (see `python -m train --help`)")


def validate_schemas(manifest):
    """The pinned operator's MPIJob CRD (cluster/schemas) and strict Kubernetes PodTemplate schemas."""
    pytest.importorskip("kubernetes_validate")
    from cluster.schemas import validate_mpijob

    validate_mpijob(manifest, "1.36")


def test_submit_argument_errors(dev_outputs_file):
    base = ["submit", "--stack", "dev", "--outputs", str(dev_outputs_file), "--dry-run"]
    cases = [
        (["--job-name", "j", "--node-group", "l4-spot", "--steps", "5"], "unrecognized arguments"),
        (["--job-name", "j"], "several GPU node groups (a10g-spot, l4-spot): name one"),
        (["--job-name", "Bad_Name", "--node-group", "l4-spot"], "lower-case letters, digits and '-'"),
        (["--job-name", "j", "--node-group", "l4-spot", "--min-hosts", "1"],
         "--min-hosts: only with --elastic"),
        (["--job-name", "j", "--node-group", "l4-spot", "--slots-per-host", "8"],
         "slots_per_host=8 but node group 'l4-spot'"),
    ]
    for extra, message in cases:
        done = run(*base, *extra)
        assert done.returncode in (1, 2), (extra, done.stdout)
        assert message in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr


def test_scripts_wrap_the_cli():
    done = subprocess.run([str(REPO_ROOT / "scripts" / "plan"), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "--hours" in done.stdout
