"""`python -m bench.shard_read`: bytes/s the shard stream (train.shards) reads from the local S3 store
(moto, cluster/local) against a bare boto3 loop reading the same objects, interleaved, repeated.

Not a section of `python -m bench` (yet): it times the input pipeline's S3 side alone, for the choice
of library in docs/DATA.md. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from cluster.local.objectstore import LOCAL_CREDENTIALS, ObjectStore
from train import shards


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shard_read")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-mb", type=float, default=4.0)
    p.add_argument("--sample-kb", type=float, default=100.0, help="bytes of one sample (an image's size)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    os.environ.update(LOCAL_CREDENTIALS)
    per_shard = max(1, int(a.shard_mb * 1024 / a.sample_kb))
    rng = np.random.default_rng(0)
    with ObjectStore() as store:
        client = store.client()
        client.create_bucket(Bucket="bench")
        uri = "s3://bench/ds"

        def samples():
            for s in range(a.shards):
                yield [{"__key__": f"{s:04d}{i:05d}", "jpg": rng.bytes(int(a.sample_kb * 1024)), "cls": b"1"}
                       for i in range(per_shard)]

        index = shards.write_dataset(uri, samples(), {"kind": "image", "classes": ["0", "1"]},
                                     store.endpoint_url)
        total = sum(s["bytes"] for s in index["shards"])
        ds = shards.open_dataset(uri, store.endpoint_url, "image")

        def bare() -> float:
            t = time.perf_counter()
            for s in index["shards"]:
                client.get_object(Bucket="bench", Key=f"ds/{s['name']}")["Body"].read()
            return total / (time.perf_counter() - t)

        def stream() -> float:
            t = time.perf_counter()
            it = shards.ShardStream(ds, 0, per_shard, 0, 1, None)
            for n, _ in enumerate(it, 1):
                if n == a.shards:
                    break
            it.close()
            return total / (time.perf_counter() - t)

        bare(), stream()  # warm the server and the clients
        runs = {"bare_boto3": [], "shard_stream": []}
        for _ in range(a.repeats):
            runs["bare_boto3"].append(bare())
            runs["shard_stream"].append(stream())
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({"bytes": total, "shards": a.shards, "samples_per_shard": per_shard,
                      "median_MB_per_s": {k: round(v / 1e6, 1) for k, v in med.items()},
                      "ratio_stream_over_bare": round(med["shard_stream"] / med["bare_boto3"], 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
