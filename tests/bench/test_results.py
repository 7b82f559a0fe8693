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


def _measured(started: str) -> dict:
    return {"command": "scripts/bench --sections headline", "run_started_at": started, "started_at": started,
            "finished_at": started, "load_avg": [3.0, 2.0, 1.0], "load_avg_end": [4.0, 3.0, 2.0],
            "cpu_model": "Test CPU"}


def test_a_run_of_some_sections_keeps_the_others_with_the_run_that_measured_them(results):
    later = json.loads(json.dumps(results))
    later.update(started_at="2026-02-01T00:00:00+00:00", command="scripts/bench --sections headline")
    later["sections"] = {"headline": {**results["sections"]["headline"], "efficiency": {"remeasured": True},
                                      "measured": _measured("2026-02-01T00:00:00+00:00")},
                         "image_task": {"status": "failed", "reason": "x",
                                        "measured": _measured("2026-02-01T00:00:00+00:00")}}
    merged, kept = results_mod.merge(results, later)
    assert kept == ["peer_study", "recovery"]
    assert list(merged["sections"]) == ["peer_study", "headline", "recovery", "image_task"]
    assert merged["sections"]["headline"] == later["sections"]["headline"]
    assert merged["sections"]["image_task"] == later["sections"]["image_task"]
    # a kept section says which run measured it: the earlier document's, from its own header
    study = merged["sections"]["peer_study"]
    assert study["measured"]["command"] == "scripts/bench"
    assert study["measured"]["run_started_at"] == study["measured"]["started_at"] == results["started_at"]
    assert study["comparison"] == results["sections"]["peer_study"]["comparison"]
    assert merged["command"] == later["command"] and merged["started_at"] == later["started_at"]
    results_mod.validate(merged)
    # and the run after that keeps it as it is
    again, _ = results_mod.merge(merged, {**later, "sections": {"recovery": results["sections"]["recovery"]}})
    assert again["sections"]["peer_study"]["measured"] == study["measured"]


def test_a_quick_run_and_a_full_one_are_never_merged(results):
    quick = {**results, "quick": True, "sections": {"recovery": results["sections"]["recovery"]}}
    assert results_mod.merge(results, quick) == (quick, [])
    assert results_mod.merge(None, quick) == (quick, [])


def test_a_partial_run_of_the_cli_loses_no_other_sections_figures(tmp_path, monkeypatch, capsys):
    from bench import __main__ as cli

    calls = {"a": 0}

    def section_a(plan, progress):
        calls["a"] += 1
        return {"status": "ok", "value": calls["a"]}

    monkeypatch.setattr(cli, "SECTIONS", {"a": section_a,
                                          "b": lambda plan, progress: {"status": "ok", "b": 1}})
    assert cli.main(["--sections", "a,b", "--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "latest.json").read_text())
    assert cli.main(["--sections", "a", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["sections"]["a"]["value"] == 2 and doc["sections"]["b"] == first["sections"]["b"]
    assert doc["sections"]["b"]["measured"]["command"] == f"python -m bench --sections a,b --out {tmp_path}"
    assert doc["sections"]["a"]["measured"]["command"].endswith("--sections a --out " + str(tmp_path))
    # an unreadable results file is replaced, and the run says so
    (tmp_path / "latest.json").write_text("{")
    assert cli.main(["--sections", "a", "--out", str(tmp_path)]) == 0
    assert list(json.loads((tmp_path / "latest.json").read_text())["sections"]) == ["a"]
    assert "latest.json: not a results file" in capsys.readouterr().err
