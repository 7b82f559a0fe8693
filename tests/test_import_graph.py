"""No module imports one that imports it back, directly or round a longer circle: each package's
modules form layers (the trainer's loop below its launch, the checkpoint store below its writer), so
any of them can be read, imported and tested without the ones above it. Imports inside functions
count too: a deferred import is still a circle (train.trainer <-> train.elastic was one)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("train", "cluster", "infra", "bench")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` under `root`."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports anywhere in its source (`from a.b import c` is
    a.b.c when that is a module, else a.b)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = targets - {None, name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other by imports (strongly connected, 2 or more)."""
    reach = {m: _reachable(graph, m) for m in graph}
    groups = {tuple(sorted(m2 for m2 in reach[m] if m in reach[m2])) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups if len(g) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_no_module_imports_one_that_imports_it_back():
    modules = module_files(REPO_ROOT)
    assert {"train.trainer", "train.run", "cluster.cli"} <= modules.keys(), "test premise: modules found"
    assert circles(import_graph(modules)) == []


def test_a_circle_through_a_deferred_import_is_found(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "__init__.py").write_text("")
    (tmp_path / "train" / "a.py").write_text("from train.b import f\n")
    (tmp_path / "train" / "b.py").write_text("def f():\n    from train import c\n")
    (tmp_path / "train" / "c.py").write_text("import os\nimport train.a\n")
    (tmp_path / "train" / "d.py").write_text("from train import a\n")
    assert circles(import_graph(module_files(tmp_path, ("train",)))) == [["train.a", "train.b", "train.c"]]
