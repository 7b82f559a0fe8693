"""The lm task in the trainer, one worker: AdamW with the task's decay groups, bf16, gradient
accumulation, activation checkpointing, tokens/s and held-out perplexity; a corrupt token shard."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.train.proc import run, train_cmd
from train import pack_tokens, tokenizer
from train.summary import parse_summary

WORDS = ("def", "return", "self", "import", "class", "for", "in", "if", "else", "print")


@pytest.fixture(scope="module")
def token_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, 200)) for _ in range(60)]
    (root / "corpus").mkdir()
    pq.write_table(pa.table({"text": docs}), root / "corpus" / "a.parquet", row_group_size=20)
    (root / "tokenizer.json").write_text(tokenizer.train_bpe(docs, 300).to_str())
    pack_tokens.pack_tokens([str(root / "corpus")], str(root / "train"), str(root / "tokenizer.json"),
                            eval_out=str(root / "eval"), eval_fraction=0.2, memory_mb=8, shard_mb=0.01,
                            block_tokens=256)
    return root


def test_the_trainer_takes_the_tasks_decay_groups_and_counts_tokens(token_data, tmp_path):
    metrics = tmp_path / "m.jsonl"
    args = ["--task", "lm", "--data", str(token_data / "train"), "--eval-data", str(token_data / "eval"),
            "--layers", "1", "--heads", "2", "--dim", "16", "--seq-len", "32", "--batch-size", "4",
            "--optimizer", "adamw", "--weight-decay", "0.1", "--lr", "0.003", "--precision", "bf16",
            "--backward-passes-per-step", "2", "--activation-checkpointing", "--steps", "6",
            "--log-every", "3", "--metrics-file", str(metrics), "--no-progress", "--cpu-affinity", "off"]
    script = textwrap.dedent(f"""
        import horovod.torch as hvd, sys
        from train.config import parse_args
        from train.stop import StopRequest
        from train.trainer import Progress, Trainer
        hvd.init()
        trainer = Trainer(parse_args({args!r}), hvd, StopRequest())
        trainer.prepare_inputs()
        trainer.build()
        opt = trainer.optimizer
        print("OPTIMIZER", type(opt).__mro__[1].__name__,
              [(g["weight_decay"], len(g["params"])) for g in opt.param_groups], flush=True)
        sys.exit(trainer.loop(Progress()).exit_code)
    """)
    r = run([sys.executable, "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("OPTIMIZER"))
    # 1 block: the embeddings and 4 linear weights decay; 2 LayerNorms x 2, the final one x 2 and
    # 4 biases do not; the trainer's own stats "parameter" last
    assert line == "OPTIMIZER AdamW [(0.1, 6), (0.0, 10), (0.0, 1)]", line
    s = parse_summary(r.stdout)
    assert s.steps == 6 and s.eval["eval_perplexity"] > 1 and s.eval["eval_tokens"] > 0
    assert s.throughput["tokens_per_sec"] == pytest.approx(s.samples_per_sec * 32)
    assert "mfu" not in s.throughput  # a CPU: no peak to set it against
    records = [json.loads(ln) for ln in metrics.read_text().splitlines() if '"loss"' in ln]
    assert [r["step"] for r in records] == [3, 6]
    assert all(r["tokens_per_sec"] == pytest.approx(r["samples_per_sec"] * 32) for r in records)


def test_a_token_shard_that_fails_its_checksum_is_one_line_and_exit_2(token_data, tmp_path):
    import shutil

    data = tmp_path / "train"
    shutil.copytree(token_data / "train", data)
    shard = data / "tokens-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[7] ^= 0xFF
    shard.write_bytes(bytes(raw))
    r = run(train_cmd("--task", "lm", "--data", str(data), "--layers", "1", "--heads", "1", "--dim", "8",
                      "--seq-len", "16", "--batch-size", "2", "--steps", "30", "--cpu-affinity", "off"),
            timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "shard tokens-00000.bin block 0" in lines[0], r.stderr[-3000:]
    assert "fails its xxh3_128 check" in lines[0]
