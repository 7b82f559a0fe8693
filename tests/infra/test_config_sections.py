"""check_semantics is composed of one check per config section; each works on its section alone
(the whole-config cases are in test_config.py)."""

import pytest

from infra.catalog import load_catalog
from infra.config import (
    ConfigError,
    check_cluster,
    check_network,
    check_node_group,
    check_node_groups,
    parse_stack_config,
    raw_namespace,
)
from tests.infra.harness import engine_config, stack_config

CATALOG = load_catalog()


def settings(stack: str):
    cfg = stack_config(stack)
    return parse_stack_config(raw_namespace(engine_config(cfg)), cfg["aws:region"])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_each_section_of_the_committed_stacks_passes_its_check(stack):
    s = settings(stack)
    check_network(s.stack.network, s.region)
    check_cluster(s.stack.cluster, CATALOG)
    check_node_groups(s.stack.node_groups, s.stack.compute, CATALOG)
    for i, group in enumerate(s.stack.node_groups):
        check_node_group(f"nodeGroups[{i}]", group, CATALOG)


def test_a_section_check_names_the_key_of_its_own_section():
    s = settings("dev")
    network = s.stack.network.model_copy(update={"gpu_availability_zone": "mars-1a"})
    with pytest.raises(ConfigError, match=r"network\.gpuAvailabilityZone"):
        check_network(network, s.region)
    cluster = s.stack.cluster.model_copy(update={"public_access_cidrs": ["0.0.0.0/0"]})
    with pytest.raises(ConfigError, match=r"cluster\.publicAccessCidrs\[0\]"):
        check_cluster(cluster, CATALOG)
    group = s.stack.node_groups[0].model_copy(update={"min_size": 1, "max_size": 4})
    with pytest.raises(ConfigError, match=r"nodeGroups\[3\]\.minSize"):
        check_node_group("nodeGroups[3]", group, CATALOG)
    with pytest.raises(ConfigError, match=r"nodeGroups\[1\]\.name"):
        check_node_groups([s.stack.node_groups[0]] * 2, True, CATALOG)
