"""The `checkpoint_throughput` section of `scripts/bench`: checkpoint write and restore throughput
against a bare boto3 transfer of the same bytes to the same store (the local moto S3 server on
loopback), per state size, in paired repeats.

Write: CheckpointStore.write (torch.save streamed through a pipe, checksum, multipart upload, manifest)
against boto3's upload_file of the same bytes, serialized once beforehand into a file. Each side drops
its previous copy untimed (our prune; the trainer hears "written" before it, as here).
Restore: CheckpointStore.latest_valid (listing, manifest, ranged GETs into an in-memory file hashed
in order, torch.load mapping it) against download_fileobj into an mmap of the object's size. Both
sides use the same client settings (train.storage.s3_client); the bare side keeps boto3's own
transfer settings. A ratio is the bare transfer's time over ours, per repeat (target >= 0.8): ours
does the serialization, hashing and loading on top. The writer process's hand-over (the copy into its shared
buffer) is not in it: the checkpoint-stall section measures what training pays for that.
"""

from __future__ import annotations

import gc
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from bench.figures import Ratio, Transfer
from bench.sections import STORE_BUCKET, STORE_PRIORITY, ThroughputSize, object_store
from bench.stats import paired_ratios

TARGET = 0.8
SIDES = ("ours", "bare")


def order(repeat: int) -> tuple[str, str]:
    """Which side runs first in a repeat: alternated, so a machine getting busier or quieter over a
    pair favours neither."""
    return SIDES if repeat % 2 == 0 else SIDES[::-1]


def transfer(bare_s: list[float], ours_s: list[float], nbytes: int) -> Transfer:
    """Pure: one direction (write or restore) of one size, from its paired times in seconds: the
    per-repeat ratios bare time / our time (our share of the bare transfer's rate) against TARGET."""
    return Transfer(tuple(ours_s), tuple(bare_s), nbytes, Ratio.of(paired_ratios(bare_s, ours_s), TARGET))


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure_size(size: ThroughputSize, endpoint_url: str, bucket: str, tmp: Path,
                 progress: Callable[[str], None]) -> dict:
    """Paired repeats of one size: all the writes first (the state held), then all the restores
    (the state freed first: a 4 GB state, the restored copy and its mmap would not fit beside it)."""
    import torch

    from train.checkpoint import store as ckpt
    from train.storage import open_store, s3_client

    client = s3_client(endpoint_url)
    prefix = f"checkpoint-throughput/{size.size_mb}mb"
    bare_key = f"{prefix}/bare/state.pt"
    ours = ckpt.CheckpointStore(open_store(f"s3://{bucket}/{prefix}/ours", endpoint_url), keep=1)
    state = {"w": torch.rand(size.size_mb * 250_000)}  # 4 bytes a float: size_mb MB
    # The bare side's bytes: the same state through the same serializer as ours (torch.save into a
    # pipe writes another zip layout than into a seekable file), into a file
    source = tmp / f"state-{size.size_mb}mb.pt"
    stream = ckpt.SerializedStream(state)
    try:
        with open(source, "wb") as f:
            shutil.copyfileobj(stream, f, 8 << 20)
    finally:
        stream.close()
    times: dict[str, dict[str, list[float]]] = {d: {s: [] for s in SIDES} for d in ("write", "restore")}
    written = []

    def write(side: str, repeat: int, state: dict) -> float:
        if side == "ours":
            seconds = _timed(lambda: written.append(ours.write(repeat + 1, state)))
            ours.prune()  # the writer's reply goes before it
            return seconds
        client.delete_object(Bucket=bucket, Key=bare_key)  # untimed: moto frees the last copy's files
        return _timed(lambda: client.upload_file(str(source), bucket, bare_key))

    for repeat in range(size.repeats):
        for side in order(repeat):
            times["write"][side].append(write(side, repeat, state))
        progress(f"  {size.size_mb} MB write {repeat + 1}/{size.repeats}: ours "
                 f"{times['write']['ours'][-1]:.2f} s, bare {times['write']['bare'][-1]:.2f} s")
    nbytes = source.stat().st_size
    if set(written) != {nbytes}:
        raise RuntimeError(f"{size.size_mb} MB: ours wrote {sorted(set(written))} bytes, the bare side "
                           f"{nbytes}: not the same state")
    del state
    source.unlink()
    gc.collect()

    def restore(side: str) -> float:
        if side == "ours":
            def load() -> None:
                found = ours.latest_valid()
                if found is None or found.state["w"].numel() != size.size_mb * 250_000:
                    raise RuntimeError(f"{size.size_mb} MB: the checkpoint did not restore")
            seconds = _timed(load)
        else:
            with mmap.mmap(-1, nbytes) as out:  # the destination ours restores into, preallocated
                seconds = _timed(lambda: client.download_fileobj(bucket, bare_key, out))
        gc.collect()  # the restored state goes before the next one comes
        return seconds

    for repeat in range(size.repeats):
        for side in order(repeat):
            times["restore"][side].append(restore(side))
        progress(f"  {size.size_mb} MB restore {repeat + 1}/{size.repeats}: ours "
                 f"{times['restore']['ours'][-1]:.2f} s, bare {times['restore']['bare'][-1]:.2f} s")
    ours.store.delete_many([*ours.store.list()])
    client.delete_object(Bucket=bucket, Key=bare_key)
    return {"size_mb": size.size_mb, "bytes": nbytes, "repeats": size.repeats,
            "write": transfer(times["write"]["bare"], times["write"]["ours"], nbytes).to_json(),
            "restore": transfer(times["restore"]["bare"], times["restore"]["ours"], nbytes).to_json()}


def section(plan, progress: Callable[[str], None]) -> dict:
    """scripts/bench's section: every size of plan.throughput_sizes against one local store."""
    from train.storage import S3_CONCURRENCY, S3_PART_BYTES

    sizes = []
    with object_store() as store, tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp, \
            mock.patch.dict(os.environ, store.env()):  # boto3 finds the store's credentials there
        for size in plan.throughput_sizes:
            row = measure_size(size, store.endpoint_url, STORE_BUCKET, Path(tmp), progress)
            write, restore = (Ratio.from_json(row[d]) for d in ("write", "restore"))
            progress(f"checkpoint throughput {size.size_mb} MB: "
                     f"write {write.median:.3f}x ({write.verdict()}), "
                     f"restore {restore.median:.3f}x ({restore.verdict()})")
            sizes.append(row)
    return {"status": "ok", "target": TARGET, "sizes": sizes,
            "store": f"moto S3 on loopback at {STORE_PRIORITY}, objects on disk "
                     "(cluster/local/moto_server.py)",
            "ours": {"part_bytes": S3_PART_BYTES, "concurrency": S3_CONCURRENCY},
            "method": "per size, paired repeats in alternating order (ours first in even repeats): all "
                      "writes with the state in memory, then all restores after it is freed. Write: "
                      "CheckpointStore.write of the state (torch.save streamed, XXH3-128 checksum, "
                      "multipart, manifest) vs boto3 upload_file of the same state serialized once into "
                      "a file beforehand; each side drops its previous copy untimed (our prune runs after "
                      "the writer's reply). Restore: CheckpointStore.latest_valid (list, manifest, "
                      "ranged GETs into an in-memory file hashed as the parts arrive, torch.load mapping "
                      "it) vs download_fileobj into an mmap. "
                      "Same client settings (train.storage.s3_client); the bare side with boto3's "
                      "default transfer settings. Ratio = bare time / our time per repeat, median "
                      "with its distribution-free 95 % interval; target >= 0.8, decided where the "
                      "interval lies on one side of it."}
