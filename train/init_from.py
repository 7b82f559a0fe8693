"""`--init-from URI`: start training from weights instead of from scratch.

The URI names a safetensors file, a torch state_dict file (torch.save of a dict of tensors, e.g.
torchvision's ResNet-50 weights, or a dict holding one under "state_dict" or "model", as a
ringtrain checkpoint's state.pt does), or an export (a directory or prefix with model.json:
train.export), on S3 or on disk.

Strict by default: every key of the model must be there with its shape, and nothing else. With
`--init-partial`, what fits is loaded and the missing, unexpected and mismatched keys are reported
(a new classifier head: torchvision's 1000-class fc against a 10-class one). A resume from a
checkpoint wins over --init-from (the trainer applies the checkpoint after it), and the run's
summary says which applied.

torch.load runs with weights_only=True: a file from elsewhere must not be able to run code
(https://pytorch.org/docs/stable/generated/torch.load.html).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from torch import nn

from train import export
from train.errors import BadInput
from train.storage import open_store

FLAG = "--init-from"


def _split(uri: str) -> tuple[str, str]:
    """(the store's root, the object's key) of a file URI."""
    path = PurePosixPath(uri.removeprefix("s3://")) if uri.startswith("s3://") else PurePosixPath(uri)
    parent = str(path.parent)
    return (f"s3://{parent}" if uri.startswith("s3://") else parent), path.name


def read_weights(uri: str, endpoint_url: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors named by `uri` (see the module docstring). BadInput for a missing file or one that is
    neither safetensors nor a state_dict."""
    store = open_store(uri.rstrip("/"), endpoint_url)
    try:
        store.get(export.MODEL_JSON)
        return export.read_export(uri.rstrip("/"), endpoint_url)[1]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass  # not an export directory: a file
    root, key = _split(uri)
    try:
        data = open_store(root, endpoint_url).get(key)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise BadInput(f"{FLAG} {uri}: no such weights file (give a safetensors file, a torch state_dict "
                       "file or an export's directory)") from None
    return parse_weights(data, uri)


def parse_weights(data: bytes, uri: str) -> dict[str, torch.Tensor]:
    """safetensors bytes, or torch.save bytes of a state_dict (or {"state_dict"|"model": state_dict})."""
    try:
        return safetensors_load(data)
    except (SafetensorError, ValueError, OSError):
        pass
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unpickling failure means: not a state_dict we can read
        obj = None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if (not isinstance(obj, dict) or not obj
            or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())):
        raise BadInput(f"{FLAG} {uri}: neither a safetensors file nor a torch state_dict (a dict of "
                       "tensors saved with torch.save)")
    return obj


@dataclass
class InitReport:
    """What --init-from loaded into the model."""

    uri: str
    loaded: int
    missing: list[str] = field(default_factory=list)      # the model's keys the file lacks
    unexpected: list[str] = field(default_factory=list)   # the file's keys the model lacks
    mismatched: list[str] = field(default_factory=list)   # both have, shapes differ (partial: skipped)

    def record(self) -> dict:
        return {"uri": self.uri, "loaded": self.loaded, "missing": self.missing,
                "unexpected": self.unexpected, "mismatched": self.mismatched}


def apply_weights(model: nn.Module, weights: dict[str, torch.Tensor], uri: str,
                  partial: bool = False) -> InitReport:
    """Copy `weights` into `model`. Strict: BadInput naming the first mismatching, missing or
    unexpected key. Partial: load what fits, report the rest."""
    own = model.state_dict()
    tied = export.tied_names(own)  # a tied name is loaded with the tensor it shares
    wanted = [k for k in own if k not in tied]
    mismatched = [k for k in wanted if k in weights and tuple(weights[k].shape) != tuple(own[k].shape)]
    missing = [k for k in wanted if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if not partial:
        if mismatched:
            k = mismatched[0]
            raise BadInput(f"{FLAG} {uri}: {k} has shape {list(weights[k].shape)}, the model's is "
                           f"{list(own[k].shape)} ({len(mismatched)} key(s) differ; --init-partial loads "
                           "what fits)")
        if missing or unexpected:
            what = (f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}")
            raise BadInput(f"{FLAG} {uri}: {what} ({len(missing)} missing, {len(unexpected)} unexpected "
                           "key(s); --init-partial loads what fits)")
    fits = {k: weights[k] for k in wanted if k in weights and k not in mismatched}
    model.load_state_dict(fits, strict=False)
    return InitReport(uri=uri, loaded=len(fits), missing=missing, unexpected=unexpected,
                      mismatched=mismatched)


def init_from(model: nn.Module, uri: str, endpoint_url: str | None = None,
              partial: bool = False) -> InitReport:
    return apply_weights(model, read_weights(uri, endpoint_url), uri, partial)
