"""The EKS control plane: cluster, its IAM role, log group and managed add-ons; the kubeconfig.

- Authentication mode API with access entries (no aws-auth ConfigMap, docs/field-notes.md §7). Every
  principal in `cluster.adminPrincipalArns` gets ONE access entry the stack declares, and only they:
  the identity running `pulumi up` (what the Kubernetes provider in infra/platform.py authenticates as)
  must be listed, so the entries do not depend on who runs `up`. EKS's own bootstrap entry for the
  creator is off, because CreateAccessEntry for a principal that already has one fails
  (ResourceInUseException).
- Secrets envelope-encrypted with the data layer's KMS key; all five control-plane log types on.
- Endpoint private; public only from `cluster.publicAccessCidrs` (empty list: public endpoint off,
  so `pulumi up` must then run from inside the VPC).
- EKS Pod Identity (the eks-pod-identity-agent add-on) instead of an IRSA OIDC provider: no OIDC
  thumbprint to track and the role trust policy can name cluster, namespace and service account.
- Managed add-ons with pinned versions. bootstrapSelfManagedAddons is off: the same three add-ons
  come back as managed ones, with versions we choose and that `pulumi destroy` removes in order.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import pulumi
import pulumi_aws as aws

from infra import iam

# Control-plane log types (EKS API names): all of them, so an incident can be reconstructed.
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
CONTROL_PLANE_LOG_RETENTION_DAYS = 30

# Pinned EKS add-on versions per Kubernetes version. Sources (read 2026-12-06), EKS user guide tables
# "latest version of the Amazon EKS add-on type for each Kubernetes version":
#   kube-proxy: managing-kube-proxy (1.36 v1.36.0-eksbuild.14, 1.35 v1.35.3-eksbuild.13)
#   coredns:    managing-coredns    (1.36 and 1.35 v1.14.3-eksbuild.3)
# None: no source this project could reach (EKS user guide managing-vpc-cni and pod-id-agent pages,
# the CloudWatch add-on's docs and release notes; searched 2026-12-06) lists a version of that add-on
# for that Kubernetes version, so none is guessed. `up` resolves it instead with getAddonVersion (EKS
# DescribeAddonVersions: the default version for the cluster's Kubernetes version), prints it, and
# declares it (resolve_addon_version below); pin it here once a source lists it.
# amazon-cloudwatch-observability: from v6.0.1-eksbuild.1 the add-on also enables Container Insights
# with OpenTelemetry metrics (CloudWatch user guide, install-CloudWatch-Observability-EKS-addon); the
# cost guard reads the classic `node_gpu_utilization` series, so `up` warns when it resolves a
# version from there on (addon_version_warning).
ADDON_VERSIONS: dict[str, dict[str, str | None]] = {
    "1.35": {
        "vpc-cni": None,
        "kube-proxy": "v1.35.3-eksbuild.13",
        "coredns": "v1.14.3-eksbuild.3",
        "eks-pod-identity-agent": None,
        "amazon-cloudwatch-observability": None,
    },
    "1.36": {
        "vpc-cni": None,
        "kube-proxy": "v1.36.0-eksbuild.14",
        "coredns": "v1.14.3-eksbuild.3",
        "eks-pod-identity-agent": None,
        "amazon-cloudwatch-observability": None,
    },
}
RESOLVED_AT_UP = "resolved at `up` with getAddonVersion (EKS default for the Kubernetes version)"
# The CloudWatch add-on version from which OTel Container Insights is on (see above).
CLOUDWATCH_OTEL_FROM = (6, 0, 1)


def addon_version_source(kubernetes_version: str, addon: str) -> str:
    """Where the version of `addon` for `kubernetes_version` comes from: a pin, or resolution at `up`."""
    pinned = addon_versions(kubernetes_version)[addon]
    return f"pinned {pinned}" if pinned else RESOLVED_AT_UP


def addon_version_warning(addon: str, version: str) -> str | None:
    """A warning for a resolved version the stack was not checked against, or None."""
    if addon != "amazon-cloudwatch-observability":
        return None
    numbers = re.match(r"v(\d+)\.(\d+)\.(\d+)", version)
    if numbers and tuple(int(n) for n in numbers.groups()) >= CLOUDWATCH_OTEL_FROM:
        return (f"amazon-cloudwatch-observability {version} also enables Container Insights with "
                "OpenTelemetry metrics (v6.0.1 and later): check that the cost guard still finds "
                "node_gpu_utilization (infra/scale_to_zero.py), and pin the version in infra/cluster.py "
                "ADDON_VERSIONS")
    return None


# Add-ons every node needs before it can become Ready (networking, service routing, pod credentials):
# installed before any node group, removed after every node group.
NODE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
# Add-ons that run as Deployments and need a node to schedule on: installed after the system nodes.
WORKLOAD_ADDONS = ("coredns", "amazon-cloudwatch-observability")
# The CloudWatch agent's service account (set by the add-on); its role comes through Pod Identity.
CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
CLOUDWATCH_SERVICE_ACCOUNT = "cloudwatch-agent"
# Log groups the amazon-cloudwatch-observability add-on writes to: Fluent Bit's application,
# dataplane and host streams (auto_create_group true, no retention: aws-observability/helm-charts
# fluent-bit-configmap.yaml) and the agent's EMF performance events (GPU and node metrics).
CONTAINER_INSIGHTS_LOG_GROUPS = ("application", "dataplane", "host", "performance")
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def container_insights_log_group(cluster: str, kind: str) -> str:
    return f"/aws/containerinsights/{cluster}/{kind}"


@dataclass(frozen=True)
class RunningCluster:
    """What EKS reports for an existing cluster: its API endpoint and Kubernetes version."""

    endpoint: str
    version: str | None


def lookup_cluster(name: str, provider: pulumi.ProviderResource) -> RunningCluster | None:
    """EKS cluster `name` in the provider's region as it runs now, or None if it does not exist (read
    while the program runs, before anything is declared)."""
    invoke = pulumi.InvokeOptions(provider=provider)
    if name not in aws.eks.get_clusters(opts=invoke).names:
        return None
    found = aws.eks.get_cluster(name=name, opts=invoke)
    return RunningCluster(endpoint=found.endpoint, version=found.version or None)


def endpoint_reachable(endpoint: str, timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to the endpoint's HTTPS port opens from this machine within timeout_s."""
    host = urlsplit(endpoint).hostname or endpoint
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def access_entry_key(principal_arn: str) -> str:
    """A stable resource-name fragment of an IAM principal ARN: <account>-<role|user>-<path/name>."""
    _, _, _, _, account, resource = principal_arn.split(":", 5)
    return re.sub(r"[^A-Za-z0-9-]+", "-", f"{account}-{resource}").strip("-")


