"""bench.checkpoint_throughput: both sides move the same bytes through the same store."""

from __future__ import annotations

import json

from bench import checkpoint_throughput


def test_a_small_row_measures_both_sides_of_the_same_bytes(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert checkpoint_throughput.main(["--sizes-mb", "6", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["size_mb"] == 6 and 6_000_000 < row["bytes"] < 6_100_000
    for key in ("write_mb_s", "bare_write_mb_s", "restore_mb_s", "bare_restore_mb_s", "write_ratio",
                "restore_ratio"):
        assert row[key] > 0, (key, row)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == row
