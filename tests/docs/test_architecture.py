"""docs/ARCHITECTURE.md's layout section matches the tree: every path it names exists, and it names every
directory of the repository and every script."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = re.compile(r"^((?:[\w.<>-]+/?|\.\.\.)(?:, (?:[\w.<>-]+/?|\.\.\.))*)")


def layout() -> tuple[list[str], str]:
    """The paths the layout block names (each entry's names, under the directories it is indented
    under) and the block's text. Lines indented deeper than an entry's are its description."""
    block = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("```", 2)[1]
    parents: dict[int, str | None] = {}
    named = []
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip(" "))
        match = NAMES.match(line.strip())
        if indent > 4 or not match:
            continue
        for name in match.group(1).split(", "):
            if name == "..." or "<" in name:
                continue
            parents[indent] = name if name.endswith("/") else None
            parents = {i: d for i, d in parents.items() if i <= indent}
            named.append("".join(d for i, d in sorted(parents.items()) if i < indent and d) + name)
    return named, block


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_every_path_the_layout_names_exists():
    named, _ = layout()
    assert "cluster/aws/plan.py" in named and "infra/policy/" in named   # the parse reads nesting
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"docs/ARCHITECTURE.md's layout names what is not there: {missing}"


def test_the_layout_names_every_directory_and_script():
    named, block = layout()
    files = [f for f in tracked() if not f.startswith(".")]
    dirs = {f.split("/")[0] + "/" for f in files if "/" in f}
    dirs |= {"/".join(f.split("/")[:2]) + "/" for f in files
             if f.count("/") >= 2 and not f.startswith("tests/")}
    unnamed = sorted(d for d in dirs if d not in named)
    assert not unnamed, f"docs/ARCHITECTURE.md's layout leaves out {unnamed}"
    scripts_line = re.search(r"^scripts/ .*?(?=^\S)", block, re.M | re.S).group(0)
    scripts = [f.split("/")[1] for f in files if f.startswith("scripts/")]
    assert [s for s in scripts if not re.search(rf"\b{re.escape(s)}\b", scripts_line)] == []
