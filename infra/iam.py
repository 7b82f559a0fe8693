"""IAM policy documents for the compute layer, as plain functions returning dicts (no Pulumi).

The training role is what Horovod pods run as (through EKS Pod Identity): it may read the datasets
bucket, read and write the checkpoints bucket, and use the data-layer KMS key only through S3 for
those reads and writes. Nothing else: no bucket administration, no other bucket, no direct KMS use.
The documents are linted with parliament in tests/infra/test_compute_iam.py (zero findings).
"""

from __future__ import annotations

from typing import Any

POLICY_VERSION = "2012-10-17"

# Read a dataset: list keys under datasets/<name>/ and fetch them.
DATASET_BUCKET_ACTIONS = ("s3:ListBucket",)
DATASET_OBJECT_ACTIONS = ("s3:GetObject",)
# Checkpoints: list to find the latest, read to resume, write new ones (multipart for large files,
# so aborting an interrupted upload is part of writing), delete old ones beyond the retention count.
CHECKPOINT_BUCKET_ACTIONS = ("s3:ListBucket",)
CHECKPOINT_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
# SSE-KMS objects: GetObject needs Decrypt, PutObject (and multipart parts) need GenerateDataKey.
KMS_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")

# EKS Pod Identity (no OIDC provider to manage): the service principal and the session tags it sets.
POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
POD_IDENTITY_ACTIONS = ("sts:AssumeRole", "sts:TagSession")

# AWS managed policies of the two service roles.
CLUSTER_ROLE_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
# Nodes: what kubelet and the Pod Identity agent need (AmazonEKSWorkerNodePolicy) and image pulls
# only (AmazonEC2ContainerRegistryPullOnly; ReadOnly would also list and describe every repository).
# EKS user guide "Amazon EKS node IAM role" (create-node-role) names exactly these two. The VPC CNI's
# ENI permissions (on "*") are NOT here: they belong to the CNI's own role (VPC_CNI_POLICIES).
NODE_ROLE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
)
# The VPC CNI (aws-node DaemonSet, service account kube-system/aws-node) gets its permissions through
# an EKS Pod Identity association on the vpc-cni add-on. EKS user guide cni-iam-role: "The Amazon
# VPC CNI plugin also supports Amazon EKS Pod Identities ... We recommend that you assign it to a
# separate role"; add-on associations: update-addon-role, API AddonPodIdentityAssociations.
VPC_CNI_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",)
VPC_CNI_NAMESPACE = "kube-system"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"
CLOUDWATCH_AGENT_POLICIES = ("arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy",)


def _statement(sid: str, actions: tuple[str, ...], resources: list[str], **extra: Any) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": resources, **extra}


def training_role_policy(
    datasets_bucket_arn: str, checkpoints_bucket_arn: str, kms_key_arn: str, region: str
) -> dict[str, Any]:
    """Identity policy of the training role (see the module docstring for what and why)."""
    for label, arn, prefix in (
        ("datasets bucket", datasets_bucket_arn, "arn:aws:s3:::"),
        ("checkpoints bucket", checkpoints_bucket_arn, "arn:aws:s3:::"),
        ("KMS key", kms_key_arn, "arn:aws:kms:"),
    ):
        if not isinstance(arn, str) or not arn.startswith(prefix) or "*" in arn:
            raise ValueError(f"{label} ARN must be a concrete ARN starting with {prefix!r}, got {arn!r}")
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            _statement("ListDatasets", DATASET_BUCKET_ACTIONS, [datasets_bucket_arn]),
            _statement("ReadDatasets", DATASET_OBJECT_ACTIONS, [f"{datasets_bucket_arn}/*"]),
            _statement("ListCheckpoints", CHECKPOINT_BUCKET_ACTIONS, [checkpoints_bucket_arn]),
            _statement("ReadWriteCheckpoints", CHECKPOINT_OBJECT_ACTIONS, [f"{checkpoints_bucket_arn}/*"]),
            _statement(
                "UseDataKeyThroughS3",
                KMS_ACTIONS,
                [kms_key_arn],
                Condition={"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}},
            ),
        ],
    }


