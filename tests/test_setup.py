"""scripts/setup: fails fast on bad prerequisites, never leaves a half-built venv looking installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup"


def run_setup(env_extra: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([str(SETUP)], capture_output=True, text=True, env=env, timeout=timeout)


def test_wrong_python_is_refused_with_a_clear_message(tmp_path):
    fake = tmp_path / "python3.12"
    fake.write_text('#!/bin/sh\necho "Python 3.12.1"\nexit 1\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = run_setup({"PYTHON": str(fake), "RINGTRAIN_VENV": str(venv)}, timeout=60)
    assert proc.returncode != 0
    assert "Python 3.11 is required (found: Python 3.12.1)" in proc.stderr
    assert not venv.exists()


def test_missing_compiler_fails_before_anything_is_created(tmp_path):
    venv = tmp_path / "venv"
    proc = run_setup(
        {
            "RINGTRAIN_VENV": str(venv),
            "HOROVOD_WHEEL_CACHE": str(tmp_path / "empty-cache"),  # no cached wheel: a build is needed
            "CXX": "/nonexistent/g++",
        },
        timeout=60,
    )
    assert proc.returncode != 0
    assert "no C++ compiler (/nonexistent/g++) found" in proc.stderr
    assert not venv.exists()


def test_unknown_argument_is_refused():
    proc = subprocess.run([str(SETUP), "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "unknown argument '--bogus' (allowed: --force, --help)" in proc.stderr


def installed_copy(dest: Path) -> None:
    """Copy the virtual environment running these tests to `dest`, as hard links where the filesystem
    allows (seconds, where a fresh install takes minutes; CI's own `scripts/setup` on a clean clone
    is the fresh install). The copy stays a working venv: its interpreter is a link to the base
    Python and pip finds its site-packages from `pyvenv.cfg` beside it. Setup writes the copy only
    by creating files (pip unlinks a file before writing it: pip 25.3
    `operations/install/wheel.py`, `ZipBackedFile.save`; `rm -f` precedes the marker's rewrite), so
    the running venv's files are never written through a link. Outside a venv, `dest` stays absent and the
    setup below installs from scratch."""
    if sys.prefix == sys.base_prefix:
        return
    # The real directory: where .venv is a symbolic link (a git worktree sharing another's), copying
    # the link would make the setups below rewrite the running environment itself.
    source = os.path.realpath(sys.prefix)
    if subprocess.run(["cp", "-al", source, str(dest)], capture_output=True).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-a", source, str(dest)], check=True)
    assert not dest.is_symlink()


@pytest.mark.slow
def test_failed_setup_does_not_look_installed_and_rerun_repairs(tmp_path):
    venv = tmp_path / "venv"
    marker = venv / ".ringtrain-setup"
    env = {"RINGTRAIN_VENV": str(venv)}  # the Horovod wheel cache is shared: no rebuild here

    installed_copy(venv)  # stands for a first successful setup
    first = run_setup(env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert marker.exists()

    # Damage the environment, then make the next setup fail half-way (an unsatisfiable pin, as a
    # broken mirror or a bad lock would): it must not leave the environment marked as installed.
    horovod_dirs = list(venv.glob("lib/python3.11/site-packages/horovod"))
    assert horovod_dirs
    subprocess.run(["rm", "-rf", str(horovod_dirs[0])], check=True)
    bad = tmp_path / "bad-constraints.txt"
    bad.write_text("pyyaml==0.0.1\n")
    failed = run_setup({**env, "PIP_CONSTRAINT": str(bad)})
    assert failed.returncode != 0
    assert not marker.exists()

    # Running setup again repairs it.
    again = run_setup(env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert marker.exists()
    subprocess.run([str(venv / "bin" / "python"), "-c", "import horovod.torch"], check=True, timeout=120)

    # And once installed, a second run is the fast no-op path.
    noop = run_setup(env, timeout=120)
    assert noop.returncode == 0
    assert "up to date" in noop.stdout