def cluster_name(stack: str) -> str:
    """EKS cluster name of a stack (1-100 chars, letters, digits, hyphens, starting alphanumeric)."""
    return f"ringtrain-{stack}"[:100]


def addon_versions(kubernetes_version: str) -> dict[str, str | None]:
    try:
        return dict(ADDON_VERSIONS[kubernetes_version])
    except KeyError:
        raise ValueError(
            f"no pinned add-on versions for Kubernetes {kubernetes_version}; "
            f"known: {', '.join(ADDON_VERSIONS)}"
        ) from None


def kubeconfig_context(name: str) -> str:
    """The one context render_kubeconfig defines for cluster `name` (and makes current)."""
    return name


def render_kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """Kubeconfig (JSON, which is YAML) that authenticates with `aws eks get-token` (AWS CLI v2)."""
    user = f"{name}-aws"
    context = kubeconfig_context(name)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": context, "context": {"cluster": name, "user": user}}],
        "current-context": context,
        "users": [{
            "name": user,
            "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "aws",
                "args": ["eks", "get-token", "--cluster-name", name, "--region", region, "--output", "json"],
                "interactiveMode": "Never",
            }},
        }],
    }
    return json.dumps(doc, indent=2)


@dataclass
class ClusterInputs:
    stack: str
    region: str
    kubernetes_version: str
    support_type: str
    public_access_cidrs: Sequence[str]
    service_cidr: str
    subnet_ids: pulumi.Input[Sequence[str]]
    cluster_security_group_id: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    log_group: pulumi.Resource  # /aws/eks/<cluster>/cluster, from infra/logs.py
    admin_principal_arns: Sequence[str] = ()


