"""Kubernetes versions over a stack's life (infra/versions.py): warn before EKS upgrades the control
plane at the end of standard support, and keep the running version after it did."""

from __future__ import annotations

from datetime import date

import pulumi
import pytest

from infra.config import SUPPORTED_KUBERNETES
from infra.versions import END_OF_STANDARD_SUPPORT, VersionError, effective_version, support_notice
from tests.infra.harness import EKS_CLUSTER_INVOKE, run_program


def test_no_notice_while_standard_support_is_far():
    assert support_notice("1.35", "STANDARD", date(2026, 12, 6)) is None


def test_notice_from_60_days_before_the_end_and_after_it():
    end = END_OF_STANDARD_SUPPORT["1.35"]
    assert end == date(2027, 3, 27)
    assert support_notice("1.35", "STANDARD", date(2027, 1, 25)) is None  # 61 days before
    soon = support_notice("1.35", "STANDARD", date(2027, 1, 26))
    assert soon.startswith("Kubernetes 1.35: EKS standard support ends in 60 days (2027-03-27); "
                           "EKS then upgrades the control plane itself")
    past = support_notice("1.35", "EXTENDED", date(2027, 4, 1))
    assert "ended on 2027-03-27" in past and "extended support ($0.60/h" in past


def test_a_version_without_a_recorded_date_says_where_to_read_it():
    assert END_OF_STANDARD_SUPPORT["1.36"] is None
    assert "aws eks describe-cluster-versions --cluster-versions 1.36" in support_notice(
        "1.36", "STANDARD", date(2026, 12, 6))


def test_every_supported_version_has_an_entry():
    assert set(SUPPORTED_KUBERNETES) <= set(END_OF_STANDARD_SUPPORT)


def test_effective_version_never_asks_for_a_downgrade():
    assert effective_version("1.35", None, SUPPORTED_KUBERNETES) == ("1.35", None)
    assert effective_version("1.36", "1.35", SUPPORTED_KUBERNETES) == ("1.36", None)  # an upgrade we ask for
    version, warning = effective_version("1.35", "1.36", SUPPORTED_KUBERNETES)
    assert version == "1.36" and 'Set cluster.kubernetesVersion to "1.36"' in warning
    with pytest.raises(VersionError, match="the cluster runs Kubernetes 1.37 .*newer than"):
        effective_version("1.36", "1.37", SUPPORTED_KUBERNETES)


def _running(version: str):
    def cluster(args, region):
        name = args["name"]
        return {"name": name, "id": name, "endpoint": f"https://{name}.gr7.{region}.eks.amazonaws.com",
                "arn": f"arn:aws:eks:{region}:123456789012:cluster/{name}", "status": "ACTIVE",
                "version": version}
    return {EKS_CLUSTER_INVOKE: cluster}


def test_after_an_eks_auto_upgrade_the_program_declares_the_running_version(committed):
    """EKS upgraded a STANDARD-support cluster from 1.35 to 1.36; the stack file still says 1.35. The
    program must not send UpdateClusterVersion 1.35 (a downgrade EKS refuses): cluster, node groups and
    add-on pins follow 1.36."""
    from infra.cluster import ADDON_VERSIONS

    prod = committed("prod").config
    cluster_cfg = {**prod["ringtrain:cluster"], "kubernetesVersion": "1.35"}
    result = run_program("prod", overrides={"ringtrain:cluster": cluster_cfg}, invokes=_running("1.36"))
    (eks,) = result.of_type("aws:eks/cluster:Cluster")
    assert eks.inputs["version"] == "1.36"
    assert {a.inputs["addonName"]: a.inputs.get("addonVersion")
            for a in result.of_type("aws:eks/addon:Addon")} == {
        name: pinned or f"v0.0.0-offline-default-{name}-1.36"
        for name, pinned in ADDON_VERSIONS["1.36"].items()}
    assert {g.inputs["version"] for g in result.of_type("aws:eks/nodeGroup:NodeGroup")} == {"1.36"}


def test_a_running_version_without_pins_stops_the_run_before_declaring_anything():
    with pytest.raises(pulumi.RunError) as info:
        run_program("prod", invokes=_running("1.37"))
    assert "the cluster runs Kubernetes 1.37" in str(info.value)
    assert [r.type for r in info.value.harness_resources if not r.type.startswith("pulumi:providers:")] == []


def test_the_offline_plan_carries_the_support_notice():
    from cluster.aws.plan import offline_plan

    notes = offline_plan("dev", 1.0).notes
    assert any("end of EKS standard support is not recorded" in n for n in notes)
