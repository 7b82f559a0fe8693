"""The pack's entry point builds one PolicyPack from the importable policies (the pack never starts here)."""

import runpy
from pathlib import Path

import pulumi_policy
import yaml

from infra.policy import policies

PACK_DIR = Path(__file__).resolve().parents[2] / "infra" / "policy"


def test_entry_point_builds_the_pack_from_all_policies(monkeypatch):
    built = []

    class RecordingPack:  # stands in for PolicyPack, which would start a gRPC server and block
        def __init__(self, name, policies, enforcement_level=None, **kw):
            built.append((name, list(policies), enforcement_level))

    monkeypatch.setattr(pulumi_policy, "PolicyPack", RecordingPack)
    runpy.run_path(str(PACK_DIR / "__main__.py"), run_name="__main__")
    ((name, pack_policies, level),) = built
    assert name == "ringtrain-baseline" and level == pulumi_policy.EnforcementLevel.MANDATORY
    assert pack_policies == list(policies.ALL_POLICIES)


def test_policies_module_builds_no_pack():
    assert not any(isinstance(v, pulumi_policy.PolicyPack) for v in vars(policies).values())
    assert "PolicyPack(" not in (PACK_DIR / "policies.py").read_text()


def test_pack_manifest_uses_the_project_virtualenv():
    manifest = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert manifest["runtime"]["name"] == "python"
    venv = (PACK_DIR / manifest["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == (PACK_DIR.parents[1] / ".venv").resolve()
