"""The trainer stands on its own: nothing under train/ imports cluster/ (the worker image carries train/
alone), and the contract it shares with the launchers, the image and the stack (exit codes, CPU shares,
the stop grace, the node-pool label, the launcher tag) is defined once, in train/contract.py."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import cluster.job
import train.contract

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_SOURCES = sorted((REPO_ROOT / "train").rglob("*.py"))


def _cluster_imports(path: Path) -> list[str]:
    """Every `import cluster...` / `from cluster... import` in a file, top-level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "cluster"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "cluster":
            found.append(f"{path.name}:{node.lineno} from {node.module}")
    return found


def test_no_trainer_source_imports_cluster():
    assert len(TRAIN_SOURCES) > 10, "test premise: the trainer's sources are found"
    assert [f for p in TRAIN_SOURCES for f in _cluster_imports(p)] == []


def test_the_scan_sees_a_cluster_import(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import os\ndef f():\n    from cluster.job import JobSpec\n"
                      "import cluster.flow as flow\n")
    assert sorted(_cluster_imports(source)) == ["x.py:3 from cluster.job", "x.py:4 import cluster.flow"]


def test_every_trainer_module_imports_with_cluster_unimportable():
    """What the worker image does: train/ without cluster/ beside it (sys.modules[...] = None makes any
    `import cluster...` raise ImportError)."""
    modules = sorted(".".join(p.relative_to(REPO_ROOT).with_suffix("").parts)
                     for p in TRAIN_SOURCES if p.name != "__init__.py")
    code = ("import importlib, sys\nsys.modules['cluster'] = None\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "assert 'cluster' not in {k.split('.')[0] for k, v in sys.modules.items() if v is not None}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_contract_has_one_definition():
    """cluster/ uses the trainer's values; it defines none of its own."""
    for name in ("EXIT_INTERRUPTED_RESUMABLE", "EXIT_BAD_INPUT", "cores_per_worker", "cpu_share"):
        assert hasattr(train.contract, name)
        assert not hasattr(cluster.job, name), f"cluster.job defines {name} again"
    assert (train.contract.EXIT_INTERRUPTED_RESUMABLE, train.contract.EXIT_BAD_INPUT) == (75, 2)


# What train/contract.py defines for cluster/, infra/ and image/: names nothing else may assign, and
# values nothing else may spell out.
CONTRACT_NAMES = {"STOP_GRACE_ENV", "DEFAULT_STOP_GRACE_S", "WORKER_TERMINATION_GRACE_S",
                  "STOP_GRACE_MARGIN_S", "MAX_STOP_GRACE_S", "NODE_POOL_LABEL", "SYSTEM_POOL",
                  "LAUNCHER_TAG_SUFFIX"}
CONTRACT_VALUES = {"RINGTRAIN_STOP_GRACE_S", "ringtrain.io/node-pool"}


def _contract_copies(path: Path) -> list[str]:
    """Module-level assignments to a contract name, and string constants equal to a contract value."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [f"{path.name}:{node.lineno} {target.id} =" for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name) and target.id in CONTRACT_NAMES]
    found += [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and node.value in CONTRACT_VALUES]
    return found


def test_the_shared_constants_are_defined_once_in_the_contract():
    """One definition each, one allowed range for the stop grace: no copies that tests keep equal."""
    contract = REPO_ROOT / "train" / "contract.py"
    sources = [p for d in ("train", "cluster", "infra", "image", "bench", "scripts")
               for p in (REPO_ROOT / d).rglob("*.py") if p != contract]
    assert len(sources) > 50, "test premise: the sources are found"
    assert len(_contract_copies(contract)) >= len(CONTRACT_NAMES), "test premise: the scan sees definitions"
    assert [f for p in sources for f in _contract_copies(p)] == []

