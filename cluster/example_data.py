"""Real data to try the built-in tasks on, which nobody here wrote and nothing downloads:

    python -m cluster.example_data digits --out DIR   scikit-learn's 1797 handwritten digits (8x8 grayscale,
                                                      shipped inside the package) as DIR/<class>/<n>.png
    python -m cluster.example_data stdlib             the path of this Python's standard library source,
                                                      a text corpus of several MB
    python -m cluster.example_data stdlib-parquet --out DIR [--packages json email ...]
                                                      that source as Parquet, one row per file (columns
                                                      `path` and `text`), for `pack tokens --src DIR`

Then `python -m train.data pack images|tokens ...` packs them into shards. This lives beside the cluster
tooling, not in train/: scikit-learn is needed where the data is prepared, not in the trainer's image.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path


def write_digits(out: Path) -> int:
    """sklearn.datasets.load_digits() as 8-bit grayscale PNGs, one folder per class."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = out / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image * (255 / 16)).round().astype(np.uint8)  # its pixels are 0..16
        Image.fromarray(pixels).save(folder / f"{i:05d}.png")
    return len(digits.images)


def stdlib_source() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


SKIPPED = ("site-packages", "test", "idlelib")  # not the library: installed packages, its tests, IDLE


def write_stdlib_parquet(out: Path, packages: list[str] | None = None, rows_per_group: int = 64) -> int:
    """The standard library's .py files (all, or those of `packages`) as DIR/stdlib-NNNNN.parquet, one
    file per package (or one for the library's top level), one row per source file, sorted by path.
    Returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = stdlib_source()
    groups = {name: sorted((root / name).rglob("*.py")) for name in packages} if packages else {
        "toplevel": sorted(root.glob("*.py")),
        **{d.name: sorted(d.rglob("*.py")) for d in sorted(root.iterdir())
           if d.is_dir() and d.name not in SKIPPED and not d.name.startswith(".")}}
    out.mkdir(parents=True, exist_ok=True)
    rows = 0
    for i, files in enumerate(groups.values()):
        if not files:
            continue
        texts = [f.read_bytes().decode("utf-8", errors="replace") for f in files]
        table = pa.table({"path": [str(f.relative_to(root)) for f in files], "text": texts})
        pq.write_table(table, out / f"stdlib-{i:05d}.parquet", row_group_size=rows_per_group)
        rows += len(files)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cluster.example_data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("digits", help="scikit-learn's handwritten digits as a class-per-folder PNG tree")
    d.add_argument("--out", required=True, help="a local directory")
    sub.add_parser("stdlib", help="print the standard library's source directory")
    q = sub.add_parser("stdlib-parquet", help="the standard library's source as Parquet (path, text)")
    q.add_argument("--out", required=True, help="a local directory")
    q.add_argument("--packages", nargs="*", default=None, help="only these packages (default: all)")
    a = p.parse_args(argv)
    if a.cmd == "digits":
        print(f"wrote {write_digits(Path(a.out))} images to {a.out}")
    elif a.cmd == "stdlib-parquet":
        print(f"wrote {write_stdlib_parquet(Path(a.out), a.packages)} source files as Parquet to {a.out}")
    else:
        print(stdlib_source())
    return 0


if __name__ == "__main__":
    sys.exit(main())
