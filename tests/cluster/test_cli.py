"""The one command, `ringtrain`, through its real entry point: the console script pyproject.toml
declares and scripts/setup installs into .venv/bin, run in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RINGTRAIN = Path(sys.executable).parent / "ringtrain"
SUBCOMMANDS = ("run", "plan", "up", "down", "status", "submit", "logs", "data")


def ringtrain(*args, env=None, timeout=300):
    if not RINGTRAIN.exists():
        pytest.fail(f"{RINGTRAIN} is missing: run scripts/setup (it installs the project's console script)")
    return subprocess.run([str(RINGTRAIN), *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_the_console_script_is_the_packages_entry_point():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"ringtrain": "cluster.cli:main"}


def test_help_lists_every_subcommand_with_examples():
    done = ringtrain("--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("positional arguments:")[1].split("options:")[0]
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in listed, (name, listed)
    assert "ringtrain run --backend aws --stack dev" in done.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help_with_an_example(name):
    done = ringtrain(name, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "example" in done.stdout.lower(), done.stdout
    if name in ("plan", "up", "down", "status", "submit", "logs"):
        assert "--stack" in done.stdout and f"ringtrain {name} --stack" in done.stdout
    if name == "run":
        assert "--run-dir" in done.stdout and "report.png" in done.stdout
    if name == "data":
        assert "usage: ringtrain data" in done.stdout and "generate" in done.stdout and "pack" in done.stdout


def test_no_subcommand_is_a_usage_error():
    done = ringtrain()
    assert done.returncode == 2 and "COMMAND" in done.stderr


def test_plan_runs_offline():
    done = ringtrain("plan", "--stack", "dev", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["stack"] == "dev" and doc["nodeGroups"]


def test_submit_dry_run_renders_the_mpijob_offline(tmp_path):
    from tests.infra.harness import run_program

    outputs = tmp_path / "dev.json"
    outputs.write_text(json.dumps(run_program("dev").exports))
    done = ringtrain("submit", "--stack", "dev", "--job-name", "dry", "--hosts", "2",
                     "--node-group", "l4-spot", "--outputs", str(outputs), "--dry-run", "--", "--steps", "50")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["kind"] == "MPIJob" and manifest["metadata"]["name"] == "dry"


def test_data_generate_writes_a_dataset(tmp_path):
    done = ringtrain("data", "generate", "--out", str(tmp_path / "ds"), "--shards", "2",
                     "--samples-per-shard", "8")
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    assert len(index["shards"]) == 2


def test_stack_commands_without_the_pulumi_cli_fail_cleanly(tmp_path):
    env = {"PATH": str(Path(sys.executable).parent), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "HOME": str(tmp_path)}
    done = ringtrain("logs", "--stack", "dev", "--job", "j1", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "logs: error: the Pulumi CLI (`pulumi`) is not on PATH" in done.stderr
    assert "Traceback" not in done.stderr
    bad = ringtrain("logs", "--stack", "dev", "--job", "Bad_Name", env=env)
    assert bad.returncode == 2 and "logs: error: --job 'Bad_Name'" in bad.stderr


def test_unknown_arguments_are_refused():
    done = ringtrain("plan", "--stack", "dev", "--bogus")
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr


@pytest.mark.parametrize("script,command", [("run", "run"), ("plan", "plan"), ("up", "up"), ("down", "down"),
                                            ("submit", "submit")])
def test_scripts_are_thin_wrappers_of_the_one_command(script, command):
    path = REPO_ROOT / "scripts" / script
    text = path.read_text()
    assert f'ringtrain" {command} "$@"' in text or f"ringtrain {command} \"$@\"" in text
    assert "scripts/setup" in text and os.access(path, os.X_OK)


def test_python_dash_m_cluster_is_the_same_command():
    done = subprocess.run([sys.executable, "-m", "cluster", "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: ringtrain")
