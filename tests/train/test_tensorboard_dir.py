"""--tensorboard-dir s3://... against the local store (moto on loopback): the scalars arrive and read
back; a bucket that is not there is one message. Each test runs TensorBoard in a fresh interpreter:
its S3 filesystem takes the endpoint when first imported (train/tensorboard_dir.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.local.objectstore import LOCAL_CREDENTIALS

pytestmark = pytest.mark.slow  # each test starts an interpreter that imports torch and TensorBoard

REPO = Path(__file__).resolve().parents[2]
WRITE = """
import sys
from train.errors import BadInput
from train.metrics import MetricsLog
from train.tensorboard_dir import check_tensorboard_dir
uri, endpoint = sys.argv[1:3]
try:
    check_tensorboard_dir(uri, endpoint)
except BadInput as e:
    print(e); sys.exit(2)
log = MetricsLog(None, uri, False, 10, 0)
for step in (5, 10):
    log.log({"step": step, "loss": 1.0 / step, "eval_top1": step / 10})
log.close()
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **LOCAL_CREDENTIALS, "PYTHONPATH": str(REPO)}
    env.pop("S3_ENDPOINT", None)
    env.pop("AWS_ENDPOINT_URL", None)
    return subprocess.run([sys.executable, "-c", WRITE, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_tensorboard_scalars_go_to_an_s3_prefix(object_store, s3_bucket, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = _run(f"s3://{s3_bucket}/tb/image", object_store.endpoint_url)
    assert done.returncode == 0, done.stderr
    client = object_store.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="tb/image/")["Contents"]]
    (events,) = [k for k in keys if "tfevents" in k]
    local = tmp_path / Path(events).name
    local.write_bytes(client.get_object(Bucket=s3_bucket, Key=events)["Body"].read())
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("loss")] == [(5, 0.2), (10, 0.1)]
    assert [e.value for e in acc.Scalars("eval_top1")] == [0.5, 1.0]


def test_a_tensorboard_bucket_that_is_not_there_is_one_message(object_store):
    done = _run("s3://no-such-bucket/tb", object_store.endpoint_url)
    assert done.returncode == 2
    assert done.stdout.strip().startswith("--tensorboard-dir s3://no-such-bucket/tb: bucket 'no-such-bucket' "
                                          "does not exist"), done.stdout