class EksCluster(pulumi.ComponentResource):
    """Control plane, cluster role, log group, node add-ons (workload add-ons: add_workload_addons)."""

    def __init__(self, name: str, args: ClusterInputs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:compute:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.name = cluster_name(args.stack)
        self.region = args.region
        self.kubernetes_version = args.kubernetes_version
        self.versions = addon_versions(args.kubernetes_version)

        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(iam.service_trust_policy("eks.amazonaws.com")),
            description=f"EKS control plane of {self.name}",
            opts=child,
        )
        attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-role-{arn.rsplit('/', 1)[-1]}", role=self.role.name,
                                         policy_arn=arn, opts=child)
            for arn in iam.CLUSTER_ROLE_POLICIES
        ]
        encryption = aws.iam.RolePolicy(
            f"{name}-role-secrets-encryption",
            role=self.role.id,
            policy=pulumi.Output.from_input(args.kms_key_arn).apply(
                lambda arn: json.dumps(iam.cluster_encryption_policy(arn))),
            opts=child,
        )
        # The control-plane log group is declared with the data layer (infra/logs.py): EKS writes to it
        # after the cluster is gone, so it must outlive `down`. The cluster waits for it.
        self.log_group = args.log_group
        public = list(args.public_access_cidrs)
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=self.name,
            version=args.kubernetes_version,
            # EKS defaults to EXTENDED (UpgradePolicyRequest): see infra/config.py ClusterConfig.
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=args.support_type),
            role_arn=self.role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=args.subnet_ids,
                security_group_ids=[args.cluster_security_group_id],
                endpoint_private_access=True,
                endpoint_public_access=bool(public),
                public_access_cidrs=public or None,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                # The creator's entry is declared below with the other admins (module docstring).
                bootstrap_cluster_creator_admin_permissions=False,
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=args.kms_key_arn),
                resources=["secrets"],
            ),
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(
                service_ipv4_cidr=args.service_cidr,
            ),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            bootstrap_self_managed_addons=False,
            # Fixed name (node groups, the cost guard and the backend address it): a change that forces
            # a new cluster must delete the old one first, or EKS answers ResourceInUseException.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group, encryption, *attachments],
                                        delete_before_replace=True),
        )
        self.arn = self.cluster.arn
        self.endpoint = self.cluster.endpoint
        self.kubeconfig_context = self.cluster.name.apply(kubeconfig_context)
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.cluster.endpoint,
                              self.cluster.certificate_authority.data).apply(
                lambda v: render_kubeconfig(v[0], v[1], v[2], args.region))
        )
        # Administrators: access entries (API authentication mode), one per listed principal; the
        # deployer is one of them (infra/config.py check_deployer_is_admin).
        self.admin_entries: list[aws.eks.AccessEntry] = []
        self.admin_policies: list[aws.eks.AccessPolicyAssociation] = []
        for principal in args.admin_principal_arns:
            key = access_entry_key(principal)
            entry = aws.eks.AccessEntry(
                f"{name}-admin-{key}", cluster_name=self.cluster.name, principal_arn=principal,
                type="STANDARD", opts=child)
            self.admin_policies.append(aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{key}-policy", cluster_name=self.cluster.name,
                principal_arn=entry.principal_arn, policy_arn=CLUSTER_ADMIN_POLICY,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"), opts=child))
            self.admin_entries.append(entry)
        # Add-ons the nodes need to become Ready; node groups depend on these, so on destroy the CNI
        # is still running while nodes drain and release their ENIs (pulumi-eks#1226).
        # The VPC CNI's ENI permissions go to its own role through Pod Identity (infra/iam.py
        # VPC_CNI_POLICIES), not to the node role every pod could otherwise reach.
        cni_role = aws.iam.Role(
            f"{name}-vpc-cni",
            assume_role_policy=self.arn.apply(lambda arn: json.dumps(
                iam.pod_identity_trust_policy(arn, iam.VPC_CNI_NAMESPACE, iam.VPC_CNI_SERVICE_ACCOUNT))),
            description=f"VPC CNI (aws-node) of {self.name}: ENIs and pod IPs",
            opts=child,
        )
        cni_policies = [
            aws.iam.RolePolicyAttachment(f"{name}-vpc-cni-{arn.rsplit('/', 1)[-1]}", role=cni_role.name,
                                         policy_arn=arn, opts=child)
            for arn in iam.VPC_CNI_POLICIES
        ]
        addons = {
            "eks-pod-identity-agent": self._addon(name, "eks-pod-identity-agent"),
            "kube-proxy": self._addon(name, "kube-proxy"),
        }
        addons["vpc-cni"] = self._addon(
            name, "vpc-cni", depends_on=[addons["eks-pod-identity-agent"], *cni_policies],
            pod_identity_associations=[aws.eks.AddonPodIdentityAssociationArgs(
                role_arn=cni_role.arn, service_account=iam.VPC_CNI_SERVICE_ACCOUNT)],
        )
        self.node_addons = [addons[addon] for addon in NODE_ADDONS]

        self.register_outputs({"clusterName": self.cluster.name, "endpoint": self.endpoint})

    def _addon_version(self, addon: str) -> pulumi.Input[str]:
        """The pinned version, or the one `up` resolves and prints (see ADDON_VERSIONS)."""
        pinned = self.versions[addon]
        if pinned:
            return pinned
        resolved = aws.eks.get_addon_version_output(
            addon_name=addon, kubernetes_version=self.kubernetes_version, most_recent=False,
            opts=pulumi.InvokeOutputOptions(parent=self))

        def report(version: str) -> str:
            pulumi.log.info(f"add-on {addon}: {version} ({RESOLVED_AT_UP}; no source pins it)")
            warning = addon_version_warning(addon, version)
            if warning:
                pulumi.log.warn(warning)
            return version
        return resolved.version.apply(report)

    def _addon(self, name: str, addon: str, depends_on: Sequence[pulumi.Resource] = (),
               **extra) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            addon_version=self._addon_version(addon),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)),
            **extra,
        )

    def add_workload_addons(self, name: str, system_nodes: pulumi.Resource,
                            container_log_groups: Sequence[pulumi.Resource]) -> list[aws.eks.Addon]:
        """CoreDNS and GPU/host telemetry (CloudWatch agent + DCGM exporter), once nodes exist."""
        # The groups Fluent Bit and the agent write to exist before the add-on starts (else they would
        # create them without retention); they are declared with the data layer (infra/logs.py).
        self.container_log_groups = list(container_log_groups)
        agent_role = aws.iam.Role(
            f"{name}-cloudwatch-agent",
            assume_role_policy=self.arn.apply(lambda arn: json.dumps(
                iam.pod_identity_trust_policy(arn, CLOUDWATCH_NAMESPACE, CLOUDWATCH_SERVICE_ACCOUNT))),
            description=f"CloudWatch agent of {self.name} (Container Insights, GPU metrics)",
            opts=pulumi.ResourceOptions(parent=self),
        )
        agent_policies = [
            aws.iam.RolePolicyAttachment(f"{name}-cloudwatch-agent-{arn.rsplit('/', 1)[-1]}",
                                         role=agent_role.name, policy_arn=arn,
                                         opts=pulumi.ResourceOptions(parent=self))
            for arn in iam.CLOUDWATCH_AGENT_POLICIES
        ]
        pod_identity_agent = self.node_addons[NODE_ADDONS.index("eks-pod-identity-agent")]
        coredns = self._addon(name, "coredns", depends_on=[system_nodes])
        telemetry = self._addon(
            name, "amazon-cloudwatch-observability",
            depends_on=[system_nodes, pod_identity_agent, *agent_policies, *self.container_log_groups],
            pod_identity_associations=[aws.eks.AddonPodIdentityAssociationArgs(
                role_arn=agent_role.arn, service_account=CLOUDWATCH_SERVICE_ACCOUNT)],
        )
        return [coredns, telemetry]
