"""The Kubernetes platform on the cluster, through ONE explicit provider built from its kubeconfig.

A Kubernetes resource without an explicit provider silently targets ~/.kube/config (docs/field-notes.md §7):
every resource here is created with `opts.provider=self.provider` (tests check all of them).

- NVIDIA device plugin (Helm, pinned) on GPU nodes, tolerating the GPU taint.
- AWS EFA device plugin (Helm, pinned) on EFA nodes ONLY: it crash-loops elsewhere (docs/field-notes.md §1).
- Kubeflow MPI Operator (release manifest pinned by version URL) for Horovod MPIJobs.
- The training namespace and service account; its IAM role (EKS Pod Identity) may read the datasets
  bucket and read/write the checkpoints bucket and nothing else (infra/iam.py).
GPU telemetry (CloudWatch agent + DCGM exporter) is the amazon-cloudwatch-observability EKS add-on
(infra/cluster.py): GPU utilisation lands in CloudWatch Container Insights, where the cost guard reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import iam
from infra.cluster import EksCluster
from infra.nodegroups import EFA_PRESENT_LABEL, GPU_PRESENT_LABEL, GPU_TAINT_KEY

TRAINING_NAMESPACE = "training"
TRAINING_SERVICE_ACCOUNT = "trainer"

GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class HelmChart:
    release: str
    chart: str
    version: str  # the chart's version (what Helm installs)
    repo: str
    namespace: str
    app_version: str  # the component the chart runs (Chart.yaml appVersion / default image tag)


# Chart versions pinned; bump deliberately, never float. A chart version is not the version of what it
# runs, so each pin records both:
# - NVIDIA k8s-device-plugin: chart and plugin share one version (deployments/helm/
#   nvidia-device-plugin/Chart.yaml: version == appVersion). v0.20.0: tag of 2026-08-19, the newest in
#   NVIDIA/k8s-device-plugin (CHANGELOG.md v0.20.0; read 2026-12-06). The previous pin was 0.17.1.
# - AWS EFA device plugin: aws/eks-charts stable/aws-efa-k8s-device-plugin, chart v0.5.30 (2026-07-21,
#   newest in the eks-charts snapshot of 2026-08-03) runs plugin v0.5.20 (Chart.yaml appVersion,
#   values image.tag). The previous pin, chart v0.5.7, ran plugin v0.5.4 (2024).
NVIDIA_DEVICE_PLUGIN = HelmChart("nvidia-device-plugin", "nvidia-device-plugin", "0.20.0",
                                 "https://nvidia.github.io/k8s-device-plugin", "nvidia-device-plugin",
                                 app_version="0.20.0")
EFA_DEVICE_PLUGIN = HelmChart("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", "v0.5.30",
                              "https://aws.github.io/eks-charts", "kube-system", app_version="v0.5.20")
# Kubeflow MPI Operator, latest release (kubeflow.org/v2beta1 MPIJob, the API cluster/mpijob.py renders):
# the same version as the CRD the renderer is validated against (cluster/schemas/) and the controller
# behaviour the local executor reproduces (cluster/mpi_operator.py OPERATOR_VERSION). Its deploy manifest
# (CRD, namespace, RBAC, controller) is installed from the repository's copy, with the controller image
# pinned to 0.8.2 instead of the release's moving 0.8 tag (header of the file); tests/infra checks that
# its CRD is cluster/schemas' and its image this version.
MPI_OPERATOR_VERSION = "v0.8.2"
# An absolute path: the provider reads it, whatever its working directory.
MPI_OPERATOR_MANIFEST = str(Path(__file__).resolve().parent / "manifests" /
                            f"mpi-operator-{MPI_OPERATOR_VERSION}.yaml")
MPI_OPERATOR_IMAGE = f"mpioperator/mpi-operator:{MPI_OPERATOR_VERSION.removeprefix('v')}"


def nvidia_plugin_values() -> dict:
    return {"nodeSelector": {GPU_PRESENT_LABEL: "true"}, "tolerations": [GPU_TOLERATION]}


def efa_plugin_values() -> dict:
    # image.tag: "Overrides the image tag whose default is the chart appVersion" (chart values.yaml);
    # set to the plugin version the pin intends, so the two cannot drift apart silently.
    return {"nodeSelector": {EFA_PRESENT_LABEL: "true"}, "tolerations": [GPU_TOLERATION],
            "image": {"tag": EFA_DEVICE_PLUGIN.app_version}}


@dataclass
class PlatformInputs:
    cluster: EksCluster
    datasets_bucket_arn: pulumi.Input[str]
    checkpoints_bucket_arn: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    depends_on: Sequence[pulumi.Resource]  # nodes and add-ons the workloads need


class Platform(pulumi.ComponentResource):
    def __init__(self, name: str, args: PlatformInputs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:compute:Platform", name, None, opts)
        cluster = args.cluster
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=cluster.kubeconfig,
            # The stacks disable default providers (`pulumi:disable-default-providers`, pulumi/pulumi
            # #8829) instead of `kubernetes:strictMode`: with strict mode, pulumi-kubernetes' CheckConfig
            # reads `news["kubeconfig"]` with StringValue() after HasValue() (provider/pkg/provider/
            # provider.go), HasValue() is true for a computed value (pulumi sdk/go/common/resource/
            # properties.go: `!v.IsNull() && !v.IsOutput()`) and StringValue() is `v.V.(string)`: this
            # kubeconfig, built from the cluster's outputs, is computed at a new stack's first preview
            # (read 2026-12-06). The context names the one the rendered kubeconfig defines.
            context=cluster.kubeconfig_context,
            enable_server_side_apply=True,
            # No delete_unreachable: with it, a cluster that is only unreachable (private endpoint run
            # from outside, VPN down) silently drops every Kubernetes resource from the state
            # (pulumi-kubernetes #1485, #2489). If the cluster is really gone, destroy once with
            # PULUMI_K8S_DELETE_UNREACHABLE=true, deliberately (docs/ARCHITECTURE.md, "A cluster that
            # is gone").
            opts=pulumi.ResourceOptions(parent=self),
        )
        # deleted_with: these objects live inside the cluster and go with it, so a `down` that deletes
        # the cluster makes no Kubernetes API call for them (pulumi/pulumi#11095: "Avoiding failed
        # deletions when the pulumi user running the plan has access to the container resource but
        # not the contained ones"; children inherit it, pulumi/pulumi#12572; read 2026-12-06). So a
        # second operator without an access entry, or a run outside the VPC of a private endpoint,
        # can still `down`.
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=self.provider,
                                          depends_on=list(args.depends_on), deleted_with=cluster.cluster)

        # -- training identity ------------------------------------------------------------------
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-training-ns", metadata={"name": TRAINING_NAMESPACE}, opts=k8s_opts)
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-trainer-sa",
            metadata={"name": TRAINING_SERVICE_ACCOUNT, "namespace": self.namespace.metadata["name"]},
            opts=k8s_opts)
        self.training_role = aws.iam.Role(
            f"{name}-training-role",
            assume_role_policy=cluster.arn.apply(lambda arn: json.dumps(
                iam.pod_identity_trust_policy(arn, TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT))),
            description=f"Horovod training pods of {cluster.name}: datasets read, checkpoints read/write",
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.training_policy = aws.iam.RolePolicy(
            f"{name}-training-policy",
            role=self.training_role.id,
            policy=pulumi.Output.all(
                args.datasets_bucket_arn, args.checkpoints_bucket_arn, args.kms_key_arn).apply(
                lambda v: json.dumps(iam.training_role_policy(v[0], v[1], v[2], cluster.region))),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.pod_identity = aws.eks.PodIdentityAssociation(
            f"{name}-training-identity",
            cluster_name=cluster.cluster.name,
            namespace=TRAINING_NAMESPACE,
            service_account=TRAINING_SERVICE_ACCOUNT,
            role_arn=self.training_role.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )

        # -- device plugins and the MPI operator ------------------------------------------------
        self.nvidia_plugin = self._release(name, NVIDIA_DEVICE_PLUGIN, nvidia_plugin_values(), k8s_opts)
        self.efa_plugin = self._release(name, EFA_DEVICE_PLUGIN, efa_plugin_values(), k8s_opts)
        self.mpi_operator = k8s.yaml.v2.ConfigFile(
            f"{name}-mpi-operator", file=MPI_OPERATOR_MANIFEST, opts=k8s_opts)

        self.register_outputs({"trainingRoleArn": self.training_role.arn})

    @staticmethod
    def _release(name: str, chart: HelmChart, values: dict,
                 opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
        return k8s.helm.v3.Release(
            f"{name}-{chart.release}",
            name=chart.release,
            chart=chart.chart,
            version=chart.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo),
            namespace=chart.namespace,
            create_namespace=chart.namespace != "kube-system",
            values=values,
            opts=opts,
        )
