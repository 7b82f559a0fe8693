"""Rules AWS and the providers enforce that Pulumi mocks do not, checked over EVERY resource the program
registers for EVERY committed stack (Pulumi.<stack>.yaml).

Mocks accept any input; the real `pulumi up` does not. Each test below states one rule, cites where
AWS or the provider enforces it, and checks it for all resources of the type, so a resource added
later is held to the rule too.
"""

from __future__ import annotations

import json

import pytest

from tests.infra.harness import COMMITTED_STACKS, CapturedResource, ProgramResult

SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
K8S_PROVIDER = "pulumi:providers:kubernetes"

# pulumi-aws autonaming: a resource without `name` / `namePrefix` gets `<logical name>-<7 hex chars>`
# (pulumi/pulumi-aws provider resources.go, tfbridge.AutoName); with `namePrefix` AWS-side code
# appends a unique id (terraform-provider-aws internal/create/naming.go: 26 characters).
AUTONAME_SUFFIX = "-1a2b3c4"
PREFIX_SUFFIX = "20261206045500000000000001"


def physical_name(res: CapturedResource, name_key: str = "name", prefix_key: str = "namePrefix") -> str:
    """The name AWS will see for `res`: its fixed name, its prefix plus a unique id, or the autoname."""
    if res.inputs.get(name_key):
        return res.inputs[name_key]
    if res.inputs.get(prefix_key):
        return res.inputs[prefix_key] + PREFIX_SUFFIX
    return res.name + AUTONAME_SUFFIX


def _secret_value(value):
    # A secret input reaches the mock monitor as {<secret signature>: ..., "value": ...}.
    return value["value"] if isinstance(value, dict) and "value" in value else value


@pytest.fixture(params=COMMITTED_STACKS)
def stack(request, committed) -> ProgramResult:
    return committed(request.param)


def test_physical_name_model():
    res = CapturedResource(type=SECURITY_GROUP, name="sg-efa", urn="u", inputs={}, outputs={}, id=None,
                           parent="", provider="", custom=True, protect=None, retain_on_delete=None)
    assert physical_name(res) == "sg-efa-1a2b3c4"
    res.inputs["namePrefix"] = "ringtrain-dev-efa-"
    assert physical_name(res).startswith("ringtrain-dev-efa-")
    res.inputs["name"] = "fixed"
    assert physical_name(res) == "fixed"


# -- EC2 -------------------------------------------------------------------------------------------


def test_no_security_group_name_starts_with_sg_dash(stack):
    """EC2 CreateSecurityGroup, GroupName: "Can't start with sg-" (names are case-insensitive);
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html."""
    groups = stack.of_type(SECURITY_GROUP)
    assert groups, "every stack declares security groups (even with compute off)"
    bad = [(g.name, physical_name(g)) for g in groups if physical_name(g).lower().startswith("sg-")]
    assert bad == []
    for g in groups:
        name = physical_name(g)
        assert len(name) <= 255, g.name


# -- Kubernetes provider ---------------------------------------------------------------------------


def test_no_stack_uses_kubernetes_strict_mode_with_a_kubeconfig_unknown_at_preview(stack):
    """pulumi-kubernetes CheckConfig under strict mode: `if v := news["kubeconfig"]; !v.HasValue() ||
    v.StringValue() == ""` (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go). HasValue() is
    `!v.IsNull() && !v.IsOutput()` (pulumi/pulumi sdk/go/common/resource/properties.go), true for a
    Computed value, and StringValue() is `v.V.(string)`, which panics on one (both read 2026-12-06).
    A kubeconfig built from a resource of the same stack is Computed at its first preview."""
    strict = str(stack.config.get("kubernetes:strictMode", "false")).lower() == "true"
    for provider in stack.of_type(K8S_PROVIDER):
        unknown_at_first_preview = bool(provider.dependencies)  # its inputs come from the stack's resources
        assert not (strict and unknown_at_first_preview), provider.name
    # ... and default providers stay off, so no Kubernetes resource can fall back to ~/.kube/config.
    assert "kubernetes" in stack.config.get("pulumi:disable-default-providers", [])


