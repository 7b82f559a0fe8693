"""Data layer: encrypted, versioned, private, TLS-only buckets and an immutable, scanned ECR repository,
all protected, and untouched (same URNs, same inputs) when compute is switched off."""

import json

import pytest

from tests.infra.harness import run_program

BUCKET = "aws:s3/bucket:Bucket"


def child(result, type_, bucket):
    (res,) = [r for r in result.of_type(type_) if r.inputs.get("bucket") == bucket.id]
    return res


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_buckets_are_encrypted_versioned_private_and_tls_only(committed, stack):
    result = committed(stack)
    key = result.one("aws:kms/key:Key", "data-key")
    assert key.inputs["enableKeyRotation"] is True
    prefix = result.config["ringtrain:data"]["bucketPrefix"]
    # The data layer's buckets (fixed names); prod's flow-log bucket is the network's (test_network.py).
    buckets = {b.inputs["bucket"]: b for b in result.of_type(BUCKET) if b.inputs.get("bucket")}
    assert set(buckets) == {f"{prefix}-datasets", f"{prefix}-checkpoints"}
    for bucket in buckets.values():
        assert bucket.inputs["forceDestroy"] is False
        (rule,) = child(result, "aws:s3/bucketServerSideEncryptionConfiguration:"
                                "BucketServerSideEncryptionConfiguration", bucket).inputs["rules"]
        assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "aws:kms",
                                                              "kmsMasterKeyId": key.outputs["arn"]}
        assert rule["bucketKeyEnabled"] is True
        versioning = child(result, "aws:s3/bucketVersioning:BucketVersioning", bucket)
        assert versioning.inputs["versioningConfiguration"]["status"] == "Enabled"
        block = child(result, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", bucket).inputs
        assert all(block[f] is True for f in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                              "restrictPublicBuckets"))
        owner = child(result, "aws:s3/bucketOwnershipControls:BucketOwnershipControls", bucket)
        assert owner.inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"
        policy = json.loads(child(result, "aws:s3/bucketPolicy:BucketPolicy", bucket).inputs["policy"])
        (deny,) = policy["Statement"]
        assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        arn = bucket.outputs["arn"]
        assert deny["Resource"] == [arn, f"{arn}/*"]
    assert result.exports["datasetsBucket"] == f"{prefix}-datasets"
    assert result.exports["checkpointsBucket"] == f"{prefix}-checkpoints"
    assert result.exports["kmsKeyArn"] == key.outputs["arn"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_lifecycle_expires_old_checkpoint_versions_and_aborts_uploads(committed, stack):
    result = committed(stack)
    data_cfg = result.config["ringtrain:data"]
    rules = {b.inputs["bucket"].rsplit("-", 1)[1]: {
        r["id"]: r for r in child(result, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                                  b).inputs["rules"]}
        for b in result.of_type(BUCKET) if b.inputs.get("bucket")}
    for kind in ("datasets", "checkpoints"):
        abort = rules[kind]["abort-incomplete-multipart-uploads"]
        assert abort["status"] == "Enabled"
        assert abort["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 7
    expire = rules["checkpoints"]["expire-noncurrent-versions"]
    assert expire["noncurrentVersionExpiration"]["noncurrentDays"] == data_cfg["checkpointNoncurrentDays"]
    expire = rules["datasets"]["expire-noncurrent-versions"]
    dataset_days = data_cfg.get("datasetNoncurrentDays", 30)  # the default of infra/config.py
    assert expire["noncurrentVersionExpiration"]["noncurrentDays"] == dataset_days


def test_ecr_repository_is_immutable_scanned_encrypted_with_lifecycle(committed):
    result = committed("prod")
    repo = result.one("aws:ecr/repository:Repository")
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repo.inputs["encryptionConfigurations"] == [
        {"encryptionType": "KMS", "kmsKey": result.one("aws:kms/key:Key", "data-key").outputs["arn"]}]
    assert repo.inputs["forceDelete"] is False
    assert result.exports["ecrRepositoryUrl"] == repo.outputs["repositoryUrl"]
    lifecycle = json.loads(result.one("aws:ecr/lifecyclePolicy:LifecyclePolicy").inputs["policy"])
    selections = [r["selection"] for r in lifecycle["rules"]]
    assert {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": 7} \
        in selections
    assert any(s["countType"] == "imageCountMoreThan" and s["countNumber"] == 30 for s in selections)


def data_layer(result):
    root = result.one("ringtrain:data:DataLayer")
    return [root, *[r for r in result.resources if root in result.ancestors(r)]]


def test_every_data_resource_is_protected(committed):
    resources = [r for r in data_layer(committed("dev")) if r.custom]
    assert len(resources) >= 18
    assert all(r.protect is True for r in resources), [r.name for r in resources if r.protect is not True]
    unprotected = [r for r in data_layer(run_program("dev", overrides={"ringtrain:dataProtection": False}))
                   if r.custom]
    assert all(r.protect is False for r in unprotected)


def test_compute_off_keeps_the_data_layer_identical(committed):
    """`down` = up with compute false: same URNs and inputs for data, no cluster, no NAT."""
    up = committed("dev")
    down = run_program("dev", overrides={"ringtrain:compute": False})
    before = {r.urn: r.inputs for r in data_layer(up)}
    after = {r.urn: r.inputs for r in data_layer(down)}
    assert before == after
    kinds = down.types()
    assert not any(t.startswith(("aws:eks/", "kubernetes:")) for t in kinds)
    assert "aws:ec2/natGateway:NatGateway" not in kinds
    assert "aws:ec2/launchTemplate:LaunchTemplate" not in kinds
    assert {"datasetsBucket", "checkpointsBucket", "ecrRepositoryUrl", "kmsKeyArn"} <= set(down.exports)
    assert "clusterName" not in down.exports
