"""Bad compute config fails the whole program with ONE clear message, before any resource exists."""

from __future__ import annotations

import copy

import pulumi
import pytest

from tests.infra.harness import run_program, stack_config

GPU_GROUP = {
    "name": "gpu", "instanceTypes": ["g5.12xlarge"], "capacityType": "ON_DEMAND",
    "minSize": 0, "maxSize": 2, "desiredSize": 0, "efa": False, "placementGroup": False, "rootVolumeGiB": 200,
}


def dev_with(**changes) -> dict:
    cfg = copy.deepcopy(stack_config("dev"))
    for key, value in changes.items():
        cfg[f"ringtrain:{key}"] = value
    return cfg


def group(**changes) -> dict:
    return {**GPU_GROUP, **changes}


def fails_with(cfg: dict) -> str:
    with pytest.raises(pulumi.RunError) as info:
        run_program("dev", config=cfg)
    message = str(info.value)
    assert "Traceback" not in message
    return message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param(
            {"nodeGroups": [group(instanceTypes=["g6e.12xlarge"], efa=True)]},
            "ringtrain:nodeGroups[0].instanceTypes[0]: \"g6e.12xlarge\" is invalid: "
            "an EFA-capable type while efa is true",
            id="efa-on-a-type-without-efa"),
        pytest.param(
            {"nodeGroups": [group(capacityType="SPOT", instanceTypes=["g5.12xlarge", "g5.48xlarge"])]},
            "ringtrain:nodeGroups[0].instanceTypes[1]: \"g5.48xlarge\" is invalid: a type with 4 GPUs like "
            "g5.12xlarge (one group, one GPU count)",
            id="spot-group-mixing-gpu-counts"),
        pytest.param(
            {"costGuard": {"idleMinutes": 0, "idleGpuUtilizationPercent": 5, "monthlyBudgetUsd": 500,
                           "notificationEmail": "ops@example.com"}},
            "ringtrain:costGuard.idleMinutes: 0 is invalid: an integer 1..1440",
            id="idle-timeout-zero"),
        pytest.param(
            {"nodeGroups": [group(minSize=1, desiredSize=1)]},
            "ringtrain:nodeGroups[0].minSize: 1 is invalid: 0 (GPU node groups scale to zero when idle",
            id="gpu-group-that-cannot-scale-to-zero"),
    ],
)
def test_bad_compute_config_is_one_clear_error(changes, expected):
    message = fails_with(dev_with(**changes))
    assert expected in message


def test_a_good_variant_of_the_same_config_runs():
    # The failing cases above differ from this one only in the value under test.
    result = run_program("dev", config=dev_with(nodeGroups=[group(instanceTypes=["g5.12xlarge"], efa=True)]))
    (lt,) = [r for r in result.of_type("aws:ec2/launchTemplate:LaunchTemplate") if r.name == "nodes-gpu-lt"]
    # g5.12xlarge: one card, one EFA-only interface beside the primary ENA interface (infra/efa.py)
    assert [n["interfaceType"] for n in lt.inputs["networkInterfaces"]] == ["interface", "efa-only"]


def test_admin_principals_become_cluster_admin_access_entries():
    cfg = dev_with()
    admins = ["arn:aws:iam::123456789012:role/platform-admin", "arn:aws:iam::123456789012:user/alice"]
    cfg["ringtrain:cluster"] = {**cfg["ringtrain:cluster"], "adminPrincipalArns": admins}
    result = run_program("dev", config=cfg)  # the harness's caller: a session of the first admin
    # Exactly the listed principals get entries (the caller is one of them; it gets no extra entry).
    entries = result.of_type("aws:eks/accessEntry:AccessEntry")
    assert sorted(e.inputs["principalArn"] for e in entries) == sorted(admins)
    assocs = result.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert sorted(a.inputs["principalArn"] for a in assocs) == sorted(admins)
    for assoc in assocs:
        assert assoc.inputs["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")
        assert assoc.inputs["accessScope"] == {"type": "cluster"}
    # No aws-auth ConfigMap anywhere: access is API-mode entries only.
    assert not [r for r in result.resources if r.type == "kubernetes:core/v1:ConfigMap"]


def test_admins_of_another_account_or_none_at_all_are_refused():
    cfg = dev_with()
    cfg["ringtrain:cluster"] = {**cfg["ringtrain:cluster"],
                                "adminPrincipalArns": ["arn:aws:iam::999999999999:role/admin"]}
    assert ('ringtrain:cluster.adminPrincipalArns[0]: "arn:aws:iam::999999999999:role/admin" is invalid: '
            "a principal of ringtrain:accountId 123456789012") in fails_with(cfg)
    cfg["ringtrain:cluster"] = {**cfg["ringtrain:cluster"], "adminPrincipalArns": []}
    assert "ringtrain:cluster.adminPrincipalArns: [] is invalid: at least one IAM role or user ARN" \
        in fails_with(cfg)


def test_admin_principal_that_is_not_an_iam_arn_is_refused():
    cfg = dev_with()
    cfg["ringtrain:cluster"] = {**cfg["ringtrain:cluster"], "adminPrincipalArns": ["alice"]}
    expected = ("ringtrain:cluster.adminPrincipalArns: [\"alice\"] is invalid: "
                "'alice' is not an IAM role or user ARN")
    assert expected in fails_with(cfg)


def test_compute_false_declares_none_of_the_compute_layer():
    result = run_program("dev", config=dev_with(compute=False))
    compute_types = [r.type for r in result.resources
                     if r.type.startswith(("aws:eks/", "kubernetes:", "pulumi:providers:kubernetes",
                                           "aws:lambda/", "aws:ec2/launchTemplate",
                                           "aws:ec2/placementGroup", "ringtrain:compute:"))]
    assert compute_types == []
    for key in ("clusterName", "kubeconfig", "nodeGroups", "trainingRoleArn"):
        assert key not in result.exports
    assert result.exports["datasetsBucket"]  # the data layer stays
    assert len(result.of_type("aws:budgets/budget:Budget")) == 1  # and so does its budget


def test_capacity_reservation_is_targeted_by_the_launch_template_without_a_placement_group():
    reserved = group(name="reserved", instanceTypes=["p4d.24xlarge"], efa=True, placementGroup=False,
                     capacityReservationId="cr-0123456789abcdef0")
    result = run_program("dev", config=dev_with(nodeGroups=[reserved]))
    lt = result.one("aws:ec2/launchTemplate:LaunchTemplate", "nodes-reserved-lt")
    target = lt.inputs["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target == {"capacityReservationId": "cr-0123456789abcdef0"}
    assert not lt.inputs.get("placement")
    # p4d.24xlarge: 4 cards, 4 EFA-only interfaces beside the primary ENA interface
    assert sum(n["interfaceType"] == "efa-only" for n in lt.inputs["networkInterfaces"]) == 4
    assert result.of_type("aws:ec2/placementGroup:PlacementGroup") == []