def test_every_kubernetes_provider_names_a_context_of_its_kubeconfig_under_strict_mode(stack):
    """pulumi-kubernetes CheckConfig: with `kubernetes:strictMode` true, every provider, explicit
    ones too, needs `kubeconfig` AND `context` (pulumi/pulumi-kubernetes provider/pkg/provider/
    provider.go, PR #2425; its test tests/sdk/nodejs/strict-mode/step2 expects a provider with a
    kubeconfig but no context to fail). The context must be one the kubeconfig defines."""
    providers = stack.of_type(K8S_PROVIDER)
    assert providers, "committed stacks run compute and declare a Kubernetes provider"
    strict = str(stack.config.get("kubernetes:strictMode", "false")).lower() == "true"
    for provider in providers:
        kubeconfig = _secret_value(provider.inputs.get("kubeconfig"))
        context = _secret_value(provider.inputs.get("context"))
        if strict:
            assert kubeconfig and context, f"{provider.name}: strict mode needs kubeconfig and context"
        if context:
            defined = [c["name"] for c in json.loads(kubeconfig)["contexts"]]
            assert context in defined, (provider.name, context, defined)


# -- Replacement of resources with fixed names -----------------------------------------------------

# Inputs that fix a resource's identity in AWS (unique per account/region, or per cluster). With them
# set, Pulumi's default create-before-delete replacement asks AWS for a second resource of the same
# name and fails ("already exists" / ResourceInUseException) unless the old one goes first.
FIXED_IDENTITY = {
    "aws:eks/cluster:Cluster": ("name",),
    "aws:eks/nodeGroup:NodeGroup": ("clusterName", "nodeGroupName"),
    "aws:cloudwatch/logGroup:LogGroup": ("name",),
    "aws:lambda/function:Function": ("name",),
    "aws:budgets/budget:Budget": ("name",),
    "aws:ec2/placementGroup:PlacementGroup": ("name",),
    "aws:ec2/securityGroup:SecurityGroup": ("name",),
    "aws:ec2/launchTemplate:LaunchTemplate": ("name",),
    "aws:iam/role:Role": ("name",),
    "aws:cloudwatch/eventRule:EventRule": ("name",),
    "aws:sns/topic:Topic": ("name",),
    "aws:s3/bucket:Bucket": ("bucket",),
    "aws:ecr/repository:Repository": ("name",),
    "aws:kms/alias:Alias": ("name",),
}


def test_every_fixed_name_is_replaced_delete_first_or_protected(stack):
    checked = 0
    for res in stack.resources:
        keys = FIXED_IDENTITY.get(res.type)
        if not keys or not all(res.inputs.get(k) for k in keys):
            continue  # autonamed or name_prefix: a replacement gets a fresh name
        checked += 1
        assert res.delete_before_replace or res.protect, (
            f"{res.type} {res.name} has the fixed name {[res.inputs[k] for k in keys]}: give it "
            "delete_before_replace=True, or a name_prefix")
    assert checked, "the stacks declare fixed-name resources (cluster, node groups, buckets)"


# -- CloudWatch Logs -------------------------------------------------------------------------------


def test_every_log_group_expires_with_a_retention_cloudwatch_accepts(stack):
    """PutRetentionPolicy accepts only the listed day counts (CloudWatch Logs API reference); a group
    without retention keeps its events forever."""
    from infra.config import LOG_RETENTION_DAYS

    groups = stack.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert groups
    for group in groups:
        days = group.inputs.get("retentionInDays")
        assert days is not None and int(days) in LOG_RETENTION_DAYS, (group.name, days)


def test_every_log_group_the_telemetry_addon_writes_is_declared_first(stack):
    """Fluent Bit and the CloudWatch agent of amazon-cloudwatch-observability create
    /aws/containerinsights/<cluster>/{application,dataplane,host,performance} themselves, without
    retention and outside the stack, unless the groups exist before the add-on starts."""
    from infra.cluster import CONTAINER_INSIGHTS_LOG_GROUPS, container_insights_log_group

    groups = {g.inputs.get("name"): g for g in stack.of_type("aws:cloudwatch/logGroup:LogGroup")}
    telemetry = [a for a in stack.of_type("aws:eks/addon:Addon")
                 if a.inputs["addonName"] == "amazon-cloudwatch-observability"]
    assert telemetry
    for addon in telemetry:
        for kind in CONTAINER_INSIGHTS_LOG_GROUPS:
            name = container_insights_log_group(addon.inputs["clusterName"], kind)
            assert name in groups, name
            assert groups[name].urn in addon.dependencies, name


