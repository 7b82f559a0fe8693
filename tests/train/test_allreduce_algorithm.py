"""What allreduce runs is the library's choice (NCCL on GPUs: ring or tree; Gloo on CPU: ring): the trainer
offers `--nccl-algo` to fix NCCL's, and no text claims ring-allreduce where NCCL decides (issue 26, 9)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from train.config import parse_args
from train.errors import BadInput
from train.recipe import configure_horovod_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("choice, value", [("ring", "Ring"), ("tree", "Tree")])
def test_nccl_algo_flag_sets_nccls_variable(choice, value):
    env: dict[str, str] = {}
    configure_horovod_env(parse_args(["--nccl-algo", choice]), on_gpu=True, environ=env)
    assert env == {"NCCL_ALGO": value}
    env = {"NCCL_ALGO": "Tree"}
    configure_horovod_env(parse_args(["--nccl-algo", choice]), on_gpu=True, environ=env)
    assert env["NCCL_ALGO"] == value, "the flag wins over the environment, like the other knobs"


def test_without_the_flag_nccl_chooses():
    env: dict[str, str] = {}
    configure_horovod_env(parse_args([]), on_gpu=True, environ=env)
    assert "NCCL_ALGO" not in env
    env = {"NCCL_ALGO": "Ring"}
    configure_horovod_env(parse_args([]), on_gpu=True, environ=env)
    assert env == {"NCCL_ALGO": "Ring"}, "an exported NCCL_ALGO is left to NCCL"


def test_a_bad_algorithm_is_one_clear_message():
    with pytest.raises(BadInput, match=r"--nccl-algo: invalid choice: 'nvls' \(choose from 'ring', 'tree'\)"):
        parse_args(["--nccl-algo", "nvls"])


# A sentence claiming ring-allreduce must say it is Gloo's (CPU) or that NCCL's is chosen by the flag.
RING_CLAIM = re.compile(r"ring[- ]?all-?reduce", re.IGNORECASE)
QUALIFIERS = ("Gloo", "--nccl-algo", "NCCL_ALGO")


def unqualified_ring_claims(text: str) -> list[str]:
    sentences = re.split(r"(?<=[.!?])\s+|\n\s*\n", text)
    return [" ".join(s.split()) for s in sentences
            if RING_CLAIM.search(s) and not any(q in s for q in QUALIFIERS)]


def _help(*argv: str) -> str:
    res = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_docs_and_help_say_what_allreduce_runs():
    texts = {
        "README.md": (ROOT / "README.md").read_text(),
        "docs/TRAINER.md": (ROOT / "docs" / "TRAINER.md").read_text(),
        "docs/ARCHITECTURE.md": (ROOT / "docs" / "ARCHITECTURE.md").read_text(),
        "image/README.md": (ROOT / "image" / "README.md").read_text(),
        "pyproject description":
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"],
        "python -m train --help": _help("-m", "train"),
        "ringtrain run --help": _help("-m", "cluster", "run"),
    }
    claims = {where: unqualified_ring_claims(text) for where, text in texts.items()}
    assert {k: v for k, v in claims.items() if v} == {}
    train_help = " ".join(texts["python -m train --help"].split())
    assert "--nccl-algo {ring,tree}" in train_help and "NCCL_ALGO=Ring" in train_help
    # The trainer's guide (linked from the README) documents the flag and what it sets.
    assert "--nccl-algo" in texts["docs/TRAINER.md"] and "NCCL_ALGO=Ring" in texts["docs/TRAINER.md"]


def test_the_claim_check_catches_an_unqualified_claim():
    assert unqualified_ring_claims("Runs Horovod ring-allreduce training on GPUs.") == [
        "Runs Horovod ring-allreduce training on GPUs."]
    assert unqualified_ring_claims("On CPU workers Gloo runs a ring-allreduce.") == []
