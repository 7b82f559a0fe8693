"""The committed stack files, Pulumi.<stack>.yaml, read as the Pulumi engine hands them to the program
(pure: no Pulumi runtime). The offline plan (cluster/aws/plan.py) validates them with infra/config.py;
the tests run the program on them under mocks (tests/infra/harness.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


def stack_file(stack: str) -> Path:
    return REPO_ROOT / f"Pulumi.{stack}.yaml"


def stack_names() -> list[str]:
    """Every stack with a committed Pulumi.<stack>.yaml."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in REPO_ROOT.glob("Pulumi.*.yaml"))


def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` mapping of Pulumi.<stack>.yaml as Python values (not yet engine strings)."""
    doc = yaml.safe_load(stack_file(stack).read_text()) or {}
    return dict(doc.get("config") or {})


def engine_config(config: Mapping[str, Any]) -> dict[str, str]:
    """Config as the engine hands it to a program: every value a string, objects and lists as JSON."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, str):
            out[key] = value
        else:
            # Pulumi passes structured and scalar non-string values as JSON text.
            out[key] = json.dumps(value)
    return out