# -- EKS -------------------------------------------------------------------------------------------


def test_every_cluster_runs_a_standard_support_version_with_standard_upgrade_policy(stack):
    """UpgradePolicyRequest.supportType: "The default value is EXTENDED" (EKS API reference); a version
    past its 14 months of standard support then bills $0.60/h instead of $0.10/h."""
    from infra.cluster import ADDON_VERSIONS
    from infra.config import SUPPORTED_KUBERNETES

    clusters = stack.of_type("aws:eks/cluster:Cluster")
    assert clusters
    for eks in clusters:
        assert (eks.inputs.get("upgradePolicy") or {}).get("supportType") == "STANDARD", eks.name
        version = eks.inputs["version"]
        assert version in SUPPORTED_KUBERNETES
        addons = {a.inputs["addonName"]: a.inputs.get("addonVersion")
                  for a in stack.of_type("aws:eks/addon:Addon")
                  if a.inputs["clusterName"] == eks.inputs["name"]}
        # Pinned, or resolved at `up` (the harness answers getAddonVersion with a marker).
        assert addons == {name: pinned or f"v0.0.0-offline-default-{name}-{version}"
                          for name, pinned in ADDON_VERSIONS[version].items()}
        # Node groups follow the control plane (kubelet may not be newer than the API server).
        groups = [g for g in stack.of_type("aws:eks/nodeGroup:NodeGroup")
                  if g.inputs["clusterName"] == eks.inputs["name"]]
        assert groups and all(g.inputs.get("version") == version for g in groups)


# -- Node credentials ------------------------------------------------------------------------------


def test_no_pod_can_reach_the_node_role_through_imds(stack):
    """Every launch template: IMDSv2 and hop limit 1 (a pod's network namespace is the second hop)."""
    templates = stack.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert templates
    for lt in templates:
        meta = lt.inputs.get("metadataOptions") or {}
        assert meta.get("httpTokens") == "required", lt.name
        assert meta.get("httpPutResponseHopLimit") == 1.0, lt.name


def _attached(stack, role) -> set[str]:
    name = role.inputs.get("name") or role.outputs.get("name")
    return {a.inputs["policyArn"] for a in stack.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
            if a.inputs["role"] in (name, role.id)}


