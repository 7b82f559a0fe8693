"""The policy pack over captured resources: committed stacks are clean; each policy catches a broken one."""

import json

import pytest

from infra.policy import policies as P
from tests.infra.policy_adapter import run_policies, run_resource_policy, run_stack_policy


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_committed_stacks_have_zero_violations(committed, stack):
    assert run_policies(P.ALL_POLICIES, committed(stack)) == []


def test_pack_covers_the_baseline_with_unique_names():
    names = [p.name for p in P.ALL_POLICIES]
    assert len(set(names)) == len(names) == 11
    assert set(names) == {"no-public-ingress", "imdsv2-required", "imds-hop-limit-1",
                          "eks-upgrade-policy-standard", "log-group-retention", "encryption-at-rest",
                          "required-tags", "s3-sse-kms", "s3-no-public-access", "s3-tls-only",
                          "efa-security-group-self-rules"}


def only(result, type_, name=None):
    return result.one(type_, name) if name else result.of_type(type_)[0]


def efa_launch_templates(result):
    return [lt for lt in result.of_type(P.T_LAUNCH_TEMPLATE)
            if any(n.get("interfaceType") in P.EFA_INTERFACE_TYPES
                   for n in lt.inputs.get("networkInterfaces", []))]


def set_both(res, key, value):
    """Change a property in inputs (resource policies) and state (stack policies) alike."""
    res.inputs[key] = value
    res.outputs[key] = value


# -- no-public-ingress -----------------------------------------------------------------------------

def test_public_ingress_rule_is_caught(committed):
    result = committed("dev")
    rule = result.one(P.T_INGRESS, "sg-node-self-in")
    del rule.inputs["referencedSecurityGroupId"]
    rule.inputs["cidrIpv4"] = "0.0.0.0/0"
    (v,) = run_resource_policy(P.no_public_ingress, result)
    assert v.urn == rule.urn and "0.0.0.0/0" in v.message


