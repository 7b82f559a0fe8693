"""Exports: what a user keeps of a run, the model's weights as safetensors plus `model.json`.

Layout under the export URI (`--export-dir`; by default exports/<job> beside checkpoints/<job> in the
checkpoints bucket), on S3 or in a directory:

    model.safetensors   the model's state_dict (safetensors; a tensor tied to another is stored once,
                        under its first name, and its other names are listed in model.json)
    model.json          {"format": "ringtrain-export/1", "task": "image", "task_args": {...},
                         "model_info": {...}, "dataset": {"uri": ..., "index_xxh3_128": ...},
                         "eval": {...}, "step": N, "git_commit": ..., "image_version": ...,
                         "weights": {"name": "model.safetensors", "xxh3_128": ..., "bytes": ...},
                         "tied": {"head.weight": "tokens.weight"}}
                        written LAST: an export exists once its model.json does (as a checkpoint's
                        manifest), and the weights are checked against it when loaded

`model_info` is what the task needs to build its model again without the training data (class
names, the tokenizer and sequence length: Task.model_info), so inference needs only the export:

    from train.export import load_export
    exported = load_export("runs/image-20261207-010000/export")      # or s3://..., endpoint_url=...
    logits = exported.model(images)                                  # an nn.Module in eval mode
    exported.evaluate("s3://.../datasets/digits/eval", endpoint_url=URL)   # the run's eval metrics again

safetensors (https://huggingface.co/docs/safetensors): no code runs on load, unlike a pickle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import nn

from train import checksum
from train.errors import BadInput
from train.storage import Store, open_store
from train.task import Task, TaskContext, load_task

FORMAT = "ringtrain-export/1"
WEIGHTS = "model.safetensors"
MODEL_JSON = "model.json"
# Where the image says what it is: these variables (from its build arguments, where it sets them), else
# the VERSION file image/Dockerfile copies in; a local run has the checkout.
IMAGE_VERSION_ENV = "RINGTRAIN_IMAGE_VERSION"
GIT_COMMIT_ENV = "RINGTRAIN_GIT_COMMIT"
IMAGE_VERSION_FILE = Path("/etc/ringtrain/VERSION")
REPO_ROOT = Path(__file__).resolve().parents[1]


def default_export_uri(checkpoint_uri: str | None) -> str | None:
    """exports/<job> beside checkpoints/<job> (infra/storage_layout.py's layout), else None (pure)."""
    if not checkpoint_uri:
        return None
    parent, _, job = checkpoint_uri.rstrip("/").rpartition("/")
    head, _, last = parent.rpartition("/")
    if last != "checkpoints" or not job or not head:
        return None
    return f"{head}/exports/{job}"


# ---- what goes into model.json ------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """A task flag's value as JSON (paths and other objects as strings)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


def provenance(environ=os.environ, repo: Path = REPO_ROOT,
               image_file: Path = IMAGE_VERSION_FILE) -> dict[str, str | None]:
    """The code's git commit and the image's version: from the image's environment or VERSION file,
    else the checkout (`git rev-parse HEAD`; image/VERSION marked as a local checkout), else None."""
    commit = environ.get(GIT_COMMIT_ENV)
    if not commit and (repo / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                  text=True, timeout=10)
            commit = done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            commit = None
    version = environ.get(IMAGE_VERSION_ENV)
    if not version and image_file.is_file():
        version = image_file.read_text().strip()
    if not version and (repo / "image" / "VERSION").is_file():
        version = f"{(repo / 'image' / 'VERSION').read_text().strip()} (local checkout)"
    return {"git_commit": commit or None, "image_version": version or None}


def dataset_record(data_uri: str, endpoint_url: str | None) -> dict[str, str | None]:
    """The training data's URI and its index's checksum (what the model was trained on, exactly)."""
    if data_uri == "synthetic":
        return {"uri": data_uri, f"index_{checksum.WRITTEN}": None}
    try:
        index = open_store(data_uri, endpoint_url).get("index.json")
    except FileNotFoundError:
        return {"uri": data_uri, f"index_{checksum.WRITTEN}": None}
    return {"uri": data_uri, f"index_{checksum.WRITTEN}": checksum.of(index)[checksum.WRITTEN]}


def model_record(task: str, task_args: argparse.Namespace, model_info: dict, dataset: dict,
                 eval_metrics: dict | None, step: int, origin: dict) -> dict:
    """model.json without its weights entry (pure): everything but the tensors."""
    return {"format": FORMAT, "task": task, "task_args": jsonable(vars(task_args)),
            "model_info": jsonable(model_info), "dataset": dataset,
            "eval": eval_metrics, "step": step, **origin}


# ---- writing -----------------------------------------------------------------------------------
def tied_names(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Names whose tensor is an earlier name's tensor (tied weights): name -> the first name (pure)."""
    first: dict[tuple, str] = {}
    tied = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


def weights_bytes(state: dict[str, torch.Tensor]) -> tuple[bytes, dict[str, str]]:
    """The state as safetensors bytes (contiguous CPU copies, tied tensors once) and the tied names."""
    tied = tied_names(state)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k not in tied}
    return safetensors_save(tensors, metadata={"format": FORMAT}), tied


def check_writable(uri: str, endpoint_url: str | None) -> Store:
    """The export's store, or BadInput naming a destination that cannot be written."""
    store = open_store(uri, endpoint_url)
    try:
        store.check(create=True)
    except BadInput as e:
        raise BadInput(f"--export-dir {uri}: cannot be written: {e}") from None
    return store


def write_export(uri: str, state: dict[str, torch.Tensor], record: dict,
                 endpoint_url: str | None = None) -> dict:
    """Write the weights, then model.json (last). Returns the model.json written. BadInput when the
    destination cannot be written."""
    store = check_writable(uri, endpoint_url)
    data, tied = weights_bytes(state)
    full = {**record, "weights": {"name": WEIGHTS, **checksum.of(data), "bytes": len(data)}, "tied": tied}
    try:
        store.delete(MODEL_JSON)  # a previous export's model.json must not vouch for the new weights
        store.put(WEIGHTS, data)
        store.put(MODEL_JSON, json.dumps(full, indent=1).encode())
    except OSError as e:
        raise BadInput(f"--export-dir {uri}: cannot be written: {e}") from None
    return full


# ---- reading -----------------------------------------------------------------------------------
def read_export(uri: str, endpoint_url: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """model.json and the state_dict (tied names restored) of the export at `uri`. BadInput when it is
    missing, not an export, or its weights fail their check."""
    store = open_store(uri, endpoint_url)
    try:
        record = json.loads(store.get(MODEL_JSON))
    except FileNotFoundError:
        raise BadInput(f"{uri}: no export there ({MODEL_JSON} missing)") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{uri}/{MODEL_JSON} is not valid JSON: {e}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise BadInput(f"{uri}/{MODEL_JSON}: not a {FORMAT} export")
    try:
        data = store.get(WEIGHTS)
    except FileNotFoundError:
        raise BadInput(f"{uri}/{WEIGHTS} missing") from None
    try:
        checksum.verify(record.get("weights", {}), data)
    except ValueError as why:
        raise BadInput(f"{uri}/{WEIGHTS} {why}") from None
    try:
        state = safetensors_load(data)
    except SafetensorError as e:
        raise BadInput(f"{uri}/{WEIGHTS} is not a safetensors file: {e}") from None
    for name, first in record.get("tied", {}).items():
        state[name] = state[first]
    return record, state


@dataclass
class Exported:
    """A loaded export: the model (eval mode, on `device`), its model.json and its task."""

    model: nn.Module
    record: dict
    task: Task

    def evaluate(self, eval_data: str, endpoint_url: str | None = None, batch_size: int = 64) -> dict:
        """The task's evaluation metrics over `eval_data`, as the trainer names them (eval_top1, ...)."""
        task = self.task
        task.ctx = _context(task.ctx.device, endpoint_url, batch_size)
        task.args.eval_data = eval_data
        task.prepare_eval()
        batches = task.eval_batches(0, 1)
        if batches is None:
            raise BadInput(f"task {self.record['task']} has no evaluation")
        sums: dict[str, float] = {}
        with torch.no_grad():
            for batch in batches:
                batch = _to(batch, task.ctx.device)
                for key, value in task.eval_sums(self.model, batch).items():
                    sums[key] = sums.get(key, 0.0) + float(value)
        return {f"eval_{k}": float(v) for k, v in task.eval_metrics(sums).items()}


def _context(device: torch.device, endpoint_url: str | None, batch_size: int) -> TaskContext:
    return TaskContext(data="synthetic", batch_size=batch_size, seed=0, steps=0, device=device,
                       s3_endpoint_url=endpoint_url, local_rank=0, local_size=1)


def _to(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def load_export(uri: str, endpoint_url: str | None = None, device: str | torch.device = "cpu") -> Exported:
    """The exported model, built by its task from model.json and loaded strictly, in eval mode."""
    record, state = read_export(uri, endpoint_url)
    task_cls = load_task(record["task"])
    device = torch.device(device)
    task = task_cls(argparse.Namespace(**record["task_args"]), _context(device, endpoint_url, 64))
    task.use_model_info(record["model_info"])
    model = task.build_model()
    model.load_state_dict(state, strict=True)
    return Exported(model=model.to(device).eval(), record=record, task=task)


# ---- after the fact: from a checkpoint ------------------------------------------------------------
CHECKPOINT_KEY = "export"  # the model.json record (without weights) the trainer saves in each checkpoint


def export_checkpoint(checkpoint_uri: str, export_uri: str, step: int | None = None,
                      endpoint_url: str | None = None) -> dict:
    """Export checkpoint `step` (None: the newest that verifies) of the checkpoints at `checkpoint_uri`.
    BadInput when there is none, it does not verify, or it predates exports (no model record)."""
    from train.checkpoint import store as ckpt

    store = open_store(checkpoint_uri, endpoint_url)
    store.check(create=False)
    checkpoints = ckpt.CheckpointStore(store, keep=1)
    if step is None:
        found = checkpoints.latest_valid()
        if found is None:
            raise BadInput(f"{checkpoint_uri}: no checkpoint that verifies")
    else:
        try:
            found = checkpoints.read(step)
        except ValueError as why:
            steps = checkpoints.valid_steps()
            raise BadInput(f"{checkpoint_uri}: checkpoint step {step} is not usable ({why}); "
                           f"steps there: {', '.join(map(str, steps)) or 'none'}") from None
    record = found.state.get(CHECKPOINT_KEY)
    if not isinstance(record, dict):
        raise BadInput(f"{checkpoint_uri}: checkpoint step {found.step} holds no model record (written "
                       "by a trainer from before exports); export from a newer run's checkpoint")
    return write_export(export_uri, found.state["model"], {**record, "step": found.step}, endpoint_url)
