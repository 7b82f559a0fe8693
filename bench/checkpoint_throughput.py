"""Checkpoint write and restore throughput against a bare boto3 transfer of the same bytes to the same
store (the local moto S3 server on loopback):

    .venv/bin/python -m bench.checkpoint_throughput [--sizes-mb 100 1000 4000] [--out results.json]

Write: CheckpointStore.write (torch.save streamed through a pipe, sha256, multipart upload, manifest)
against boto3's upload_fileobj of the already serialized bytes. Restore: CheckpointStore.latest_valid
(ranged GETs into an mmap, sha256, torch.load) against download_fileobj into memory. Ratios are the
bare transfer's time over ours (target >= 0.8): ours does the serialization, hashing and loading on
top, and the bare one skips them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import torch

from train import checkpoint as ckpt
from train.storage import open_store

BUCKET = "throughput"


def measure(store_endpoint: str, client, size_mb: int) -> dict:
    state = {"w": torch.rand(size_mb * 250_000)}  # 4 bytes a float: size_mb MB
    checkpoints = ckpt.CheckpointStore(open_store(f"s3://{BUCKET}/ours-{size_mb}", store_endpoint), keep=1)
    started = time.perf_counter()
    nbytes = checkpoints.write(1, state)
    write_s = time.perf_counter() - started
    raw = io.BytesIO()
    ckpt.save(state, raw)
    del state
    raw.seek(0)
    started = time.perf_counter()
    client.upload_fileobj(raw, BUCKET, f"bare-{size_mb}/state.pt")
    bare_write_s = time.perf_counter() - started
    del raw
    started = time.perf_counter()
    found = checkpoints.latest_valid()
    restore_s = time.perf_counter() - started
    del found
    sink = io.BytesIO()
    started = time.perf_counter()
    client.download_fileobj(BUCKET, f"bare-{size_mb}/state.pt", sink)
    bare_restore_s = time.perf_counter() - started
    return {"size_mb": size_mb, "bytes": nbytes,
            "write_mb_s": round(nbytes / write_s / 1e6, 1),
            "bare_write_mb_s": round(nbytes / bare_write_s / 1e6, 1),
            "write_ratio": round(bare_write_s / write_s, 3),
            "restore_mb_s": round(nbytes / restore_s / 1e6, 1),
            "bare_restore_mb_s": round(nbytes / bare_restore_s / 1e6, 1),
            "restore_ratio": round(bare_restore_s / restore_s, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.checkpoint_throughput",
                                description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000, 4000])
    p.add_argument("--out", default=None, help="write the rows as JSON here too")
    args = p.parse_args(argv)
    from cluster.local.objectstore import ObjectStore

    rows = []
    with ObjectStore() as store:
        os.environ.update(store.env())
        client = store.client()
        client.create_bucket(Bucket=BUCKET)
        for size in args.sizes_mb:
            rows.append(measure(store.endpoint_url, client, size))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"store": "moto S3 on loopback", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