def pod_identity_trust_policy(cluster_arn: str, namespace: str, service_account: str) -> dict[str, Any]:
    """Trust policy letting EKS Pod Identity hand this role to ONE service account of ONE cluster.

    Pod Identity tags the session with the cluster ARN, namespace and service account; matching
    them here keeps any other association in the account from assuming the role (EKS user guide,
    "Create IAM role with trust policy required by EKS Pod Identity").
    """
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "EksPodIdentity",
                "Effect": "Allow",
                "Principal": {"Service": POD_IDENTITY_PRINCIPAL},
                "Action": list(POD_IDENTITY_ACTIONS),
                "Condition": {
                    "StringEquals": {
                        "aws:RequestTag/eks-cluster-arn": cluster_arn,
                        "aws:RequestTag/kubernetes-namespace": namespace,
                        "aws:RequestTag/kubernetes-service-account": service_account,
                    }
                },
            }
        ],
    }


def service_trust_policy(service: str) -> dict[str, Any]:
    """Trust policy for an AWS service principal (eks.amazonaws.com, ec2.amazonaws.com)."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": ["sts:AssumeRole"]},
        ],
    }


# Scale-to-zero Lambda (infra/scale_to_zero.py). The read-only describe and metric calls below have
# no resource-level permissions in IAM, so they take "*"; the writes are narrow: UpdateNodegroupConfig
# on the cluster's GPU node groups, Publish to the stack's alert topic, and CreateTags of one tag key
# (the "already notified" mark) on instances of this cluster only.
SCALE_TO_ZERO_NODEGROUP_ACTIONS = ("eks:DescribeNodegroup", "eks:UpdateNodegroupConfig")
SCALE_TO_ZERO_READ_ACTIONS = ("ec2:DescribeInstances", "cloudwatch:GetMetricData")
SCALE_TO_ZERO_NOTIFY_ACTIONS = ("sns:Publish",)
SCALE_TO_ZERO_MARK_ACTIONS = ("ec2:CreateTags",)
LOG_WRITE_ACTIONS = ("logs:CreateLogStream", "logs:PutLogEvents")


def scale_to_zero_policy(region: str, account_id: str, cluster: str, node_groups: list[str],
                         log_group_arn: str, alert_topic_arn: str, notified_tag: str) -> dict[str, Any]:
    """Identity policy of the scale-to-zero Lambda."""
    if not node_groups:
        raise ValueError("the scale-to-zero policy needs at least one node group")
    nodegroup_arns = [f"arn:aws:eks:{region}:{account_id}:nodegroup/{cluster}/{ng}/*" for ng in node_groups]
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            _statement("ScaleGpuNodeGroups", SCALE_TO_ZERO_NODEGROUP_ACTIONS, nodegroup_arns),
            _statement("ReadNodesAndGpuMetrics", SCALE_TO_ZERO_READ_ACTIONS, ["*"]),
            _statement("NotifyUnwatchedNodes", SCALE_TO_ZERO_NOTIFY_ACTIONS, [alert_topic_arn]),
            _statement(
                "MarkNotifiedNodes", SCALE_TO_ZERO_MARK_ACTIONS,
                [f"arn:aws:ec2:{region}:{account_id}:instance/*"],
                Condition={"StringEquals": {"aws:ResourceTag/eks:cluster-name": cluster},
                           "ForAllValues:StringEquals": {"aws:TagKeys": [notified_tag]}}),
            _statement("WriteOwnLogs", LOG_WRITE_ACTIONS, [f"{log_group_arn}:*"]),
        ],
    }


# EKS envelope encryption of Secrets: the cluster role uses the data-layer key (terraform-aws-eks
# attaches the same four actions to its cluster role for cluster_encryption_config).
CLUSTER_KMS_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey")


def cluster_encryption_policy(kms_key_arn: str) -> dict[str, Any]:
    """Identity policy letting the EKS cluster role envelope-encrypt Secrets with one key."""
    if not isinstance(kms_key_arn, str) or not kms_key_arn.startswith("arn:aws:kms:") or "*" in kms_key_arn:
        raise ValueError(
            f"KMS key ARN must be a concrete ARN starting with 'arn:aws:kms:', got {kms_key_arn!r}")
    return {"Version": POLICY_VERSION,
            "Statement": [_statement("EncryptClusterSecrets", CLUSTER_KMS_ACTIONS, [kms_key_arn])]}
