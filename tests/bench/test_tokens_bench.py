"""`python -m bench.tokens` (issue 36's rows): choosing rows, keeping the rows not run, and a quick
run of the trainer-against-bare-loop row."""

from __future__ import annotations

import json

import pytest

from bench.tokens import QUICK, main, merge_rows


def test_a_run_of_some_rows_keeps_the_others_from_the_file_and_drops_the_rest():
    previous = {"started": "old top-level field", "token_pipeline": {"old": 1}, "packing": {"old": 2}}
    merged = merge_rows(previous, {"trainer_vs_bare": {"new": 3}, "packing": {"new": 4}})
    assert merged == {"token_pipeline": {"old": 1}, "packing": {"new": 4}, "trainer_vs_bare": {"new": 3}}


@pytest.mark.parametrize("argv, message", [(["--rows", "trainer"], "rows are a comma-separated list of"),
                                           (["--rows", ","], "rows are a comma-separated list of"),
                                           (["--repeats", "0"], "--repeats 0: must be >= 1")])
def test_bad_arguments_exit_2_naming_what_is_allowed(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [("{not json", "cannot read the results already there"),
                                              ("[1, 2]", "holds list, not this bench's results")])
def test_an_unreadable_results_file_is_refused_before_anything_runs(content, message, tmp_path, capsys):
    out = tmp_path / "tokens.json"
    out.write_text(content)
    with pytest.raises(SystemExit) as e:
        main(["--rows", "trainer_vs_bare", "--quick", "--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert out.read_text() == content


@pytest.mark.slow
def test_quick_trainer_vs_bare_row_writes_its_comparison(tmp_path, capsys):
    """Smoke: the trainer and the bare loop train the quick GPT once each; checks the document, not
    the speed."""
    out = tmp_path / "tokens.json"
    out.write_text(json.dumps({"packing": {"kept": True}}))
    assert main(["--rows", "trainer_vs_bare", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["packing"] == {"kept": True}
    row = doc["trainer_vs_bare"]
    shape = QUICK.trainer_shape
    assert (row["metric"], row["baseline"], row["repeats"]) == ("tokens_per_s", "bare-hvd", 1)
    assert row["window"].startswith(f"steps {shape.warmup}..{shape.warmup + shape.steps} ")
    for name in ("trainer", "bare-hvd"):
        c = row["contenders"][name]
        assert c["config"]["seq_len"] == shape.seq_len and c["config"]["layers"] == shape.layers
        (run,) = c["runs"]
        assert (run["world_size"], run["steps"], run["batch_size"]) == (2, shape.steps, shape.batch_size)
        assert c["samples"] == [run["tokens_per_s"]] and run["tokens_per_s"] > 0
        assert run["tokens_per_s"] == pytest.approx(run["samples_per_sec"] * shape.seq_len)
    trainer, bare = (row["contenders"][n]["samples"][0] for n in ("trainer", "bare-hvd"))
    assert row["efficiency"]["per_repeat"] == [pytest.approx(trainer / bare)]
    assert row["efficiency"]["target"] == 0.97 and row["efficiency"]["interval"] is None  # one repeat
    assert row["measured"]["quick"] is True and row["measured"]["cpus"] >= 1
    assert "trainer_vs_bare: trainer / bare-hvd = " in capsys.readouterr().out


@pytest.mark.slow  # a moto server and seven runs, each a process of its own
def test_quick_token_pipeline_row_measures_both_read_modes_against_the_bare_range_loop(tmp_path, capsys):
    out = tmp_path / "tokens.json"
    assert main(["--rows", "token_pipeline", "--quick", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["token_pipeline"]
    assert row["baseline"] == row["s3"]["baseline"] == "bare_range"
    assert set(row["ratios"]) == {"stream", "stream_inline", "bare_memmap"}
    assert set(row["s3"]["ratios"]) == {"stream", "stream_inline"}   # no memmap of an S3 object
    for comparison in (row, row["s3"]):
        assert comparison["contenders"]["stream"]["config"] == {"readahead_blocks": 4}
        assert comparison["contenders"]["stream_inline"]["config"] == {"readahead_blocks": 0}
        assert comparison["shape"]["block_tokens"] == QUICK.pipeline_block_tokens
        assert all(s > 0 for c in comparison["contenders"].values() for s in c["samples"])
    assert row["s3"]["store"].startswith("local S3 server")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("token_pipeline: ") and "stream_inline / bare_range = " in lines[0]
    assert lines[1].startswith("token_pipeline on S3: stream / bare_range = ")


@pytest.mark.slow  # two `pack tokens` commands, each with its worker process
def test_quick_packing_row_measures_the_command_against_the_tokenizer_alone(tmp_path, capsys):
    out = tmp_path / "tokens.json"
    assert main(["--rows", "packing", "--quick", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["packing"]
    assert (row["baseline"], set(row["ratios"])) == ("tokenizer_alone", {"pack_tokens"})
    assert row["corpus"] == ["json"]
    assert row["text_mb"] > 0.01 and row["documents"] >= 5   # the json package's sources
    assert all(c["samples"][0] > 0 for c in row["contenders"].values())
    # the rate of one more pass (twice over less once) above the single command's, fixed costs and all
    [run] = row["contenders"]["pack_tokens"]["runs"]
    assert run["mb_per_cpu_s"] > run["command_mb_per_cpu_s"] == row["one_command_mb_per_cpu_s"]
    assert "packing: pack_tokens / tokenizer_alone = " in capsys.readouterr().out
