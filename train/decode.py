"""Decoding and augmenting the image task's samples into uint8 tensors, chosen by `--decode`.

    pil          Pillow: every format the packer takes (PNG, JPEG, WebP, BMP).
    simplejpeg   libjpeg-turbo through simplejpeg for JPEG (Pillow for the rest).
    torchvision  torchvision.io.decode_image on the CPU (libjpeg-turbo/libpng in torchvision's own
                 image extension; it does not load next to torch's CPU build, see train/tasks/vision.py:
                 refused there with one message).
    nvjpeg       on the GPU, in the training process: torchvision.io.decode_jpeg(device="cuda")
                 decodes a whole batch with nvJPEG, then the crop and resize run on the GPU. Loader
                 workers only read, verify and unpack the shards and draw each sample's crop from its
                 JPEG header. Refused on a machine without CUDA.

The default (`auto`) is the fastest CPU decoder measured on photo-like JPEGs (docs/DATA.md, "Decoding":
simplejpeg), falling back to Pillow where simplejpeg is not installed.

Every decoder yields the same thing: a uint8 [3, size, size] tensor per sample, cropped, resized and
flipped with the draws of `crop_params` (a function of the sample's seed), so the choice changes speed
and the resampling's last bits, not the augmentation. Conversion to float and normalisation run on the
device (train/tasks/image.py `normalize`).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch

from train.errors import BadInput
from train.tasks.vision import import_torchvision

# Imported here, not where used: the loader workers' forkserver preloads this module (train/tasks/
# image.py), so each worker it forks starts with torchvision imported (seconds each, otherwise).
import_torchvision()
from torchvision.io import ImageReadMode, decode_image, decode_jpeg  # noqa: E402
from torchvision.transforms.v2 import functional as TF  # noqa: E402

DECODERS = ("auto", "pil", "simplejpeg", "torchvision", "nvjpeg")
CPU_DECODERS = ("pil", "simplejpeg", "torchvision")
# RandomResizedCrop's defaults (torchvision.transforms.RandomResizedCrop; Szegedy et al. 2015, "Going
# deeper with convolutions", the Inception crop), as torchvision's ImageNet reference recipe and
# NVIDIA DLE's ResNet-50 v1.5 use them: area (0.08, 1) of the image, aspect ratio (3/4, 4/3).
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
# Evaluation: resize the short side to size / 0.875, centre crop (torchvision's reference; DLE's too).
EVAL_CROP_FRACTION = 0.875


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.size


@dataclass(frozen=True)
class Crop:
    """Where to cut a sample and whether to mirror it: the region (top, left, height, width) of the
    decoded image that is resized to size x size."""

    top: int
    left: int
    height: int
    width: int
    flip: bool

    def as_list(self) -> list[int]:
        return [self.top, self.left, self.height, self.width, int(self.flip)]


def crop_params(width: int, height: int, seed: int, train: bool, augment: str, size: int) -> Crop:
    """The sample's crop, drawn as torchvision's RandomResizedCrop.get_params draws it (10 tries at a
    uniform area share and log-uniform aspect ratio, else the centre at the nearest allowed ratio) from
    a generator seeded by the sample's seed,
    and a flip with probability 1/2; or, without augmentation, the evaluation's centre crop."""
    if not (train and augment == "standard"):
        # resizing the short side to size / 0.875 and cutting size x size from the centre is resizing
        # the centred square of side short x 0.875 to size x size
        side = max(1, round(min(width, height) * EVAL_CROP_FRACTION))
        return Crop((height - side) // 2, (width - side) // 2, side, side, False)
    g = torch.Generator().manual_seed(seed)
    area = width * height
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    draws = torch.rand(10, 3, generator=g).tolist()
    crop = None
    for u_area, u_ratio, _ in draws:
        target = area * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * u_area)
        ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u_ratio)
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            crop = (h, w)
            break
    positions = torch.rand(3, generator=g).tolist()
    if crop is None:  # the fallback: the centre, at the ratio nearest the allowed range
        in_ratio = width / height
        if in_ratio < CROP_RATIO[0]:
            w, h = width, int(round(width / CROP_RATIO[0]))
        elif in_ratio > CROP_RATIO[1]:
            h, w = height, int(round(height * CROP_RATIO[1]))
        else:
            w, h = width, height
        return Crop((height - h) // 2, (width - w) // 2, h, w, positions[2] < 0.5)
    h, w = crop
    top = int(positions[0] * (height - h + 1))
    left = int(positions[1] * (width - w + 1))
    return Crop(top, left, h, w, positions[2] < 0.5)


def resolve(decode: str, cuda: bool) -> str:
    """The decoder `--decode` names on this machine; raises BadInput for one that cannot run here."""
    if decode == "auto":
        return "simplejpeg" if _has_simplejpeg() else "pil"
    if decode == "nvjpeg" and not cuda:
        raise BadInput("--decode nvjpeg decodes on the GPU (torchvision.io.decode_jpeg on CUDA): this "
                       "machine has no CUDA device; use --decode auto, pil, simplejpeg or torchvision")
    if decode == "simplejpeg" and not _has_simplejpeg():
        raise BadInput("--decode simplejpeg: the simplejpeg package is not installed here; use --decode "
                       "auto or pil")
    if decode == "torchvision":
        why = _torchvision_image_ops_problem()
        if why:
            raise BadInput(f"--decode torchvision: torchvision's image extension does not load here "
                           f"({why}); use --decode auto, pil or simplejpeg")
    return decode


def _has_simplejpeg() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def _torchvision_image_ops_problem() -> str | None:
    try:
        decode_jpeg(torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8))
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


def _tiny_jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "JPEG")
    return buf.getvalue()


def decode_rgb(data: bytes, decoder: str) -> torch.Tensor:
    """The whole image as uint8 [3, H, W] (RGB)."""
    if decoder == "simplejpeg" and _is_jpeg(data):
        import simplejpeg

        return torch.from_numpy(simplejpeg.decode_jpeg(data, colorspace="RGB")).permute(2, 0, 1)
    if decoder == "torchvision":
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)


def cut(image: torch.Tensor, crop: Crop, size: int) -> torch.Tensor:
    """The crop of a uint8 [3, H, W] image (CPU or GPU), resized to [3, size, size] (bilinear with
    antialiasing, as torchvision's v2 transforms) and mirrored when the crop says so."""
    out = TF.resized_crop(image, crop.top, crop.left, crop.height, crop.width, [size, size], antialias=True)
    return out.flip(-1) if crop.flip else out


def sample_tensor(data: bytes, seed: int, decoder: str, train: bool, augment: str, size: int) -> torch.Tensor:
    """One sample decoded, cropped, resized and maybe flipped: uint8 [3, size, size]."""
    image = decode_rgb(data, decoder)
    c = crop_params(image.shape[2], image.shape[1], seed, train, augment, size)
    return cut(image, c, size).contiguous()


def gpu_batch(datas: list[torch.Tensor], crops: torch.Tensor, size: int,
              device: torch.device) -> torch.Tensor:
    """--decode nvjpeg, in the training process: a batch of JPEG byte tensors decoded on the GPU with
    nvJPEG (torchvision.io.decode_jpeg with device="cuda" decodes a list as one batched call), each cut
    by its crop row (top, left, height, width, flip) on the GPU: uint8 [B, 3, size, size] there."""
    images = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    rows = crops.tolist()
    cuts = [cut(img, Crop(*row[:4], bool(row[4])), size) for img, row in zip(images, rows, strict=True)]
    return torch.stack(cuts)