def test_node_roles_pull_images_only_and_the_cni_has_its_own_pod_identity_role(stack):
    from infra import iam

    node_roles = [r for r in stack.of_type("aws:iam/role:Role")
                  if json.loads(r.inputs["assumeRolePolicy"])["Statement"][0]["Principal"]
                  == {"Service": "ec2.amazonaws.com"}]
    assert node_roles
    for role in node_roles:
        assert _attached(stack, role) == set(iam.NODE_ROLE_POLICIES), role.name
    assert "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly" in iam.NODE_ROLE_POLICIES
    (cni,) = [a for a in stack.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "vpc-cni"]
    (assoc,) = cni.inputs["podIdentityAssociations"]
    assert assoc["serviceAccount"] == "aws-node"
    (cni_role,) = [r for r in stack.of_type("aws:iam/role:Role") if r.outputs.get("arn") == assoc["roleArn"]]
    assert _attached(stack, cni_role) == {"arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"}
    trust = json.loads(cni_role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert trust["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-service-account"] == "aws-node"
    assert trust["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-namespace"] == "kube-system"


# -- Budget ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("compute", [True, False])
def test_the_stack_budget_stays_with_compute_off_and_counts_only_this_projects_stack(committed, compute):
    """The data layer bills with compute off, so the budget must not go with the compute layer; and a
    filter on `stack=<stack>` alone would count another project's `stack=prod` (AWS Budgets
    FilterExpression `And` of Tags; a CostFilters TagKeyValue list ORs its values)."""
    from tests.infra.harness import run_program

    base = committed("prod")
    result = base if compute else run_program("prod", overrides={"ringtrain:compute": False})
    (budget,) = result.of_type("aws:budgets/budget:Budget")
    assert not budget.inputs.get("costFilters"), "CostFilters cannot AND two tags"
    expr = budget.inputs["filterExpression"]
    tags = {a["tags"]["key"]: a["tags"]["values"] for a in expr["ands"]}
    assert tags == {"project": ["ringtrain"], "stack": ["prod"]}
    assert budget.inputs["metrics"] == "UnblendedCost"  # required with a FilterExpression
    cost_guard = base.config["ringtrain:costGuard"]
    assert float(budget.inputs["limitAmount"]) == cost_guard["monthlyBudgetUsd"]
    assert budget.inputs["budgetType"] == "COST" and budget.inputs["timeUnit"] == "MONTHLY"
    assert {(n["notificationType"], n["threshold"]) for n in budget.inputs["notifications"]} == {
        ("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0)}
    for note in budget.inputs["notifications"]:
        assert note["subscriberEmailAddresses"] == [cost_guard["notificationEmail"]]


# -- S3 ---------------------------------------------------------------------------------------------


def test_every_versioned_bucket_expires_its_noncurrent_versions(stack):
    """A versioned bucket keeps every overwritten or deleted object as a noncurrent version, billed
    like a current one, until a lifecycle rule with NoncurrentVersionExpiration removes it."""
    versioned = {v.inputs["bucket"] for v in stack.of_type("aws:s3/bucketVersioning:BucketVersioning")
                 if v.inputs["versioningConfiguration"]["status"] == "Enabled"}
    assert versioned
    lifecycles = {lc.inputs["bucket"]: lc
                  for lc in stack.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")}
    for bucket in versioned:
        rules = lifecycles[bucket].inputs["rules"]
        assert any(r["status"] == "Enabled" and r.get("noncurrentVersionExpiration", {}).get("noncurrentDays")
                   for r in rules), bucket


def test_no_kubernetes_provider_drops_resources_of_an_unreachable_cluster(stack):
    """deleteUnreachable removes every Kubernetes resource from the state when the cluster does not
    answer, also when it is only unreachable (pulumi-kubernetes #1485, #2489): never set it."""
    providers = stack.of_type(K8S_PROVIDER)
    assert providers
    for provider in providers:
        assert str(provider.inputs.get("deleteUnreachable", "false")).lower() != "true", provider.name


# aws/eks-charts stable/aws-efa-k8s-device-plugin: chart version -> the plugin it runs (Chart.yaml
# appVersion = values image.tag), read from the repository history (snapshot 2026-08-03).
EKS_CHARTS_EFA_PLUGIN = {
    "v0.5.7": "v0.5.4", "v0.5.12": "v0.5.7", "v0.5.18": "v0.5.10", "v0.5.20": "v0.5.13",
    "v0.5.25": "v0.5.17", "v0.5.28": "v0.5.19", "v0.5.29": "v0.5.20", "v0.5.30": "v0.5.20",
}


def test_efa_device_plugin_chart_runs_the_plugin_version_the_pin_names(stack):
    from infra.platform import EFA_DEVICE_PLUGIN

    (release,) = [r for r in stack.of_type("kubernetes:helm.sh/v3:Release")
                  if r.inputs["chart"] == EFA_DEVICE_PLUGIN.chart]
    chart = release.inputs["version"]
    assert EKS_CHARTS_EFA_PLUGIN[chart] == EFA_DEVICE_PLUGIN.app_version
    assert release.inputs["values"]["image"]["tag"] == EFA_DEVICE_PLUGIN.app_version
    newest = max(EKS_CHARTS_EFA_PLUGIN, key=lambda v: tuple(int(x) for x in v[1:].split(".")))
    assert chart == newest, "pin the newest chart of the recorded history"


# -- EKS access entries ------------------------------------------------------------------------------

ADMIN_ROLE = "arn:aws:iam::123456789012:role/ringtrain-admin"  # the committed stacks' admin
OTHER_ADMIN = "arn:aws:iam::123456789012:role/platform-admins"
OUTSIDER = "arn:aws:iam::123456789012:role/intern"


def _caller(arn: str):
    answer = lambda args, region: {"accountId": "123456789012", "arn": arn, "userId": "AIDA",  # noqa: E731
                                   "id": "123456789012"}
    return {"aws:index/getCallerIdentity:getCallerIdentity": answer}


def _session(role_arn: str) -> str:
    return f"arn:aws:sts::123456789012:assumed-role/{role_arn.rsplit('/', 1)[-1]}/someone"


def _entries(result) -> dict[str, list[str]]:
    return {e.inputs["principalArn"]: [e.urn] for e in result.of_type("aws:eks/accessEntry:AccessEntry")}


def test_each_listed_principal_gets_exactly_one_access_entry(stack):
    """EKS keeps one access entry per principal and cluster: CreateAccessEntry for a principal that has
    one (e.g. the creator's bootstrap entry, made when accessConfig.bootstrapClusterCreatorAdmin-
    Permissions is true, EKS's default) fails with ResourceInUseException."""
    (eks,) = stack.of_type("aws:eks/cluster:Cluster")
    assert (eks.inputs.get("accessConfig") or {}).get("bootstrapClusterCreatorAdminPermissions") is False
    admins = stack.config["ringtrain:cluster"]["adminPrincipalArns"]
    entries = [e.inputs["principalArn"] for e in stack.of_type("aws:eks/accessEntry:AccessEntry")]
    assert sorted(entries) == sorted(admins)
    policies = [p.inputs["principalArn"] for p in
                stack.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")]
    assert sorted(policies) == sorted(admins)


def test_a_second_operator_gets_the_same_access_entries(committed):
    """Before, the caller got an entry of its own: the next operator's `up` deleted the first one's
    entry (and with it their access), and each `up` by someone else changed the state."""
    from tests.infra.harness import run_program

    cluster_cfg = {**committed("prod").config["ringtrain:cluster"],
                   "adminPrincipalArns": [ADMIN_ROLE, OTHER_ADMIN]}
    runs = [run_program("prod", overrides={"ringtrain:cluster": cluster_cfg}, invokes=_caller(caller))
            for caller in (_session(ADMIN_ROLE), _session(OTHER_ADMIN))]
    assert _entries(runs[0]) == _entries(runs[1])
    assert set(_entries(runs[0])) == {ADMIN_ROLE, OTHER_ADMIN}


def test_an_up_by_a_principal_not_listed_stops_before_declaring_anything():
    """The Kubernetes provider authenticates as the caller: without an entry the platform fails ~20
    minutes in, after the cluster exists. The message names the principal and the key."""
    import pulumi

    from tests.infra.harness import run_program

    with pytest.raises(pulumi.RunError) as info:
        run_program("prod", invokes=_caller(_session(OUTSIDER)))
    message = str(info.value)
    assert message.startswith(f'ringtrain:cluster.adminPrincipalArns: ["{ADMIN_ROLE}"] is invalid: a list '
                              f"that includes {OUTSIDER}, the principal running this `up`")
    assert [r.type for r in info.value.harness_resources if not r.type.startswith("pulumi:providers:")] == []


def test_down_needs_no_listed_caller():
    """With compute off the program declares no access entries and asks nothing of the caller."""
    from tests.infra.harness import run_program

    result = run_program("prod", overrides={"ringtrain:compute": False},
                         invokes=_caller(_session(OUTSIDER)))
    assert result.of_type("aws:eks/accessEntry:AccessEntry") == []


# -- Private API endpoint ------------------------------------------------------------------------------

@pytest.mark.parametrize(("situation", "kwargs", "says"), [
    ("first up", {"invokes": {"aws:eks/getClusters:getClusters": lambda a, r: {"names": [], "id": r}}},
     "for the first `up`"),
    ("endpoint does not answer here", {"endpoint_reachable": False}, "does not answer from here"),
])
def test_a_private_endpoint_this_run_cannot_reach_stops_it_before_declaring_anything(situation, kwargs, says):
    """With publicAccessCidrs [] (dev) the Kubernetes platform needs the private endpoint; from outside
    the VPC every Kubernetes resource fails ~20 minutes in, after the cluster exists."""
    import pulumi

    from tests.infra.harness import run_program

    with pytest.raises(pulumi.RunError) as info:
        run_program("dev", **kwargs)
    message = str(info.value)
    assert message.startswith("ringtrain:cluster.publicAccessCidrs: [] is invalid: ") and says in message
    assert "\n" not in message
    # Nothing half-created (the AWS provider object creates nothing in AWS).
    assert [r.type for r in info.value.harness_resources if not r.type.startswith("pulumi:providers:")] == []


def test_a_reachable_private_endpoint_and_a_public_one_pass():
    from tests.infra.harness import run_program, stack_config

    assert run_program("dev").of_type("aws:eks/cluster:Cluster")  # private, answers (offline default)
    public = {**stack_config("prod")["ringtrain:cluster"], "publicAccessCidrs": ["52.94.0.0/22"]}
    prod = run_program("prod", endpoint_reachable=False,  # public from its CIDRs: no probe needed
                       overrides={"ringtrain:cluster": public})
    assert prod.of_type("aws:eks/cluster:Cluster")


# -- Log groups AWS services write to under fixed names ----------------------------------------------

SERVICE_LOG_PREFIXES = ("/aws/eks/", "/aws/containerinsights/", "/aws/lambda/")
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def _service_log_groups(result: ProgramResult) -> dict[str, CapturedResource]:
    return {g.inputs["name"]: g for g in result.of_type(LOG_GROUP)
            if str(g.inputs.get("name", "")).startswith(SERVICE_LOG_PREFIXES)}


@pytest.mark.parametrize("stack_name", COMMITTED_STACKS)
def test_log_groups_aws_services_write_to_outlive_down(stack_name, committed):
    """EKS keeps delivering control-plane logs after the cluster is deleted and re-creates
    /aws/eks/<cluster>/cluster; the next `up` then fails with ResourceAlreadyExistsException
    (terraform-aws-modules/terraform-aws-eks #920, #2486; CloudTrail in #2763 shows the EKS
    service-linked role creating it; read 2026-12-06). Fluent Bit, the CloudWatch agent and Lambda
    create their groups the same way. So each such group is declared with compute off too, under the
    same URN, and is never deleted by `down`."""
    from tests.infra.harness import run_program

    up = _service_log_groups(committed(stack_name))
    down = _service_log_groups(run_program(stack_name, overrides={"ringtrain:compute": False}))
    cluster = f"ringtrain-{stack_name}"
    assert set(up) == {f"/aws/eks/{cluster}/cluster", f"/aws/lambda/{cluster}-scale-to-zero",
                       *(f"/aws/containerinsights/{cluster}/{k}"
                         for k in ("application", "dataplane", "host", "performance"))}
    assert {n: g.urn for n, g in down.items()} == {n: g.urn for n, g in up.items()}
    for group in up.values():
        assert group.delete_before_replace and int(group.inputs["retentionInDays"]) > 0


def test_moved_log_groups_keep_the_urns_they_had_under_the_compute_components(committed):
    """Pulumi matches a moved resource through its alias; without one, the move is a create of the new
    URN (refused: the name exists) and a delete of the old. URNs as the program at 3777f44 declared
    them (recorded from tests/infra/harness.py)."""
    before = {
        "/aws/eks/ringtrain-prod/cluster":
            "urn:pulumi:prod::ringtrain::ringtrain:compute:EksCluster$aws:cloudwatch/logGroup:LogGroup::eks-logs",
        "/aws/lambda/ringtrain-prod-scale-to-zero":
            "urn:pulumi:prod::ringtrain::ringtrain:compute:CostGuard$aws:cloudwatch/logGroup:LogGroup::"
            "costguard-logs",
        **{f"/aws/containerinsights/ringtrain-prod/{k}":
           "urn:pulumi:prod::ringtrain::ringtrain:compute:EksCluster$aws:cloudwatch/logGroup:LogGroup::"
           f"eks-containerinsights-{k}" for k in ("application", "dataplane", "host", "performance")},
    }
    groups = _service_log_groups(committed("prod"))
    assert {n: g.aliases for n, g in groups.items()} == {n: [urn] for n, urn in before.items()}


# -- Alerts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack_name", COMMITTED_STACKS)
def test_the_alert_topic_and_its_email_subscription_outlive_down(stack_name, committed):
    """An e-mail subscription delivers nothing until its owner confirms it (SNS Subscribe API
    reference: "If the endpoint type is HTTP/S or email ... the endpoint owner must run the
    ConfirmSubscription action"; read 2026-12-06). Declared with compute, every `up` after a `down`
    made a new, unconfirmed subscription. The topic and subscription keep one URN with compute on and
    off, and keep the URNs the program at 3777f44 gave them (aliases)."""
    from tests.infra.harness import run_program

    def alerts(result: ProgramResult) -> dict[str, CapturedResource]:
        return {r.type: r for r in result.resources
                if r.type in ("aws:sns/topic:Topic", "aws:sns/topicSubscription:TopicSubscription")}

    up = alerts(committed(stack_name))
    down = alerts(run_program(stack_name, overrides={"ringtrain:compute": False}))
    assert set(up) == {"aws:sns/topic:Topic", "aws:sns/topicSubscription:TopicSubscription"}
    assert {t: r.urn for t, r in down.items()} == {t: r.urn for t, r in up.items()}
    sub = up["aws:sns/topicSubscription:TopicSubscription"]
    assert sub.inputs["protocol"] == "email"
    assert sub.inputs["endpoint"] == committed(stack_name).config["ringtrain:costGuard"]["notificationEmail"]
    old = f"urn:pulumi:{stack_name}::ringtrain::ringtrain:compute:CostGuard$"
    assert up["aws:sns/topic:Topic"].aliases == [old + "aws:sns/topic:Topic::costguard-alerts"]
    assert sub.aliases == [old + "aws:sns/topicSubscription:TopicSubscription::costguard-alerts-email"]


# -- The state matches reality ---------------------------------------------------------------------


def test_every_aws_provider_refuses_credentials_of_another_account(stack):
    """pulumi-aws `allowedAccountIds` (terraform-provider-aws refuses at configure: "AWS account ID not
    allowed: <id>"). Refresh configures providers from their inputs in the state, so without it a
    wrong AWS_PROFILE makes `up --refresh` read every resource as deleted and drop it from the state."""
    account = stack.config["ringtrain:accountId"]
    assert isinstance(account, str) and len(account) == 12 and account.isdigit()
    providers = stack.of_type("pulumi:providers:aws")
    assert providers
    for provider in providers:
        assert json.loads(provider.inputs["allowedAccountIds"]) == [account], provider.name


def test_no_committed_stack_file_carries_a_run_time_switch():
    """`ringtrain:compute` is what `up`/`down` set for one run (cluster/aws/stack.py run_config_file);
    a committed value would be rewritten by every `down` and differ between operators' checkouts."""
    from tests.infra.harness import stack_config

    for name in COMMITTED_STACKS:
        assert "ringtrain:compute" not in stack_config(name), name


def test_every_kubernetes_object_goes_with_its_cluster(stack):
    """`down` deletes the cluster; a Delete call per in-cluster object needs the caller to reach and be
    admitted by the API server, so a second operator without an access entry (or outside the VPC of a
    private endpoint) could not `down`. deletedWith skips those calls when the cluster goes in the same
    operation (pulumi/pulumi#11095; inherited by children, #12572; read 2026-12-06)."""
    (eks,) = stack.of_type("aws:eks/cluster:Cluster")
    objects = [r for r in stack.resources if r.type.startswith("kubernetes:")]
    assert objects
    for obj in objects:
        inherited = [a.deleted_with for a in stack.ancestors(obj) if a.deleted_with]
        assert (obj.deleted_with or (inherited and inherited[0])) == eks.urn, obj.name


def test_every_addon_is_pinned_or_resolved_and_declared_with_a_version(stack):
    """Without addonVersion EKS installs its default and later runs keep whatever is there: what runs
    is nowhere in the stack. Each add-on is pinned with a source (infra/cluster.py) or resolved by
    getAddonVersion at `up` and printed."""
    from infra.cluster import ADDON_VERSIONS, RESOLVED_AT_UP, addon_version_source

    addons = stack.of_type("aws:eks/addon:Addon")
    assert addons
    for addon in addons:
        assert addon.inputs.get("addonVersion"), addon.inputs["addonName"]
    for version, pins in ADDON_VERSIONS.items():
        for name in pins:
            source = addon_version_source(version, name)
            assert source.startswith("pinned v") or source == RESOLVED_AT_UP, (version, name)


def test_a_cloudwatch_addon_with_otel_metrics_is_flagged():
    """amazon-cloudwatch-observability v6.0.1-eksbuild.1 and later also enable Container Insights with
    OpenTelemetry metrics (CloudWatch user guide, install-CloudWatch-Observability-EKS-addon, read
    2026-12-06); the cost guard reads node_gpu_utilization."""
    from infra.cluster import addon_version_warning

    warning = addon_version_warning("amazon-cloudwatch-observability", "v6.0.1-eksbuild.1")
    assert "node_gpu_utilization" in warning
    assert addon_version_warning("amazon-cloudwatch-observability", "v4.3.0-eksbuild.1") is None
    assert addon_version_warning("vpc-cni", "v9.0.0-eksbuild.1") is None
