"""The local backend's store goes with the cluster: before teardown the flow copies the run's export
(train/export.py: model.safetensors, model.json) into the run's directory, where `load_export` reads it."""

from __future__ import annotations

from pathlib import Path

from cluster.backend import BackendError, Storage

FILES = ("model.safetensors", "model.json")  # train.export.WEIGHTS and MODEL_JSON (model.json last)


def keep_export(storage: Storage, export_uri: str, dest: Path) -> Path:
    """Copy the export at `export_uri` (s3://, in `storage`'s store) into `dest`; BackendError if not."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    env = storage.env
    client = boto3.client("s3", endpoint_url=storage.endpoint_url,
                          aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                          aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
                          region_name=env.get("AWS_DEFAULT_REGION"))
    bucket, _, prefix = export_uri.removeprefix("s3://").partition("/")
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        try:
            body = client.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}")["Body"].read()
        except (BotoCoreError, ClientError) as e:
            raise BackendError(f"cannot copy the export {export_uri}/{name} out of the store: {e}") from e
        (dest / name).write_bytes(body)
    return dest
