"""Data layer that outlives every cluster: KMS key, dataset and checkpoint buckets, ECR repository.

Declared unconditionally (same names, hence same URNs, whether compute is up or not) and protected
while `dataProtection` is true, so `pulumi up` with `compute: false` removes the cluster and leaves every
resource here untouched, and a later `up` with `compute: true` finds them again. Policy documents are
plain functions returning dicts; the resources json.dumps them.

The KMS key keeps AWS's default key policy (the account administers it; IAM policies grant its use to
S3, ECR and EKS principals), so no hand-written key policy can lock the account out of its own data.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.config import DataConfig
from infra.storage_layout import bucket_names


def tls_only_bucket_policy(bucket_arn: str) -> dict:
    """Refuse every request to the bucket or its objects that does not arrive over TLS."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def ecr_lifecycle_policy(keep_tagged: int) -> dict:
    """Expire untagged images after a week; keep the newest `keep_tagged` tagged images."""
    return {
        "rules": [
            {
                "rulePriority": 1,
                "description": "expire untagged images after 7 days",
                "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                              "countNumber": 7},
                "action": {"type": "expire"},
            },
            {
                "rulePriority": 2,
                "description": f"keep the newest {keep_tagged} tagged images",
                "selection": {"tagStatus": "any", "countType": "imageCountMoreThan",
                              "countNumber": keep_tagged},
                "action": {"type": "expire"},
            },
        ]
    }


class DataLayer(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: DataConfig,
        *,
        stack: str,
        protect: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("ringtrain:data:DataLayer", name, None, opts)
        self._protect = protect
        keep = self._opts

        self.kms_key = aws.kms.Key(
            f"{name}-key",
            description=f"ringtrain {stack}: datasets, checkpoints, training images",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            opts=keep(self))
        aws.kms.Alias(f"{name}-key", name=f"alias/ringtrain-{stack}-data", target_key_id=self.kms_key.key_id,
                      opts=keep(self.kms_key))

        names = bucket_names(cfg.bucket_prefix)
        self.datasets_bucket = self._bucket(f"{name}-datasets", names.datasets, cfg,
                                            noncurrent_days=cfg.dataset_noncurrent_days)
        self.checkpoints_bucket = self._bucket(f"{name}-checkpoints", names.checkpoints, cfg,
                                               noncurrent_days=cfg.checkpoint_noncurrent_days)

        self.ecr_repo = aws.ecr.Repository(
            f"{name}-trainer",
            name=f"ringtrain/{stack}/trainer",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(
                encryption_type="KMS", kms_key=self.kms_key.arn)],
            force_delete=False,
            opts=keep(self))
        aws.ecr.LifecyclePolicy(f"{name}-trainer", repository=self.ecr_repo.name,
                                policy=json.dumps(ecr_lifecycle_policy(cfg.image_keep_count)),
                                opts=keep(self.ecr_repo))

        self.register_outputs({
            "datasetsBucket": self.datasets_bucket.bucket,
            "checkpointsBucket": self.checkpoints_bucket.bucket,
            "ecrRepositoryUrl": self.ecr_repo.repository_url,
            "kmsKeyArn": self.kms_key.arn,
        })

    def _opts(self, parent: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=parent, protect=self._protect)

    def _bucket(self, logical: str, bucket_name: str, cfg: DataConfig,
                noncurrent_days: int) -> aws.s3.Bucket:
        keep = self._opts
        bucket = aws.s3.Bucket(logical, bucket=bucket_name, force_destroy=False, opts=keep(self))
        owner = aws.s3.BucketOwnershipControls(
            logical, bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=keep(bucket))
        block = aws.s3.BucketPublicAccessBlock(
            logical, bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=keep(bucket))
        versioning = aws.s3.BucketVersioning(
            logical, bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=keep(bucket))
        aws.s3.BucketServerSideEncryptionConfiguration(
            logical, bucket=bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=self.kms_key.arn),
                bucket_key_enabled=True)],
            opts=keep(bucket))
        # The policy goes on after the public access block so S3 evaluates it with the block in place.
        aws.s3.BucketPolicy(
            logical, bucket=bucket.id,
            policy=bucket.arn.apply(lambda arn: json.dumps(tls_only_bucket_policy(arn))),
            opts=pulumi.ResourceOptions(parent=bucket, protect=self._protect, depends_on=[block, owner]))

        rules = [aws.s3.BucketLifecycleConfigurationRuleArgs(
            id="abort-incomplete-multipart-uploads", status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                days_after_initiation=cfg.abort_incomplete_upload_days))]
        rules.append(aws.s3.BucketLifecycleConfigurationRuleArgs(
            id="expire-noncurrent-versions", status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=noncurrent_days),
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                expired_object_delete_marker=True)))
        aws.s3.BucketLifecycleConfiguration(
            logical, bucket=bucket.id, rules=rules,
            # Lifecycle rules on a versioned bucket need versioning configured first.
            opts=pulumi.ResourceOptions(parent=bucket, protect=self._protect, depends_on=[versioning]))
        return bucket
