"""Helpers of the image tests: load image/*.py by path, write fake executables, parse the Dockerfile."""

from __future__ import annotations

import importlib
import importlib.util
import re
import stat
import sys
import textwrap
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO_ROOT / "image"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
ENV_FILE = IMAGE_DIR / "nccl-efa.env"


def load_image_module(name: str) -> ModuleType:
    """image/ is not a package (it is copied into the image as files); load its modules by path."""
    mod_name = f"ringtrain_image_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, IMAGE_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses resolve their module while the file executes
    spec.loader.exec_module(module)
    return module


def load_entry_module(name: str) -> ModuleType:
    """A module of image/ringtrain_entry/, the entrypoint's package (imported by its own name, as
    image/entrypoint.py imports it, so both share one module object). image/ goes at the END of
    sys.path: its other files (build.py) must not shadow installed packages."""
    if str(IMAGE_DIR) not in sys.path:
        sys.path.append(str(IMAGE_DIR))
    return importlib.import_module(f"ringtrain_entry.{name}")


def fake_executable(bin_dir: Path, name: str, body: str) -> Path:
    """A Python script named `name` in bin_dir, run by this interpreter; `body` is its code."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        m = re.match(r"(\w+)\s+(.*)", buf, re.DOTALL)
        if m:
            out.append((m.group(1).upper(), m.group(2).strip()))
        buf = ""
    return out


def dockerfile_env(text: str, stage: str) -> dict[str, str]:
    """ENV KEY=VALUE pairs set in one stage (FROM ... AS stage) of the Dockerfile."""
    env: dict[str, str] = {}
    current = None
    for instr, args in dockerfile_instructions(text):
        if instr == "FROM":
            m = re.search(r"\bAS\s+(\S+)", args, re.IGNORECASE)
            current = m.group(1) if m else None
        elif instr == "ENV" and current == stage:
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args):
                env[key] = value
    return env


def dockerfile_stages(text: str) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """stage name -> (FROM image, the stage's instructions after FROM), in file order."""
    stages: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    current: list[tuple[str, str]] | None = None
    for instr, args in dockerfile_instructions(text):
        if instr == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            current = []
            stages[m.group(2) or f"stage{len(stages)}"] = (m.group(1), current)
        elif current is not None:
            current.append((instr, args))
    return stages
