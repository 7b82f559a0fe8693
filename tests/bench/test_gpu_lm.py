"""bench/gpu_lm.py, scripts/gpu-check's measurement of the lm task on a GPU: on this CPU machine its
code runs for real at a tiny size (a 1-block GPT, fp32) through the single-process Horovod stand-in; the
GPU figures come from a machine with a GPU."""

from __future__ import annotations

import torch

from bench import gpu_lm, gpu_step
from train import gpt, tokens


def test_the_bare_loop_and_the_trainers_step_run_on_token_shards(tmp_path):
    data = gpu_lm.token_shards(tmp_path, tokens=tokens.BLOCK_TOKENS + 1000, vocab=256)
    ds = tokens.open_dataset(data, None)
    assert (ds.index["vocab_size"], ds.index["dtype"], len(ds.blocks)) == (256, "uint16", 2)
    assert int(ds.read_block(1).max()) < 256   # the blocks verify against their checksums
    small = {"seq_len": 32, "batch": 2, "steps": 2, "warmup": 1, "precision": "fp32"}
    bare = gpu_lm.bare_loop(gpt.Shape(1, 2, 32), vocab=256, device=torch.device("cpu"), **small)
    trainer = gpu_lm.trainer_tokens_per_sec(data, preset=None, model_flags=("--layers", "1", "--heads", "2",
                                                                             "--dim", "32"),
                                            hvd=gpu_step.SingleProcessHorovod(), **small)
    for result in (bare, trainer):
        assert result["tokens_per_sec"] > 0 and result["median_step_ms"] > 0 and result["steps"] == 2
        assert "mfu" not in result   # no GPU, no peak
    assert trainer["data"].startswith("token shards") and trainer["precision"] == "fp32"


def test_measure_reports_each_run_against_the_bare_loop_of_the_same_compile_mode(monkeypatch):
    stand_in = gpu_step.SingleProcessHorovod()
    monkeypatch.setattr(gpu_step, "horovod_or_stand_in", lambda: (stand_in, "stand-in"))
    monkeypatch.setattr(gpu_lm, "token_shards", lambda workdir: str(workdir))
    monkeypatch.setattr(gpu_lm, "bare_loop", lambda compile_model: {
        "tokens_per_sec": 200.0 if compile_model else 100.0, "compile": compile_model})
    monkeypatch.setattr(gpu_lm, "trainer_tokens_per_sec", lambda data, compile_model=False, hvd=None: {
        "tokens_per_sec": 190.0 if compile_model else 98.0, "compile": compile_model})
    report: dict = {"checks": {}}

    def check(report, name, fn):
        report["checks"][name] = fn()

    gpu_lm.measure(report, check)
    checks = report["checks"]
    assert list(checks) == ["bare_loop_gpt2_small", "bare_loop_gpt2_small_compile", "trainer_lm_gpt2_small",
                            "trainer_lm_gpt2_small_compile", "bare_loop_gpt2_small_again"]
    assert checks["trainer_lm_gpt2_small"]["ratio_to_bare_loop"] == 0.98
    assert checks["trainer_lm_gpt2_small_compile"]["ratio_to_bare_loop"] == 0.95
    assert report["lm_step_horovod"] == "stand-in"   # the note of whichever Horovod ran
