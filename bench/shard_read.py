"""The shard stream's reads from the local S3 store against bare boto3 (the `shard_read` section of
`python -m bench`): bytes/s the image and lm tasks' shard stream (train.shards.ShardStream: GETs on
read-ahead threads, checksum, tar unpacking, the sample order) reads from the local moto store on
loopback, against a bare boto3 loop reading the same objects one after the other with
`get_object()["Body"].read()`. Interleaved, repeated. It times the input pipeline's S3 side alone,
for the choice of library in docs/DATA.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from unittest import mock

import numpy as np

from bench.compare import Contender, run_comparison

BUCKET = "bench"


@dataclass(frozen=True)
class ReadShape:
    shards: int
    shard_mb: float
    sample_kb: float = 100.0  # one sample's bytes (an image's size)

    @property
    def per_shard(self) -> int:
        return max(1, int(self.shard_mb * 1024 / self.sample_kb))


def stream_vs_boto3(shape: ReadShape, repeats: int, progress: Callable[[str], None]) -> dict:
    """run_comparison's result: contenders "bare-boto3" (the baseline) and "shard-stream", metric
    bytes_per_sec."""
    from cluster.local.objectstore import LOCAL_CREDENTIALS, ObjectStore
    from train import shards

    rng = np.random.default_rng(0)
    # The store's credentials for the stream's own client, for this section only: later sections'
    # runs inherit this process's environment.
    with mock.patch.dict(os.environ, LOCAL_CREDENTIALS), ObjectStore() as store:
        client = store.client()
        client.create_bucket(Bucket=BUCKET)
        uri = f"s3://{BUCKET}/ds"

        def samples():
            for s in range(shape.shards):
                size = int(shape.sample_kb * 1024)
                yield [{"__key__": f"{s:04d}{i:05d}", "jpg": rng.bytes(size), "cls": b"1"}
                       for i in range(shape.per_shard)]

        index = shards.write_dataset(uri, samples(), {"kind": "image", "classes": ["0", "1"]},
                                     store.endpoint_url)
        total = sum(s["bytes"] for s in index["shards"])
        ds = shards.open_dataset(uri, store.endpoint_url, "image")

        def bare() -> dict:
            t = time.perf_counter()
            for s in index["shards"]:
                client.get_object(Bucket=BUCKET, Key=f"ds/{s['name']}")["Body"].read()
            return {"bytes_per_sec": total / (time.perf_counter() - t)}

        def stream() -> dict:
            t = time.perf_counter()
            it = shards.ShardStream(ds, 0, shape.per_shard, 0, 1, None)
            for n, _ in enumerate(it, 1):  # a batch is a shard's samples: one a shard
                if n == shape.shards:
                    break
            rate = total / (time.perf_counter() - t)
            it.close()
            settle()  # the reads ahead into the next epoch, past the window, must not overlap the next run
            return {"bytes_per_sec": rate}

        def settle() -> None:
            for thread in threading.enumerate():
                if thread.name.startswith("ringtrain-shards"):
                    thread.join(timeout=30)

        bare(), stream()  # warm the server and the clients
        config = {"bytes_per_run": total, "samples_per_shard": shape.per_shard, **asdict(shape)}
        return run_comparison(
            [Contender("bare-boto3", bare, {"what": "get_object().read(), one object after the other",
                                             **config}),
             Contender("shard-stream", stream, {"what": "train.shards.ShardStream, default read-ahead",
                                                **config})],
            "bare-boto3", repeats, metric="bytes_per_sec", progress=progress)
