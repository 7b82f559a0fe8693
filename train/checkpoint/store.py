"""Atomic checkpoints on S3 or a local directory, newest-valid discovery, retention.

(Written off the training process by train.checkpoint.writer.)

Layout under the checkpoint URI:

    step-000000050/state.pt        torch.save of the training state (model, optimizer, scaler,
                                   sampler position, counters; random streams are derived
                                   per step, see recipe.step_seed)
    step-000000050/manifest.json   {"format": ..., "step": 50, "objects": {"state.pt":
                                   {"xxh3_128": ..., "bytes": ...}}, "write_bytes_per_s": ...}
                                   -- written LAST

A checkpoint exists only once its manifest does, and is valid only if every object matches the
manifest's checksum; anything else (a write killed half-way, a corrupt object) is skipped with a
warning, so a crash at any moment leaves the previous checkpoint as the newest valid one.
(The checksum: train.checksum.)
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import BinaryIO

import torch
import torch.utils.serialization as torch_serialization

from train import checksum
from train.contract import MANIFEST, step_dir
from train.storage import Store

FORMAT = "ringtrain-checkpoint/1"
STATE = "state.pt"
_STEP_DIR = re.compile(r"^step-(\d{9})$")
# Fault injection for tests: seconds to wait between writing the objects and the manifest, so a test
# can kill the writer at exactly the moment that must not produce a valid checkpoint.
FAULT_DELAY_ENV = "RINGTRAIN_FAULT_CHECKPOINT_DELAY_S"
# And seconds to wait before each read of the serialized state (a part, on S3): a slow upload.
FAULT_READ_DELAY_ENV = "RINGTRAIN_FAULT_CHECKPOINT_READ_DELAY_S"


class CheckpointWarning(UserWarning):
    pass


class WriteCancelled(Exception):
    """A checkpoint write aborted on purpose (a stop checkpoint replaces it)."""


def save(state: dict, f: BinaryIO) -> None:
    """torch.save, without the zip format's CRC32 of every record: the manifest's checksum of the whole
    file is what a reader checks, and the CRC pass is a large share of the serialization's CPU, spent
    on the training node."""
    with torch_serialization.config.patch({"save.compute_crc32": False}):
        torch.save(state, f)


def load(f, mmap: bool = False) -> dict:
    """`mmap` (f a path): the tensors use the file's pages, no copy. weights_only: a checkpoint read
    from shared storage must not be able to run code."""
    return torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)


def tensor_bytes(state) -> int:
    """The bytes of the tensors in `state` (each storage once): about what torch.save writes."""
    storages: dict[int, int] = {}

    def visit(x) -> None:
        if isinstance(x, torch.Tensor):
            storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, list | tuple):
            for v in x:
                visit(v)

    visit(state)
    return sum(storages.values())


class SerializedStream:
    """torch.save's bytes as a readable stream, never whole in memory: a thread saves into a pipe, and
    read() checksums and counts what passes. read() raises WriteCancelled once `cancelled` is set, and
    the serializer's error instead of an early EOF, so the upload reading it fails instead of storing
    a cut-off state.pt."""

    def __init__(self, state: dict, cancelled: threading.Event | None = None):
        read_fd, write_fd = os.pipe()
        self._pipe = os.fdopen(read_fd, "rb")
        self._cancelled = cancelled or threading.Event()
        self._read_delay = float(os.environ.get(FAULT_READ_DELAY_ENV, "0") or 0)
        self.digest = checksum.new()
        self.nbytes = 0
        self._error: BaseException | None = None
        self._complete = False
        self._thread = threading.Thread(target=self._serialize, args=(state, write_fd), daemon=True,
                                         name="ringtrain-checkpoint-save")
        self._thread.start()

    def _serialize(self, state: dict, write_fd: int) -> None:
        try:
            with os.fdopen(write_fd, "wb") as f:  # its close is the reader's EOF
                save(state, f)
                f.flush()
                self._complete = True
        except BaseException as e:  # noqa: BLE001 - raised by read() in the uploading thread
            self._error = e

    def read(self, n: int = -1) -> bytes:
        if self._read_delay > 0:
            self._cancelled.wait(self._read_delay)
        if self._cancelled.is_set():
            raise WriteCancelled("checkpoint write aborted")
        data = self._pipe.read(n)
        if not data and not self._complete:
            self._thread.join()
            raise self._error or RuntimeError("checkpoint serialization ended early")
        self.digest.update(data)
        self.nbytes += len(data)
        return data

    def close(self) -> None:
        """Stop reading: a serializer still writing gets a broken pipe and ends."""
        self._pipe.close()
        self._thread.join()


@dataclass
class Found:
    step: int
    state: dict
    write_rate: float | None = None  # bytes/s its write reached (the manifest's write_bytes_per_s)


def _check_manifest_shape(manifest) -> None:
    """ValueError (its reason) unless the parsed manifest has the types read() relies on: an object,
    `objects` an object of objects, `write_bytes_per_s` a number when present."""
    def kind(value) -> str:
        return {dict: "an object", list: "a list", str: "a string", type(None): "null",
                bool: "a boolean"}.get(type(value), "a number")

    if not isinstance(manifest, dict):
        raise ValueError(f"the manifest is {kind(manifest)}, not an object")
    objects = manifest.get("objects", {})
    if not isinstance(objects, dict):
        raise ValueError(f"the manifest's objects is {kind(objects)}, not an object")
    for name, entry in objects.items():
        if not isinstance(entry, dict):
            raise ValueError(f"the manifest's objects.{name} is {kind(entry)}, not an object")
    rate = manifest.get("write_bytes_per_s")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
        raise ValueError(f"the manifest's write_bytes_per_s is {kind(rate)}, not a number")


class CheckpointStore:
    """Reads list the store afresh; the writing side lists once and then keeps its own record of what
    is there (one writer per job writes under its URI), so a checkpoint costs two PUTs and, once
    `keep` are there, one batch DELETE (prune): on a CPU-bound node every request's client work is
    training time lost (bench/, "checkpoint stall")."""

    def __init__(self, store: Store, keep: int):
        self.store = store
        self.keep = keep
        self._written: dict[int, set[str]] | None = None  # the writer's record: step -> object names

    def _steps(self) -> dict[int, set[str]]:
        """step -> names of the objects present in its directory."""
        out: dict[int, set[str]] = {}
        for key in self.store.list():
            top, _, name = key.partition("/")
            m = _STEP_DIR.match(top)
            if m and name:
                out.setdefault(int(m.group(1)), set()).add(name)
        return out

    def write(self, step: int, state: dict, cancelled: threading.Event | None = None) -> int:
        """Save `state` as checkpoint `step`, streaming it to the store; returns its bytes. Setting
        `cancelled` aborts it (WriteCancelled): no manifest, and no upload left behind. Older
        checkpoints stay until prune()."""
        if self._written is None:
            self._written = self._steps()
        d = step_dir(step)
        if MANIFEST in self._written.get(step, set()):
            # A stale manifest from an earlier life of this step would vouch for objects being replaced.
            self.store.delete(f"{d}/{MANIFEST}")
        self._written.setdefault(step, set()).discard(MANIFEST)
        started = time.perf_counter()
        stream = SerializedStream(state, cancelled)
        try:
            self.store.upload(f"{d}/{STATE}", stream, size_hint=tensor_bytes(state))
        finally:
            stream.close()
        seconds = time.perf_counter() - started
        self._written[step].add(STATE)
        delay = float(os.environ.get(FAULT_DELAY_ENV, "0") or 0)
        if delay > 0:
            (cancelled or threading.Event()).wait(delay)
        manifest = {
            "format": FORMAT,
            "step": step,
            "created_unix": time.time(),
            "objects": {STATE: {checksum.WRITTEN: stream.digest.hexdigest(), "bytes": stream.nbytes}},
            # serialized and uploaded; a resumed run predicts its stop checkpoint's time from it
            "write_bytes_per_s": round(stream.nbytes / max(seconds, 1e-6)),
        }
        if cancelled is not None and cancelled.is_set():  # uploaded, but no longer wanted
            self.store.delete(f"{d}/{STATE}")
            self._written[step].discard(STATE)
            raise WriteCancelled("checkpoint write aborted before its manifest")
        self.store.put(f"{d}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
        self._written[step].add(MANIFEST)
        return stream.nbytes

    def read(self, step: int) -> Found:
        """The step's checkpoint, or raise ValueError saying why it is not a valid one."""
        d = step_dir(step)
        try:
            manifest = json.loads(self.store.get(f"{d}/{MANIFEST}"))
        except FileNotFoundError:
            raise ValueError("no manifest (a write that did not finish)") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"unreadable manifest: {e}") from None
        _check_manifest_shape(manifest)
        if manifest.get("format") != FORMAT or manifest.get("step") != step:
            raise ValueError(f"manifest format/step mismatch ({manifest.get('format')}, "
                             f"{manifest.get('step')})")
        objects = manifest.get("objects", {})
        if STATE not in objects:
            raise ValueError(f"manifest lists no {STATE}")
        try:
            algorithm = checksum.algorithm(objects[STATE])
        except ValueError as why:
            raise ValueError(f"{STATE} {why}") from None
        try:
            # (an empty one raises ValueError: not a checkpoint either)
            digest = checksum.HASHES[algorithm]()
            with self.store.mapped_file(f"{d}/{STATE}", digest) as path:
                if digest.hexdigest() != objects[STATE][algorithm]:
                    raise ValueError(f"{STATE} fails its {algorithm} check")
                try:  # the state's tensors map the bytes just checked (a store never rewrites them)
                    return Found(step, load(path, mmap=True), manifest.get("write_bytes_per_s"))
                except Exception as e:  # a matching checksum but unloadable bytes: still not usable
                    raise ValueError(f"{STATE} does not load: {e}") from None
        except FileNotFoundError:
            raise ValueError(f"{STATE} missing") from None

    def latest_valid(self) -> Found | None:
        """The newest checkpoint that verifies; invalid newer ones are skipped with a warning."""
        for step in sorted(self._steps(), reverse=True):
            try:
                return self.read(step)
            except ValueError as why:
                warnings.warn(f"skipping checkpoint {self.store.uri}/{step_dir(step)}: {why}",
                              CheckpointWarning, stacklevel=2)
        return None

    def valid_steps(self) -> list[int]:
        """Steps whose manifest exists (checksums not verified), ascending."""
        return sorted(s for s, names in self._steps().items() if MANIFEST in names)

    def prune(self) -> None:
        """Keep the newest `keep` complete checkpoints; drop older complete and older partial ones.
        Apart from write(): a new checkpoint is safe once its manifest is there, so the writer tells
        the trainer first and prunes after. A delete that fails leaves the record, and the next prune
        tries again."""
        if self._written is None:
            self._written = self._steps()
        steps = self._written
        complete = sorted((s for s, names in steps.items() if MANIFEST in names), reverse=True)
        if len(complete) <= self.keep:
            return
        oldest_kept = complete[self.keep - 1]
        doomed = [s for s in sorted(steps) if s < oldest_kept]
        # Manifests first in the batch; and a checkpoint whose objects went first would fail its
        # check anyway, so a delete cut short never leaves a checkpoint that looks valid but is not.
        keys = [f"{step_dir(s)}/{MANIFEST}" for s in doomed if MANIFEST in steps[s]]
        keys += [f"{step_dir(s)}/{name}" for s in doomed for name in sorted(steps[s] - {MANIFEST})]
        self.store.delete_many(keys)
        for s in doomed:
            del steps[s]
