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
