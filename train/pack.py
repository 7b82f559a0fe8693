"""Packing images into shards: `python -m train.data pack images ...` (the data the tests and examples
pack: scikit-learn's handwritten digits, written as an image folder by `python -m cluster.example_data
digits`). Text goes to token shards instead: `pack tokens` (train/pack_tokens.py).

    python -m train.data pack images --src DIR --out URI   class-per-folder images -> image shards

Samples are shuffled (from --seed) before they are cut into shards, so every shard mixes classes;
--eval-out with --eval-fraction sets a random share aside as a separate dataset.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from train import shards
from train.errors import BadInput


def image_folder(src: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes (sorted sub-folder names) and (file, class index) for every image under them."""
    from train.tasks.image import IMAGE_EXTS

    if not src.is_dir():
        raise BadInput(f"--src {src}: not a directory (expected one sub-folder of images per class)")
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    files = [(f, c) for c, name in enumerate(classes) for f in sorted((src / name).iterdir())
             if f.suffix.lower().lstrip(".") in IMAGE_EXTS]
    if len(classes) < 2 or not files:
        raise BadInput(f"--src {src}: found {len(classes)} class folders and {len(files)} images "
                       f"({', '.join(IMAGE_EXTS)}); need at least 2 classes with images")
    return classes, files


def undecodable(files: list[Path], threads: int = 4) -> list[tuple[Path, str]]:
    """The files PIL cannot decode, with why: each is decoded in full (a JPEG at 1/8 scale through
    PIL's draft mode, which still reads every coded block, so a truncated file fails), on threads
    (PIL's decoders release the GIL). Packed, such a file would fail training later, far from here."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    def why(path: Path) -> str | None:
        try:
            with Image.open(path) as img:
                img.draft("RGB", (max(img.size[0] // 8, 1), max(img.size[1] // 8, 1)))
                img.convert("RGB").load()
        except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
            return f"{type(e).__name__}: {e}"
        return None

    with ThreadPoolExecutor(threads) as pool:
        return [(f, w) for f, w in zip(files, pool.map(why, files), strict=True) if w is not None]


def _split(n: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng([seed, 0x9ACC]).permutation(n)
    n_eval = int(round(n * eval_fraction))
    return order[n_eval:], order[:n_eval]


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _write(uri, samples: list, make, meta, samples_per_shard, endpoint_url, bar) -> dict:
    per_shard = (list(map(make, chunk)) for chunk in _chunks(samples, samples_per_shard))
    return shards.write_dataset(uri, per_shard, meta, endpoint_url, progress=bar.update)


def pack(kind: str, src: list[str], out: str, eval_out: str | None, eval_fraction: float,
         samples_per_shard: int, seed: int, endpoint_url: str | None) -> list[dict]:
    from tqdm import tqdm

    if samples_per_shard < 1:
        raise BadInput(f"--samples-per-shard {samples_per_shard}: must be >= 1")
    if not 0 <= eval_fraction < 1 or (eval_fraction > 0) != (eval_out is not None):
        raise BadInput(f"--eval-fraction {eval_fraction} with --eval-out {eval_out}: give both (fraction in "
                       "(0, 1)) or neither")
    if len(src) != 1:
        raise BadInput(f"--src: one image folder (class-per-folder), got {len(src)}")
    classes, files = image_folder(Path(src[0]))
    bad = undecodable([f for f, _ in files])
    if bad:
        listed = "; ".join(f"{f} ({w})" for f, w in bad[:10])
        more = f"; and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise BadInput(f"--src {src[0]}: {len(bad)} of {len(files)} images cannot be decoded, nothing "
                       f"was written (remove or fix them): {listed}{more}")
    meta = {"kind": "image", "classes": classes}
    n = len(files)

    def make(i: int) -> dict:
        path, label = files[i]
        ext = path.suffix.lower().lstrip(".")
        return {"__key__": f"{i:08d}", ext: path.read_bytes(), "cls": str(label).encode()}
    train_idx, eval_idx = _split(n, eval_fraction, seed)
    written = []
    with tqdm(total=n, unit="sample", desc=f"pack {kind}", file=sys.stderr, mininterval=0.5) as bar:
        for uri, idx in ((out, train_idx), (eval_out, eval_idx)):
            if uri is not None:
                written.append(_write(uri, idx.tolist(), make, meta, samples_per_shard, endpoint_url, bar))
    return written
