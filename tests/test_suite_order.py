"""tests/conftest.py's LONGEST_FIRST names slow modules that exist: a renamed or deleted one would
silently drop out of the order the slow pass starts its longest modules in."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_in_the_longest_first_order_exists_and_is_slow():
    for path in LONGEST_FIRST:
        text = (ROOT / path).read_text()
        assert "pytest.mark.slow" in text, path