@pytest.mark.parametrize(("type_", "props"), [
    (P.T_SG, {"ingress": [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]}),
    (P.T_SG_RULE, {"type": "ingress", "ipv6CidrBlocks": ["::/0"]}),
    (P.T_EKS, {"vpcConfig": {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/0"]}}),
    (P.T_EKS, {"vpcConfig": {"subnetIds": ["s-1"]}}),  # AWS defaults: public, open to the world
])
def test_public_ingress_shapes(type_, props):
    assert P.public_ingress_findings(type_, props)


def test_private_or_restricted_eks_endpoint_passes():
    assert P.public_ingress_findings(P.T_EKS, {"vpcConfig": {"endpointPublicAccess": False}}) == []
    assert P.public_ingress_findings(P.T_EKS, {"vpcConfig": {"endpointPublicAccess": True,
                                                              "publicAccessCidrs": ["203.0.113.0/24"]}}) == []
    assert P.public_ingress_findings(P.T_SG_RULE, {"type": "egress", "cidrBlocks": ["0.0.0.0/0"]}) == []


# -- imdsv2-required ---------------------------------------------------------------------------------

def test_launch_template_without_imdsv2_is_caught(committed):
    result = committed("prod")
    lts = result.of_type(P.T_LAUNCH_TEMPLATE)
    assert lts, "the prod stack declares launch templates"
    lts[0].inputs["metadataOptions"] = {**lts[0].inputs.get("metadataOptions", {}), "httpTokens": "optional"}
    lts[-1].inputs.pop("metadataOptions", None)
    found = run_resource_policy(P.imdsv2_required, result)
    assert {v.urn for v in found} == {lts[0].urn, lts[-1].urn}


# -- imds-hop-limit-1 ---------------------------------------------------------------------------------

def test_launch_template_with_hop_limit_2_or_unset_is_caught(committed):
    result = committed("prod")
    lts = result.of_type(P.T_LAUNCH_TEMPLATE)
    assert len(lts) >= 2
    lts[0].inputs["metadataOptions"] = {**lts[0].inputs["metadataOptions"], "httpPutResponseHopLimit": 2.0}
    del lts[-1].inputs["metadataOptions"]["httpPutResponseHopLimit"]  # the AL2023 AMI's 2 applies
    found = run_resource_policy(P.imds_hop_limit_1, result)
    assert {v.urn for v in found} == {lts[0].urn, lts[-1].urn}
    assert all("pods cannot read the node role" in v.message for v in found)


# -- eks-upgrade-policy-standard ------------------------------------------------------------------------

@pytest.mark.parametrize("policy", [None, {"supportType": "EXTENDED"}])
def test_eks_cluster_left_on_extended_support_is_caught(committed, policy):
    result = committed("dev")
    eks = result.one(P.T_EKS)
    if policy is None:
        del eks.inputs["upgradePolicy"]  # EKS's default: EXTENDED
    else:
        eks.inputs["upgradePolicy"] = policy
    (v,) = run_resource_policy(P.eks_standard_support, result)
    assert v.urn == eks.urn and "EXTENDED" in v.message


# -- log-group-retention -----------------------------------------------------------------------------------

def test_log_group_without_retention_is_caught(committed):
    result = committed("prod")
    groups = result.of_type(P.T_LOG_GROUP)
    assert len(groups) >= 2
    del groups[0].inputs["retentionInDays"]
    groups[1].inputs["retentionInDays"] = 0.0  # 0 is "never expire" in PutRetentionPolicy terms too
    found = run_resource_policy(P.log_groups_expire, result)
    assert {v.urn for v in found} == {groups[0].urn, groups[1].urn}


# -- encryption-at-rest ------------------------------------------------------------------------------

def test_unencrypted_ecr_and_ebs_are_caught(committed):
    result = committed("prod")
    repo = only(result, P.T_ECR)
    repo.inputs["encryptionConfigurations"] = [{"encryptionType": "AES256"}]
    lt = result.of_type(P.T_LAUNCH_TEMPLATE)[0]
    mappings = lt.inputs["blockDeviceMappings"]
    mappings[0]["ebs"]["encrypted"] = "false"
    found = run_resource_policy(P.encryption_at_rest, result)
    assert {v.urn for v in found} == {repo.urn, lt.urn}


def test_eks_secrets_must_be_encrypted():
    assert P.encryption_findings(P.T_EKS, {"name": "c"})
    assert P.encryption_findings(P.T_EKS, {"encryptionConfig": {"resources": ["secrets"]}}) == []
    assert P.encryption_findings(P.T_EBS, {"encrypted": False})


# -- required-tags -----------------------------------------------------------------------------------

def test_missing_default_tag_is_caught_everywhere(committed):
    result = committed("dev")
    provider = result.one("pulumi:providers:aws")
    tags = json.loads(provider.inputs["defaultTags"])
    del tags["tags"]["owner"]
    provider.inputs["defaultTags"] = json.dumps(tags)
    found = run_resource_policy(P.required_tags, result)
    aws_count = len([r for r in result.resources if r.custom and r.type.startswith("aws:")])
    assert len(found) == aws_count and all("owner" in v.message for v in found)


def test_resource_on_the_default_provider_is_caught(committed):
    result = committed("dev")
    bucket = only(result, P.T_BUCKET)
    bucket.provider = ""
    (v,) = run_resource_policy(P.required_tags, result)
    assert v.urn == bucket.urn
    bucket.inputs["tags"] = {k: "x" for k in P.REQUIRED_TAG_KEYS}  # own tags are enough
    assert run_resource_policy(P.required_tags, result) == []


# -- S3 ------------------------------------------------------------------------------------------------

def test_bucket_without_kms_encryption_is_caught(committed):
    result = committed("dev")
    sse = result.of_type(P.T_SSE)
    sse[0].outputs["rules"][0]["applyServerSideEncryptionByDefault"] = {"sseAlgorithm": "AES256"}
    result.resources.remove(sse[1])
    found = run_stack_policy(P.s3_encryption, result)
    assert len(found) == 2 and {v.urn for v in found} == {b.urn for b in result.of_type(P.T_BUCKET)}


def test_public_bucket_is_caught(committed):
    result = committed("dev")
    block = result.of_type(P.T_PAB)[0]
    block.outputs["blockPublicPolicy"] = False
    policy = result.of_type(P.T_BUCKET_POLICY)[1]
    doc = json.loads(policy.outputs["policy"])
    doc["Statement"].append({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"})
    policy.outputs["policy"] = json.dumps(doc)
    found = run_stack_policy(P.s3_no_public, result)
    assert len(found) == 2
    assert any("public access block" in v.message for v in found)
    assert any(v.urn == policy.urn and "allows everyone" in v.message for v in found)


def test_bucket_without_tls_only_policy_is_caught(committed):
    result = committed("dev")
    policy = result.of_type(P.T_BUCKET_POLICY)[0]
    doc = json.loads(policy.outputs["policy"])
    doc["Statement"][0]["Condition"]["Bool"]["aws:SecureTransport"] = "true"
    policy.outputs["policy"] = json.dumps(doc)
    (v,) = run_stack_policy(P.s3_tls_only, result)
    assert v.urn in {b.urn for b in result.of_type(P.T_BUCKET)} and "TLS" in v.message
    result.resources.remove(result.of_type(P.T_BUCKET_POLICY)[1])
    assert len(run_stack_policy(P.s3_tls_only, result)) == 2


# -- EFA self rules ------------------------------------------------------------------------------------

def test_prod_efa_interfaces_use_the_self_referencing_group(committed):
    result = committed("prod")
    efa_sg = result.one(P.T_SG, "sg-efa")
    lts = efa_launch_templates(result)
    assert lts, "prod declares EFA launch templates"
    for lt in lts:
        for nic in lt.inputs["networkInterfaces"]:
            assert efa_sg.id in nic["securityGroups"]


def test_missing_self_egress_is_caught(committed):
    result = committed("prod")
    egress = result.one(P.T_EGRESS, "sg-efa-self-out")
    result.resources.remove(egress)
    found = run_stack_policy(P.efa_self_rules, result)
    lts = efa_launch_templates(result)
    assert {v.urn for v in found} == {lt.urn for lt in lts}
    assert all("self egress NO" in v.message and "Unresponsive receiver" in v.message for v in found)


def test_self_ingress_alone_or_open_egress_is_not_enough(committed):
    result = committed("prod")
    egress = result.one(P.T_EGRESS, "sg-efa-self-out")
    del egress.outputs["referencedSecurityGroupId"]
    egress.outputs["cidrIpv4"] = "0.0.0.0/0"  # egress to the world does not carry EFA traffic
    assert len(run_stack_policy(P.efa_self_rules, result)) == len(efa_launch_templates(result))


def test_efa_interface_in_a_group_without_rules_is_caught():
    sg = P.Res(P.T_SG, "urn:sg", "sg", {"id": "sg-1", "ingress": [{"protocol": "-1", "self": True}]})
    lt = P.Res(P.T_LAUNCH_TEMPLATE, "urn:lt", "lt", {
        "networkInterfaces": [{"deviceIndex": 0, "interfaceType": "efa", "securityGroups": ["sg-1"]}]})
    (finding,) = P.efa_findings([sg, lt])
    assert finding[0] == "urn:lt"
    sg.props["egress"] = [{"protocol": "-1", "self": True}]  # inline self rules in both directions
    assert P.efa_findings([sg, lt]) == []
