"""The compute layer as declared for every committed stack (Pulumi.<stack>.yaml), under Pulumi mocks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from cluster.aws.outputs import parse_outputs
from infra import cluster as eks_cluster
from infra import iam, platform
from infra.catalog import load_catalog
from infra.config import parse_stack_config, raw_namespace
from infra.costguard import CHECK_EVERY_MINUTES, LAMBDA_HANDLER
from infra.efa import efa_interfaces
from infra.nodegroups import EFA_PRESENT_LABEL, GPU_AMI_TYPE, NODE_POOL_LABEL, node_group_name
from infra.scale_to_zero import NOTIFIED_TAG
from tests.infra.harness import COMMITTED_STACKS, engine_config, run_program

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # parliament imports pkg_resources
    import parliament

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


@pytest.fixture(scope="module", params=COMMITTED_STACKS)
def stack(request):
    result = run_program(request.param)
    settings = parse_stack_config(raw_namespace(engine_config(result.config)), result.config["aws:region"])
    assert settings.stack.compute, f"committed stack {request.param} should declare compute"
    return result, settings.stack


def gpu_groups(cfg):
    return {g.name: g for g in cfg.node_groups}


def node_group(result, cfg, group_name):
    eks_name = node_group_name(eks_cluster.cluster_name(result.stack), group_name)
    (ng,) = [r for r in result.of_type(NODE_GROUP) if r.inputs["nodeGroupName"] == eks_name]
    return ng


def launch_template_of(result, ng):
    lt_id = ng.inputs["launchTemplate"]["id"]
    (lt,) = [r for r in result.of_type(LAUNCH_TEMPLATE) if r.id == lt_id]
    return lt


def sg_id(result, suffix):
    return result.one("aws:ec2/securityGroup:SecurityGroup", f"sg-{suffix}").id


def findings(doc: dict) -> list[str]:
    return [f"{f.issue}: {f.detail}" for f in parliament.analyze_policy_string(json.dumps(doc)).findings]


# -- node groups and launch templates ---------------------------------------------------------


def test_efa_launch_templates_carry_one_interface_per_card_in_the_efa_group(stack):
    result, cfg = stack
    catalog = load_catalog()
    efa_sg = sg_id(result, "efa")
    efa_groups = [g for g in cfg.node_groups if g.efa]
    for group in cfg.node_groups:
        lt = launch_template_of(result, node_group(result, cfg, group.name))
        interfaces = lt.inputs.get("networkInterfaces") or []
        if not group.efa:
            assert interfaces == [], group.name
            assert lt.inputs["vpcSecurityGroupIds"] == [sg_id(result, "node")]
            continue
        cards = catalog[group.instance_types[0]].network_cards
        assert len(interfaces) == cards + 1, group.name  # the primary ENA + one EFA-only per card
        got = [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in interfaces]
        want = [(float(i.network_card_index), float(i.device_index), i.interface_type)
                for i in efa_interfaces(cards)]
        assert got == want
        assert got[0] == (0.0, 0.0, "interface")
        assert sum(1 for *_, kind in got if kind == "efa-only") == cards
        for iface in interfaces:
            assert efa_sg in iface["securityGroups"]
            assert iface["deleteOnTermination"] == "true"
        # Interfaces carry the security groups; a template-level list would conflict with them.
        assert not lt.inputs.get("vpcSecurityGroupIds")
    if result.stack == "prod":
        assert efa_groups, "the prod stack is the EFA stack"
        # p5.48xlarge: 32 EFA-only interfaces (one per network card) + the primary ENA interface.
        assert {sum(1 for nic in launch_template_of(result, node_group(result, cfg, g.name))
                    .inputs["networkInterfaces"] if nic["interfaceType"] == "efa-only")
                for g in efa_groups} == {32}


def test_efa_groups_sit_in_the_single_gpu_az_and_a_cluster_placement_group_unless_opted_out(stack):
    result, cfg = stack
    gpu_subnets = result.exports["gpuSubnetIds"]
    assert len(gpu_subnets) == 1
    subnets = {s.id: s for s in result.of_type("aws:ec2/subnet:Subnet")}
    assert subnets[gpu_subnets[0]].inputs["availabilityZone"] == cfg.network.gpu_availability_zone
    placement_groups = {r.inputs["name"]: r for r in result.of_type("aws:ec2/placementGroup:PlacementGroup")}
    for group in cfg.node_groups:
        ng = node_group(result, cfg, group.name)
        assert ng.inputs["subnetIds"] == gpu_subnets, group.name
        placement = launch_template_of(result, ng).inputs.get("placement")
        if group.efa and group.placement_group:
            pg = placement_groups[placement["groupName"]]
            assert pg.inputs["strategy"] == "cluster"
        else:
            assert not placement, group.name
    wanted = sum(1 for g in cfg.node_groups if g.efa and g.placement_group)
    assert len(placement_groups) == wanted


def test_every_launch_template_requires_imdsv2_and_encrypts_its_root_volume(stack):
    result, cfg = stack
    lts = result.of_type(LAUNCH_TEMPLATE)
    assert len(lts) == len(cfg.node_groups) + 1  # + the system group
    for lt in lts:
        assert lt.inputs["metadataOptions"]["httpTokens"] == "required", lt.name
        assert lt.inputs["metadataOptions"]["httpEndpoint"] == "enabled"
        (root,) = lt.inputs["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        kinds = {spec["resourceType"] for spec in lt.inputs["tagSpecifications"]}
        assert kinds == {"instance", "volume", "network-interface"}
        for spec in lt.inputs["tagSpecifications"]:
            assert spec["tags"]["stack"] == result.stack  # the cost-allocation tag reaches the bill
    for group in cfg.node_groups:
        lt = launch_template_of(result, node_group(result, cfg, group.name))
        assert lt.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"] == group.root_volume_gib


def test_gpu_groups_shape_labels_taint_and_runtime_desired_size(stack):
    result, cfg = stack
    for group in cfg.node_groups:
        ng = node_group(result, cfg, group.name)
        assert ng.inputs["amiType"] == GPU_AMI_TYPE
        assert ng.inputs["instanceTypes"] == group.instance_types
        assert ng.inputs["capacityType"] == group.capacity_type
        assert ng.inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
        assert ng.inputs["labels"][NODE_POOL_LABEL] == group.name
        assert (ng.inputs["labels"].get(EFA_PRESENT_LABEL) == "true") == group.efa
        scaling = ng.inputs["scalingConfig"]
        assert (scaling["minSize"], scaling["maxSize"]) == (group.min_size, group.max_size)
        if group.capacity_type == "SPOT":
            assert scaling["minSize"] == 0
    for ng in result.of_type(NODE_GROUP):
        # Autoscaling and the cost guard own the desired size; `pulumi up` must not revert it.
        assert ng.ignore_changes == ["scalingConfig.desiredSize"], ng.name
        # Fixed EKS names: a forced replacement must delete the old group before creating the new.
        assert ng.delete_before_replace, ng.name


def test_node_groups_wait_for_the_node_addons_so_teardown_keeps_the_cni_until_nodes_are_gone(stack):
    result, _ = stack
    addons = {a.inputs["addonName"]: a for a in result.of_type("aws:eks/addon:Addon")}
    for ng in result.of_type(NODE_GROUP):
        for name in eks_cluster.NODE_ADDONS:
            assert addons[name].urn in ng.dependencies, (ng.name, name)
    system = result.one(NODE_GROUP, "nodes-system")
    for name in eks_cluster.WORKLOAD_ADDONS:
        assert system.urn in addons[name].dependencies
    k8s_provider = result.one("pulumi:providers:kubernetes")
    for r in result.resources:
        if r.type.startswith("kubernetes:"):
            assert system.urn in r.dependencies, r.name
    assert k8s_provider is not None


# -- cluster --------------------------------------------------------------------------------------


def test_cluster_api_auth_kms_secrets_logging_endpoint_and_pinned_addons(stack):
    result, cfg = stack
    eks = result.one("aws:eks/cluster:Cluster")
    assert eks.inputs["accessConfig"]["authenticationMode"] == "API"
    (enc,) = eks.inputs["encryptionConfig"] if isinstance(eks.inputs["encryptionConfig"], list) \
        else [eks.inputs["encryptionConfig"]]
    assert enc["resources"] == ["secrets"]
    assert enc["provider"]["keyArn"] == result.exports["kmsKeyArn"]
    assert sorted(eks.inputs["enabledClusterLogTypes"]) == sorted(eks_cluster.CONTROL_PLANE_LOG_TYPES)
    vpc = eks.inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is bool(cfg.cluster.public_access_cidrs)
    assert vpc.get("publicAccessCidrs") == (cfg.cluster.public_access_cidrs or None)
    assert vpc["subnetIds"] == result.exports["privateSubnetIds"]
    assert eks.inputs["version"] == cfg.cluster.kubernetes_version
    pinned = eks_cluster.ADDON_VERSIONS[cfg.cluster.kubernetes_version]
    addons = {a.inputs["addonName"]: a.inputs.get("addonVersion")
              for a in result.of_type("aws:eks/addon:Addon")}
    # Unpinned ones are resolved with getAddonVersion at `up` (the harness answers with a marker).
    assert addons == {name: version or f"v0.0.0-offline-default-{name}-{cfg.cluster.kubernetes_version}"
                      for name, version in pinned.items()}
    assert result.exports["clusterName"] == eks.inputs["name"]
    assert "kubeconfig" in result.secret_exports
    kubeconfig = json.loads(result.exports["kubeconfig"])
    assert kubeconfig["clusters"][0]["cluster"]["server"].startswith("https://")
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name",
                                                                  eks.inputs["name"]]


def test_addon_table_covers_every_supported_kubernetes_version():
    from infra.config import SUPPORTED_KUBERNETES

    assert set(eks_cluster.ADDON_VERSIONS) == set(SUPPORTED_KUBERNETES)
    for version, versions in eks_cluster.ADDON_VERSIONS.items():
        assert set(versions) == set(eks_cluster.NODE_ADDONS) | set(eks_cluster.WORKLOAD_ADDONS)
        # A pin, or None: resolved at `up` with getAddonVersion and printed (infra/cluster.py).
        assert all(v is None or (v.startswith("v") and "eksbuild" in v) for v in versions.values())
        # The Kubernetes-coupled add-ons are always pinned, to the cluster's minor version for kube-proxy.
        assert versions["kube-proxy"].startswith(f"v{version}.") and versions["coredns"]


# -- IAM --------------------------------------------------------------------------------------------


def test_training_role_grants_exactly_the_bucket_actions_and_lints_clean(stack):
    result, _ = stack
    policy = result.one("aws:iam/rolePolicy:RolePolicy", "platform-training-policy")
    doc = json.loads(policy.inputs["policy"])
    datasets = f"arn:aws:s3:::{result.exports['datasetsBucket']}"
    checkpoints = f"arn:aws:s3:::{result.exports['checkpointsBucket']}"
    granted: dict[str, set[str]] = {}
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        for res in st["Resource"]:
            granted.setdefault(res, set()).update(st["Action"])
    assert granted == {
        datasets: {"s3:ListBucket"},
        f"{datasets}/*": {"s3:GetObject"},
        checkpoints: {"s3:ListBucket"},
        f"{checkpoints}/*": {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"},
        result.exports["kmsKeyArn"]: {"kms:Decrypt", "kms:GenerateDataKey"},
    }
    assert findings(doc) == []
    role = result.one("aws:iam/role:Role", "platform-training-role")
    assert policy.inputs["role"] == role.id
    assert not role.inputs.get("managedPolicyArns")
    attached = [a for a in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == role.inputs.get("name", role.id)]
    assert attached == []
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (st,) = trust["Statement"]
    assert st["Principal"] == {"Service": iam.POD_IDENTITY_PRINCIPAL}
    tags = st["Condition"]["StringEquals"]
    assert tags["aws:RequestTag/kubernetes-namespace"] == platform.TRAINING_NAMESPACE
    assert tags["aws:RequestTag/kubernetes-service-account"] == platform.TRAINING_SERVICE_ACCOUNT
    assert tags["aws:RequestTag/eks-cluster-arn"] == result.one("aws:eks/cluster:Cluster").outputs["arn"]
    assoc = result.one("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert (assoc.inputs["namespace"], assoc.inputs["serviceAccount"]) == (
        result.exports["trainingNamespace"], result.exports["trainingServiceAccount"])
    assert assoc.inputs["roleArn"] == result.exports["trainingRoleArn"]


def test_every_inline_identity_policy_of_the_compute_layer_lints_clean(stack):
    result, _ = stack
    policies = result.of_type("aws:iam/rolePolicy:RolePolicy")
    assert len(policies) >= 3  # training, cluster secrets encryption, scale-to-zero
    for pol in policies:
        assert findings(json.loads(pol.inputs["policy"])) == [], pol.name
    for role in result.of_type("aws:iam/role:Role"):
        trust = json.loads(role.inputs["assumeRolePolicy"])
        for st in trust["Statement"]:
            # Trust policies have no Resource (parliament lints identity policies): checked by shape.
            assert st["Effect"] == "Allow" and "Service" in st["Principal"], role.name
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            assert set(actions) <= {"sts:AssumeRole", "sts:TagSession"}, role.name


# -- Kubernetes platform ------------------------------------------------------------------------------


def test_every_kubernetes_resource_uses_the_one_explicit_provider(stack):
    result, _ = stack
    (provider,) = result.of_type("pulumi:providers:kubernetes")
    ref = f"{provider.urn}::{provider.id}"
    kubeconfig = provider.inputs["kubeconfig"]
    if isinstance(kubeconfig, dict):  # a secret input reaches the mock as {<secret sig>: ..., "value": ...}
        kubeconfig = kubeconfig["value"]
    assert kubeconfig == result.exports["kubeconfig"]
    k8s = [r for r in result.resources if r.type.startswith("kubernetes:")]
    assert {r.type for r in k8s} >= {"kubernetes:core/v1:Namespace", "kubernetes:core/v1:ServiceAccount",
                                     "kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile"}
    for r in k8s:
        assert r.provider == ref, r.name
        if not r.custom:  # a component passes the provider on to what it creates
            assert r.providers.get("kubernetes") == ref, r.name


def test_charts_and_manifests_are_pinned_and_the_efa_plugin_only_targets_efa_nodes(stack):
    result, cfg = stack
    releases = {r.inputs["chart"]: r for r in result.of_type("kubernetes:helm.sh/v3:Release")}
    for chart in (platform.NVIDIA_DEVICE_PLUGIN, platform.EFA_DEVICE_PLUGIN):
        rel = releases[chart.chart]
        assert rel.inputs["version"] == chart.version and chart.version[0] in "v0123456789"
        assert rel.inputs["repositoryOpts"]["repo"] == chart.repo
        assert rel.inputs["values"]["tolerations"] == [platform.GPU_TOLERATION]
    efa_values = releases[platform.EFA_DEVICE_PLUGIN.chart].inputs["values"]
    assert efa_values["nodeSelector"] == {EFA_PRESENT_LABEL: "true"}
    labelled = {ng.inputs["labels"][NODE_POOL_LABEL] for ng in result.of_type(NODE_GROUP)
                if ng.inputs["labels"].get(EFA_PRESENT_LABEL) == "true"}
    assert labelled == {g.name for g in cfg.node_groups if g.efa}
    (mpi,) = result.of_type("kubernetes:yaml/v2:ConfigFile")
    assert mpi.inputs["file"] == platform.MPI_OPERATOR_MANIFEST
    assert Path(mpi.inputs["file"]).is_file() and f"-{platform.MPI_OPERATOR_VERSION}." in mpi.inputs["file"]


def test_the_operator_installed_is_the_one_whose_crd_validates_the_jobs():
    """Issue 26 defect 2: the manifest installed, the CRD the renderer is validated against and the controller
    the local executor reproduces are one release, v0.8.2; the controller image is that release's own tag."""
    import yaml

    from cluster.mpi_operator import OPERATOR_VERSION
    from cluster.schemas import CRD_PATH

    assert platform.MPI_OPERATOR_VERSION == OPERATOR_VERSION == "v0.8.2"
    docs = [d for d in yaml.load_all(Path(platform.MPI_OPERATOR_MANIFEST).read_text(),
                                     Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    (crd,) = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    validated = yaml.load(CRD_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    # The same CRD (the deploy manifest's kustomize build only adds labels).
    assert crd["spec"] == validated["spec"] and crd["metadata"]["name"] == validated["metadata"]["name"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert images == [platform.MPI_OPERATOR_IMAGE] == ["mpioperator/mpi-operator:0.8.2"]


# -- cost guard -----------------------------------------------------------------------------------------


def test_cost_guard_watches_every_gpu_group(stack):
    result, cfg = stack
    fn = result.one("aws:lambda/function:Function")
    env = fn.inputs["environment"]["variables"]
    cluster = eks_cluster.cluster_name(result.stack)
    assert json.loads(env["NODE_GROUPS"]) == [node_group_name(cluster, g.name) for g in cfg.node_groups]
    assert env["CLUSTER_NAME"] == cluster
    assert int(env["IDLE_MINUTES"]) == cfg.cost_guard.idle_minutes
    assert float(env["IDLE_GPU_PERCENT"]) == cfg.cost_guard.idle_gpu_utilization_percent
    assert fn.inputs["handler"] == LAMBDA_HANDLER
    rule = result.one("aws:cloudwatch/eventRule:EventRule")
    assert rule.inputs["scheduleExpression"] == f"rate({CHECK_EVERY_MINUTES} minutes)"
    target = result.one("aws:cloudwatch/eventTarget:EventTarget")
    assert target.inputs["arn"] == fn.outputs["arn"]
    perm = result.one("aws:lambda/permission:Permission")
    assert perm.inputs["principal"] == "events.amazonaws.com"
    assert perm.inputs["sourceArn"] == rule.outputs["arn"]
    guard_policy = json.loads(
        result.one("aws:iam/rolePolicy:RolePolicy", "costguard-policy").inputs["policy"])
    (scale,) = [s for s in guard_policy["Statement"] if "eks:UpdateNodegroupConfig" in s["Action"]]
    assert len(scale["Resource"]) == len(cfg.node_groups)
    assert all(f":nodegroup/{cluster}/" in arn for arn in scale["Resource"])
    # Nodes without GPU telemetry are notified to the stack's address through the alert topic.
    topic = result.one("aws:sns/topic:Topic")
    assert env["ALERT_TOPIC_ARN"] == topic.outputs["arn"]
    (sub,) = [s for s in result.of_type("aws:sns/topicSubscription:TopicSubscription")
              if s.inputs["topic"] == topic.outputs["arn"]]
    assert sub.inputs["protocol"] == "email" and sub.inputs["endpoint"] == cfg.cost_guard.notification_email
    (publish,) = [s for s in guard_policy["Statement"] if "sns:Publish" in s["Action"]]
    assert publish["Resource"] == [topic.outputs["arn"]]
    (mark,) = [s for s in guard_policy["Statement"] if "ec2:CreateTags" in s["Action"]]
    assert mark["Condition"]["StringEquals"] == {"aws:ResourceTag/eks:cluster-name": cluster}
    assert mark["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": [NOTIFIED_TAG]}
    # GPU series are read by their exact dimensions; ListMetrics (up to 15 min late) is not used.
    assert not any("cloudwatch:ListMetrics" in s["Action"] for s in guard_policy["Statement"])


# -- exports -----------------------------------------------------------------------------------------------


def test_exports_are_what_the_aws_backend_parses(stack):
    result, cfg = stack
    outputs = parse_outputs(result.stack, result.exports)
    assert outputs.cluster_name == result.exports["clusterName"]
    assert outputs.training_role_arn == result.exports["trainingRoleArn"]
    catalog = load_catalog()
    assert {g.name: (g.instance_types, g.capacity_type, g.efa_interfaces) for g in outputs.node_groups} == {
        g.name: (tuple(g.instance_types), g.capacity_type,
                 catalog[g.instance_types[0]].network_cards if g.efa else 0)
        for g in cfg.node_groups}


# -- policy pack (infra/policy) ----------------------------------------------------------------------------


def test_policy_pack_reports_zero_violations_including_the_compute_layer(stack):
    from infra.policy.policies import ALL_POLICIES
    from tests.infra.policy_adapter import run_policies

    result, cfg = stack
    # The pack sees the compute resources it has rules for (templates, cluster, EFA interfaces).
    assert len(result.of_type(LAUNCH_TEMPLATE)) == len(cfg.node_groups) + 1
    assert result.of_type("aws:eks/cluster:Cluster")
    assert run_policies(ALL_POLICIES, result) == []


def test_policy_pack_catches_a_compute_template_without_imdsv2(stack):
    from infra.policy.policies import ALL_POLICIES
    from tests.infra.policy_adapter import run_policies

    result, cfg = stack
    lt = launch_template_of(result, node_group(result, cfg, cfg.node_groups[0].name))
    saved = lt.inputs["metadataOptions"]
    lt.inputs["metadataOptions"] = {**saved, "httpTokens": "optional"}
    try:
        violations = run_policies(ALL_POLICIES, result)
    finally:
        lt.inputs["metadataOptions"] = saved
    assert [(v.policy, v.urn) for v in violations] == [("imdsv2-required", lt.urn)]
