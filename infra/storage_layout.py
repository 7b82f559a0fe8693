"""Where ringtrain keeps its data in S3, in one place: the stack's two buckets and the keys in them.

    s3://<prefix>-datasets/datasets/<name>/          a dataset (shards and their index.json)
    s3://<prefix>-checkpoints/checkpoints/<job>/     one job's checkpoints

The stack creates the buckets (infra/data.py), the local backend creates the same ones in its object
store, both backends hand jobs these URIs, and the benchmark reads its checkpoints back from them.
Pure, no Pulumi: the cluster tooling imports it without the stack's dependencies.
"""

from __future__ import annotations

from typing import NamedTuple

DATASETS_PREFIX = "datasets"
CHECKPOINTS_PREFIX = "checkpoints"


class Buckets(NamedTuple):
    datasets: str
    checkpoints: str


def bucket_names(prefix: str) -> Buckets:
    """The stack's buckets, named from its bucketPrefix (the same names locally and on AWS)."""
    return Buckets(f"{prefix}-{DATASETS_PREFIX}", f"{prefix}-{CHECKPOINTS_PREFIX}")


def dataset_key_prefix(name: str) -> str:
    """The key prefix of a dataset's objects in the datasets bucket (ends in '/')."""
    return f"{DATASETS_PREFIX}/{name}/"


def checkpoint_key_prefix(job: str) -> str:
    """The key prefix of a job's checkpoints in the checkpoints bucket (ends in '/')."""
    return f"{CHECKPOINTS_PREFIX}/{job}/"


def dataset_uri(datasets_bucket: str, name: str) -> str:
    return f"s3://{datasets_bucket}/{dataset_key_prefix(name).rstrip('/')}"


def checkpoint_uri(checkpoints_bucket: str, job: str) -> str:
    return f"s3://{checkpoints_bucket}/{checkpoint_key_prefix(job).rstrip('/')}"
