"""The README is short enough to read at the door, and its offline commands work as written."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The stack outputs file the README's `submit --dry-run` reads (`pulumi stack output --json`); the test
# writes the dev stack's outputs as the Pulumi program declares them under mocks, and runs with that.
README_OUTPUTS = "/tmp/dev-outputs.json"


def shell_commands(markdown: str) -> list[str]:
    """Every command line in the ```bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^ *```bash\n(.*?)^ *```", markdown, re.S | re.M):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def offline_commands(commands: list[str]) -> list[str]:
    """Those that need no AWS, Pulumi, Docker or cluster: `--help`, `plan`, `submit --dry-run`."""
    def offline(c: str) -> bool:
        words = c.split()
        return (words[-1] == "--help" or words[0] == "scripts/plan"
                or (words[0] == "scripts/submit" and "--dry-run" in words))
    return [c for c in commands if offline(c)]


def test_the_readme_is_under_15_kb():
    assert README.stat().st_size < 15_000, f"README.md is {README.stat().st_size} bytes"


def test_commands_are_found_in_bash_blocks_with_continuations_and_comments():
    text = ("x\n```bash\nscripts/plan --stack dev   # 1. cost\nscripts/up \\\n  --stack dev\n```\n"
            "  ```bash\n  scripts/submit --stack dev --dry-run -- --steps 5\n  ```\n"
            "```\nscripts/plan --help\n```\n")
    assert shell_commands(text) == ["scripts/plan --stack dev", "scripts/up --stack dev",
                                    "scripts/submit --stack dev --dry-run -- --steps 5"]
    assert offline_commands(shell_commands(text)) == ["scripts/plan --stack dev",
                                                      "scripts/submit --stack dev --dry-run -- --steps 5"]


def test_the_readmes_offline_commands_run_as_written(dev_outputs_file):
    commands = offline_commands(shell_commands(README.read_text()))
    kinds = {("help" if c.endswith("--help") else c.split()[0]) for c in commands}
    assert kinds == {"help", "scripts/plan", "scripts/submit"}, commands
    for command in commands:
        # The one substitution: the outputs file the README names, written here from the dev stack.
        command = command.replace(README_OUTPUTS, str(dev_outputs_file))
        res = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        assert res.stdout.strip(), command
        if "--dry-run" in command:
            assert json.loads(res.stdout)["kind"] == "MPIJob"
