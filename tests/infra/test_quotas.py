"""EC2 vCPU quotas a stack needs at full scale (infra/quotas.py)."""

from __future__ import annotations

import pytest

from infra.catalog import load_catalog
from infra.config import parse_stack_config, raw_namespace
from infra.quotas import QuotaError, check_quota_values, quota_family, quota_needs
from tests.infra.harness import engine_config, stack_config


def settings(stack: str, **changes):
    cfg = {**stack_config(stack), **changes}
    return parse_stack_config(raw_namespace(engine_config(cfg)), cfg["aws:region"])


def test_instance_families_map_to_their_quota_group():
    assert [quota_family(t) for t in ("p5.48xlarge", "p4d.24xlarge", "p5en.48xlarge")] == ["p"] * 3
    gpu = ("g5.12xlarge", "g6e.12xlarge", "g4dn.xlarge", "vt1.3xlarge")
    assert [quota_family(t) for t in gpu] == ["g"] * 4
    assert [quota_family(t) for t in ("m7i.large", "c7i.large", "r7i.large", "t3.micro")] == ["standard"] * 4
    assert [quota_family(t) for t in ("inf2.xlarge", "trn1.32xlarge", "dl1.24xlarge", "x2idn.16xlarge",
                                      "f1.2xlarge")] == [None] * 5


def test_every_catalog_type_has_a_quota_group():
    catalog = load_catalog()
    assert [t for t in catalog.gpu_types() + catalog.cpu_types() if quota_family(t) is None] == []


def test_needs_sum_max_size_times_the_widest_type_per_quota():
    needs, unchecked = quota_needs(settings("prod"), load_catalog())
    assert unchecked == []
    assert {n.code: (n.vcpus, n.groups) for n in needs} == {
        "L-1216C47A": (4 * 4, ("system",)),                 # m7i.xlarge: 4 vCPUs, maxSize 4
        "L-417A185B": (4 * 192, ("h100-ondemand",)),        # p5.48xlarge on demand
        "L-7212CCBC": (4 * 192, ("h100-spot",)),            # p5.48xlarge spot
    }
    dev, _ = quota_needs(settings("dev"), load_catalog())
    assert {n.code: n.vcpus for n in dev}["L-3819A6DF"] == 2 * 4 * 96  # g5/g6.24xlarge, two spot groups


def test_capacity_block_groups_use_bought_capacity_not_quota():
    groups = [*stack_config("prod")["ringtrain:nodeGroups"],
              {"name": "h100-block", "instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK",
               "capacityReservationId": "cr-02168da1478b509e0", "minSize": 0, "maxSize": 2, "desiredSize": 0,
               "efa": True, "placementGroup": False}]
    needs, _ = quota_needs(settings("prod", **{"ringtrain:nodeGroups": groups}), load_catalog())
    assert all("h100-block" not in n.groups for n in needs)


def test_a_short_quota_is_one_message_naming_it_and_how_to_raise_it():
    needs, _ = quota_needs(settings("prod"), load_catalog())
    check_quota_values(needs, {"L-417A185B": 768.0, "L-7212CCBC": 1000.0}, "us-west-2")  # enough
    with pytest.raises(QuotaError) as info:
        check_quota_values(needs, {"L-417A185B": 192.0}, "us-west-2")
    message = str(info.value)
    assert message.startswith("EC2 vCPU quota too low: Running On-Demand P instances (L-417A185B) is 192 "
                              "vCPUs in us-west-2, and node group(s) h100-ondemand need 768 at maxSize.")
    assert "--quota-code L-417A185B --desired-value 768 --region us-west-2" in message and "\n" not in message
