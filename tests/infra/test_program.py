"""Program-wide properties: one explicit tagged provider, components with clear types, children parented,
the documented exports."""

import json

import pytest

from infra.tags import REQUIRED_TAG_KEYS

BASE_EXPORTS = {"vpcId", "privateSubnetIds", "gpuSubnetIds", "efaSecurityGroupId", "datasetsBucket",
                "checkpointsBucket", "ecrRepositoryUrl", "kmsKeyArn"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_default_tags_on_the_one_aws_provider(committed, stack):
    result = committed(stack)
    (provider,) = result.of_type("pulumi:providers:aws")
    assert provider.inputs["region"] == result.config["aws:region"]
    tags = json.loads(provider.inputs["defaultTags"])["tags"]
    assert set(tags) == set(REQUIRED_TAG_KEYS)
    assert tags == {"project": "ringtrain", "stack": stack, "owner": result.config["ringtrain:owner"],
                    "cost-center": result.config["ringtrain:costCenter"],
                    "ttl": f"{result.config['ringtrain:ttlHours']}h"}
    aws_resources = [r for r in result.resources if r.type.startswith("aws:")]
    assert aws_resources
    strays = [r.name for r in aws_resources if r.provider_urn != provider.urn]
    assert strays == [], "every AWS resource must use the tagged provider, never the default one"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_components_have_type_tokens_and_own_their_children(committed, stack):
    result = committed(stack)
    components = [r for r in result.resources if not r.custom]
    assert {"ringtrain:network:Network", "ringtrain:security:SecurityGroups", "ringtrain:data:DataLayer"} \
        <= {c.type for c in components}
    ours = [c for c in components if c.type.startswith("ringtrain:")]
    assert all(len(c.type.split(":")) == 3 and c.type.split(":")[2][:1].isupper() for c in ours)
    stack_urn = f"urn:pulumi:{stack}::ringtrain::pulumi:pulumi:Stack::ringtrain-{stack}"
    orphans = [r.name for r in result.resources
               if r.custom and not r.type.startswith("pulumi:providers:") and r.parent == stack_urn]
    assert orphans == [], "resources sit under a component, not at the stack root"


def test_base_components_hold_the_network_security_and_data(committed):
    result = committed("prod")
    owner = {r.urn: next((a.type for a in result.ancestors(r) if a.type.startswith("ringtrain:")), None)
             for r in result.resources}
    expect = {
        "aws:ec2/vpc:Vpc": "ringtrain:network:Network",
        "aws:ec2/natGateway:NatGateway": "ringtrain:network:Network",
        "aws:ec2/flowLog:FlowLog": "ringtrain:network:Network",
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": "ringtrain:security:SecurityGroups",

        "aws:ecr/repository:Repository": "ringtrain:data:DataLayer",
    }
    for type_, component in expect.items():
        assert {owner[r.urn] for r in result.of_type(type_)} == {component}, type_
    # Keys and bucket policies: the data layer's, and prod's flow-log bucket's in the network.
    data, net = "ringtrain:data:DataLayer", "ringtrain:network:Network"
    for type_, names in (("aws:s3/bucketPolicy:BucketPolicy", ("data-datasets", "data-checkpoints")),
                         ("aws:kms/key:Key", ("data-key",))):
        assert {r.name: owner[r.urn] for r in result.of_type(type_)} == {
            **dict.fromkeys(names, data), "net-flow-logs": net}, type_


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_documented_exports(committed, stack):
    result = committed(stack)
    assert set(result.exports) >= BASE_EXPORTS
    assert result.exports["vpcId"] == result.one("aws:ec2/vpc:Vpc").id


def test_project_file_points_pulumi_at_the_program():
    import yaml

    from tests.infra.harness import PROGRAM, REPO_ROOT

    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "ringtrain"
    assert project["runtime"] == {"name": "python", "options": {"virtualenv": ".venv"}}
    assert (REPO_ROOT / project["main"] / "__main__.py").resolve() == PROGRAM
