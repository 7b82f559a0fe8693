"""Pure EFA layout and IAM documents of the compute layer (no Pulumi)."""

from __future__ import annotations

import json
import warnings

import pytest

from infra import iam
from infra.efa import EfaInterface, efa_interfaces

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # parliament imports pkg_resources
    import parliament


def parliament_findings(doc: dict) -> list[str]:
    policy = parliament.analyze_policy_string(json.dumps(doc))
    return [f"{f.issue}: {f.detail}" for f in policy.findings]


@pytest.mark.parametrize(
    ("instance_type", "cards"),
    [("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("p4d.24xlarge", 4), ("g5.8xlarge", 1)],
)
def test_efa_layout_is_the_ec2_guides_maximum_bandwidth_layout(instance_type, cards):
    """EC2 user guide efa-acc-inst-types ("Maximize network bandwidth ... multiple network cards"):
    primary (card 0, device 0) an ENA interface, never EFA-only; card 0 device 1 EFA-only; every other
    card device 0 EFA-only. One EFA device per card, and only the primary takes a VPC address."""
    layout = efa_interfaces(cards)
    assert layout[0] == EfaInterface(network_card_index=0, device_index=0, interface_type="interface")
    efa = layout[1:]
    assert [(i.network_card_index, i.device_index) for i in efa] == \
        [(0, 1)] + [(card, 0) for card in range(1, cards)], instance_type
    assert {i.interface_type for i in efa} == {"efa-only"}
    # EC2 refuses two interfaces at one (card, device) slot.
    slots = [(i.network_card_index, i.device_index) for i in layout]
    assert len(set(slots)) == len(slots)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4", True, None])
def test_efa_interfaces_rejects_non_positive_or_non_int(bad):
    with pytest.raises(ValueError, match="network_cards must be an integer >= 1"):
        efa_interfaces(bad)


DATASETS = "arn:aws:s3:::acme-ringtrain-dev-datasets"
CHECKPOINTS = "arn:aws:s3:::acme-ringtrain-dev-checkpoints"
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def grants(doc: dict) -> dict[str, set[str]]:
    """resource -> actions allowed on it."""
    out: dict[str, set[str]] = {}
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        for res in st["Resource"]:
            out.setdefault(res, set()).update(st["Action"])
    return out


def test_training_policy_grants_exactly_read_datasets_readwrite_checkpoints():
    doc = iam.training_role_policy(DATASETS, CHECKPOINTS, KEY, "us-east-1")
    assert grants(doc) == {
        DATASETS: {"s3:ListBucket"},
        f"{DATASETS}/*": {"s3:GetObject"},
        CHECKPOINTS: {"s3:ListBucket"},
        f"{CHECKPOINTS}/*": {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"},
        KEY: {"kms:Decrypt", "kms:GenerateDataKey"},
    }
    kms = [st for st in doc["Statement"] if st["Resource"] == [KEY]][0]
    assert kms["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    assert parliament_findings(doc) == []


def test_parliament_would_flag_a_wildcard_policy():
    # The linter is live: the same check reports a broad grant.
    doc = iam.training_role_policy(DATASETS, CHECKPOINTS, KEY, "us-east-1")
    doc["Statement"].append({"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]})
    assert parliament_findings(doc) != []


@pytest.mark.parametrize(
    ("datasets", "checkpoints", "key"),
    [("*", CHECKPOINTS, KEY), (DATASETS, "arn:aws:s3:::*", KEY), (DATASETS, CHECKPOINTS, "*"),
     ("acme-datasets", CHECKPOINTS, KEY)],
)
def test_training_policy_refuses_wildcard_or_non_arn(datasets, checkpoints, key):
    with pytest.raises(ValueError, match="must be a concrete ARN"):
        iam.training_role_policy(datasets, checkpoints, key, "us-east-1")


def test_pod_identity_trust_is_scoped_to_one_service_account_of_one_cluster():
    cluster = "arn:aws:eks:us-east-1:123456789012:cluster/ringtrain-dev"
    doc = iam.pod_identity_trust_policy(cluster, "training", "trainer")
    (st,) = doc["Statement"]
    assert st["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(st["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert st["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-arn": cluster,
        "aws:RequestTag/kubernetes-namespace": "training",
        "aws:RequestTag/kubernetes-service-account": "trainer",
    }
