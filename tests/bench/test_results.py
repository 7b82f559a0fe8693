"""The results file's JSON schema and its atomic write."""

import json

import jsonschema
import pytest

from bench import results as results_mod


def test_a_complete_document_validates_and_is_written_atomically(results, tmp_path):
    path = results_mod.write(results, tmp_path)
    assert path == tmp_path / "latest.json"
    assert json.loads(path.read_text()) == results
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]  # no temporary left behind


@pytest.mark.parametrize("breaks", [
    lambda r: r.pop("machine"),
    lambda r: r["machine"].pop("cores"),
    lambda r: r["versions"].pop("horovod"),
    lambda r: r.update(schema_version=99),
    lambda r: r.update(name="../escape"),
    lambda r: r["sections"]["recovery"].pop("reason"),             # a failure must say why
    lambda r: r["sections"]["recovery"].update(status="great"),
    lambda r: r["sections"]["peer_study"]["comparison"]["contenders"]["ddp"].update(samples=[]),
    lambda r: r["sections"]["peer_study"]["comparison"]["ratios"]["hvd"].pop("median"),
])
def test_incomplete_documents_are_refused_and_not_written(results, tmp_path, breaks):
    breaks(results)
    with pytest.raises(jsonschema.ValidationError):
        results_mod.write(results, tmp_path)
    assert list(tmp_path.iterdir()) == []


def _stall_with_raw_samples(results):
    durations = [[[step, 0.0005 + step * 1e-7] for step in range(1, 2001)] for _ in range(3)]
    results["sections"]["checkpoint_stall"] = {"status": "ok", "sizes": [
        {"width": 256, "step_durations_s": durations, "lost_interval_s": [0.0008, 0.0014], "env": {},
         "note": None}]}
    return durations


def test_the_committed_file_is_the_summary_without_the_raw_samples(results, tmp_path):
    _stall_with_raw_samples(results)
    path = results_mod.write(results, tmp_path)
    summary = json.loads(path.read_text())
    assert summary["sections"]["checkpoint_stall"]["sizes"] == [
        {"width": 256, "lost_interval_s": [0.0008, 0.0014], "env": {}, "note": None}]
    assert summary == results_mod.summary(results) and summary != results
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]  # no raw file unless asked for
    assert len(path.read_text()) < 10_000


def test_raw_samples_on_request_are_written_one_list_a_line_and_the_rest_one_key_a_line(results, tmp_path):
    durations = _stall_with_raw_samples(results)
    path = results_mod.write(results, tmp_path, raw=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "latest.raw.json"]
    raw = results_mod.raw_path(path)
    text = raw.read_text()
    assert json.loads(text) == results
    lines = text.splitlines()
    assert '     "width": 256,' in lines and '     "env": {},' in lines  # one key a line, indented by depth
    assert '     "lost_interval_s": [0.0008, 0.0014],' in lines
    runs = [ln.strip().rstrip(",") for ln in lines if ln.strip().startswith("[[1, ")]
    assert [json.loads(r) for r in runs] == durations  # each run's 2000 pairs on one line
    assert len(text) < len(json.dumps(results, indent=1)) / 2


def test_the_committed_results_are_summaries_and_valid():
    for path in sorted(results_mod.RESULTS_DIR.glob("*.json")):
        if path.name.endswith(".raw.json"):
            continue
        doc = json.loads(path.read_text())
        if "schema_version" in doc:  # plan_time.json is bench/plan_time.py's own record
            results_mod.validate(doc)
            assert doc == results_mod.summary(doc), f"{path} holds raw samples"
        assert path.stat().st_size < 200_000, f"{path}: {path.stat().st_size} bytes"
