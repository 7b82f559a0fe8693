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


class StackFileError(ValueError):
    """A Pulumi.<stack>.yaml that is not YAML, or whose `config:` is not a mapping; the message names
    the file and, for YAML errors, the line."""


def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` mapping of Pulumi.<stack>.yaml as Python values (not yet engine strings)."""
    path = stack_file(stack)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path.name}, line {mark.line + 1}" if mark is not None else path.name
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise StackFileError(f"{where}: not valid YAML ({problem})") from None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(config, dict | None):
        raise StackFileError(f"{path.name}: expected a mapping with a `config:` mapping of key: value "
                             "(https://www.pulumi.com/docs/concepts/config/)")
    return dict(config or {})


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
