"""Security groups: EFA self rules both ways, nothing open to the world."""

import pytest

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG = "aws:ec2/securityGroup:SecurityGroup"


def rules_of(result, sg, type_):
    return [r for r in result.of_type(type_) if r.inputs["securityGroupId"] == sg.id]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_efa_group_allows_all_traffic_to_and_from_itself_only(committed, stack):
    result = committed(stack)
    efa = result.one(SG, "sg-efa")
    assert result.exports["efaSecurityGroupId"] == efa.id
    (inbound,) = rules_of(result, efa, INGRESS)
    (outbound,) = rules_of(result, efa, EGRESS)
    for rule in (inbound, outbound):
        assert rule.inputs["ipProtocol"] == "-1"
        assert rule.inputs["referencedSecurityGroupId"] == efa.id
        assert "cidrIpv4" not in rule.inputs


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_ingress_from_anywhere(committed, stack):
    result = committed(stack)
    for rule in result.of_type(INGRESS):
        assert rule.inputs.get("cidrIpv4") != "0.0.0.0/0" and rule.inputs.get("cidrIpv6") != "::/0"
        assert "referencedSecurityGroupId" in rule.inputs, rule.name
    for sg in result.of_type(SG):
        assert not sg.inputs.get("ingress"), "rules are separate resources, never inline"


def test_nodes_and_control_plane_reach_each_other(committed):
    result = committed("dev")
    node, cluster = result.one(SG, "sg-node"), result.one(SG, "sg-cluster")
    node_in = {(r.inputs.get("fromPort"), r.inputs["referencedSecurityGroupId"])
               for r in rules_of(result, node, INGRESS)}
    assert (10250.0, cluster.id) in node_in and (None, node.id) in node_in
    (api,) = rules_of(result, cluster, INGRESS)
    assert (api.inputs["fromPort"], api.inputs["referencedSecurityGroupId"]) == (443.0, node.id)
    (node_out,) = rules_of(result, node, EGRESS)
    assert node_out.inputs["cidrIpv4"] == "0.0.0.0/0"
    (cluster_out,) = rules_of(result, cluster, EGRESS)
    assert cluster_out.inputs["cidrIpv4"] == result.config["ringtrain:network"]["cidr"]
