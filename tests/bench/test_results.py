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


def test_raw_samples_are_written_one_list_a_line_and_the_rest_one_key_a_line(results, tmp_path):
    durations = [[[step, 0.0005 + step * 1e-7] for step in range(1, 2001)] for _ in range(3)]
    results["sections"]["checkpoint_stall"] = {"status": "ok", "sizes": [
        {"width": 256, "step_durations_s": durations, "lost_interval_s": [0.0008, 0.0014], "env": {},
         "note": None}]}
    text = results_mod.write(results, tmp_path).read_text()
    assert json.loads(text) == results
    lines = text.splitlines()
    assert '     "width": 256,' in lines and '     "env": {},' in lines  # one key a line, indented by depth
    assert '     "lost_interval_s": [0.0008, 0.0014],' in lines
    runs = [ln.strip().rstrip(",") for ln in lines if ln.strip().startswith("[[1, ")]
    assert [json.loads(r) for r in runs] == durations  # each run's 2000 pairs on one line
    assert len(text) < len(json.dumps(results, indent=1)) / 2
