"""The repository stands alone: its code and tests read nothing beside it, and the facts its comments
cite (`docs/field-notes.md §N`) are in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIELD_NOTES = REPO_ROOT / "docs" / "field-notes.md"
CITATION = re.compile(r"docs/field-notes\.md ((?:§\d+(?:[/,] ?)?)+)")
# Ways a file reaches outside the checkout for reference material: a sibling `shared/` folder.
OUTSIDE = re.compile(r"\.\./shared\b|parents?(\[\d\])?\s*/\s*[\"']shared[\"']|/work/shared\b|FIELD_NOTES\.md")


def _tracked_text_files() -> list[tuple[Path, str]]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    out = []
    for name in filter(None, names):
        path = REPO_ROOT / name
        if path.is_file() and path.suffix not in {".json", ".png", ".gz"}:
            try:
                out.append((path, path.read_text()))
            except UnicodeDecodeError:
                continue
    return out


def cited_sections(text: str) -> set[int]:
    return {int(n) for group in CITATION.findall(text) for n in re.findall(r"§(\d+)", group)}


def note_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", FIELD_NOTES.read_text(), flags=re.M)}


def test_citation_parsing():
    assert cited_sections("Shape (docs/field-notes.md §1, §5, §6): x; facts match docs/field-notes.md\n§9") \
        == {1, 5, 6}
    assert cited_sections("match docs/field-notes.md §1/§4.") == {1, 4}


def test_every_cited_field_note_section_is_in_the_repository():
    assert {1, 2, 7} <= note_sections(), "test premise: the notes' sections are found"
    cited: dict[int, list[str]] = {}
    for path, text in _tracked_text_files():
        for n in cited_sections(text):
            cited.setdefault(n, []).append(str(path.relative_to(REPO_ROOT)))
    assert len(cited) >= 5, "test premise: the code cites the notes"
    missing = {n: files for n, files in cited.items() if n not in note_sections()}
    assert missing == {}, f"sections cited but absent from docs/field-notes.md: {missing}"


def test_nothing_reads_reference_material_from_outside_the_checkout():
    this = Path(__file__).resolve()
    found = [f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for path, text in _tracked_text_files() if path not in (this, FIELD_NOTES)
             for m in OUTSIDE.finditer(text)]
    assert found == []


def test_the_outside_pattern_sees_the_old_forms():
    for old in ('REPO_ROOT.parent / "shared" / "FIELD_NOTES.md"', "(../shared/FIELD_NOTES.md §1)",
                "root.parents[1] / 'shared'"):
        assert OUTSIDE.search(old), old
