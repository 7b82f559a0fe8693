"""Stack and config errors are bad input: `ringtrain plan` says what is wrong in one line, naming the file
(and, for YAML that does not parse, the line), and exits 2, never 1 or a traceback."""

from __future__ import annotations

import pytest

import infra.stacks
from cluster import cli
from infra.stacks import REPO_ROOT


@pytest.fixture
def stacks(tmp_path, monkeypatch):
    """A stack directory with the committed dev stack, and a way to add variants of it."""
    dev = (REPO_ROOT / "Pulumi.dev.yaml").read_text()
    monkeypatch.setattr(infra.stacks, "REPO_ROOT", tmp_path)

    def add(name: str, text: str) -> None:
        (tmp_path / f"Pulumi.{name}.yaml").write_text(text)

    add("dev", dev)
    add.dev = dev
    return add


def _plan(capsys, stack: str) -> tuple[int, str]:
    code = cli.main(["plan", "--stack", stack])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip()


def test_an_unknown_stack_is_bad_input(capsys):
    code, err = _plan(capsys, "nope")
    assert code == 2
    assert err.startswith("plan: error: stack 'nope' has no Pulumi.nope.yaml") and "dev, prod" in err


def test_a_wrong_type_in_a_stack_file_is_bad_input(stacks, capsys):
    stacks("typo", stacks.dev.replace("ttlHours: 72", "ttlHours: many"))
    code, err = _plan(capsys, "typo")
    assert code == 2
    assert err == 'plan: error: stack \'typo\': ringtrain:ttlHours: "many" is invalid: an integer 1..8760'


def test_a_stack_file_that_is_not_yaml_names_the_file_and_the_line(stacks, capsys):
    broken = stacks.dev.replace("ringtrain:owner: ml-platform", "ringtrain:owner: ml: platform")
    line = 1 + broken.splitlines().index("  ringtrain:owner: ml: platform")
    stacks("broken", broken)
    code, err = _plan(capsys, "broken")
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(f"plan: error: stack 'broken': Pulumi.broken.yaml, line {line}: not valid YAML "
                          "(mapping values are not allowed here)")


@pytest.mark.parametrize("text", ["config:\n  - a\n", "- config\n", "config: 3\n"])
def test_a_stack_file_without_a_config_mapping_is_bad_input(stacks, capsys, text):
    stacks("odd", text)
    code, err = _plan(capsys, "odd")
    assert code == 2
    assert err.startswith("plan: error: stack 'odd': Pulumi.odd.yaml: expected a mapping with a `config:`")
