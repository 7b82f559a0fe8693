"""The S3 layout (infra/storage_layout.py): the buckets and keys every side uses, defined once."""

from __future__ import annotations

import ast
from pathlib import Path

from infra.storage_layout import (
    bucket_names,
    checkpoint_key_prefix,
    checkpoint_uri,
    dataset_key_prefix,
    dataset_uri,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LAYOUT = REPO_ROOT / "infra" / "storage_layout.py"


def test_the_layout():
    assert bucket_names("rt") == ("rt-datasets", "rt-checkpoints")
    assert bucket_names("rt").checkpoints == "rt-checkpoints"
    assert dataset_key_prefix("cifar") == "datasets/cifar/"
    assert checkpoint_key_prefix("job-1") == "checkpoints/job-1/"
    assert dataset_uri("rt-datasets", "cifar") == "s3://rt-datasets/datasets/cifar"
    assert checkpoint_uri("rt-checkpoints", "job-1") == "s3://rt-checkpoints/checkpoints/job-1"


def test_no_code_builds_a_layout_key_by_hand():
    """Every f-string that puts a name under datasets/ or checkpoints/ is in infra/storage_layout.py;
    elsewhere code calls it (five places built these keys before)."""
    found = []
    for top in ("infra", "cluster", "train", "bench", "scripts"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if path == LAYOUT:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.JoinedStr):
                    continue
                for text, then in zip(node.values, node.values[1:], strict=False):
                    if (isinstance(text, ast.Constant) and isinstance(then, ast.FormattedValue)
                            and text.value.endswith(("datasets/", "checkpoints/"))):
                        found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert found == []
