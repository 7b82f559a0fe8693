"""scripts/gpu-check's measurement of the lm task on one GPU (issue 36, item 6): GPT-2 small (the
`gpt2-small` preset: 124 M parameters with GPT-2's vocabulary), context 1,024, bf16, AdamW, as
`Trainer.train_step` runs it on batches that the task's own stream (train.tokens.WindowStream) cuts
from token shards on the local disk, without and with `--compile`. Each is reported against a bare
torch loop of the same model, batch, precision and optimizer on one batch kept on the device (nanoGPT's
bench.py with real_data=False), run in the same call, with MFU (train.throughput's peak table) beside
each: the ratio's shortfall is what the trainer adds around the step, its own per-step work and any
wait of the GPU on the input.

The shards hold random tokens (numpy only: the GPU machines have no tokenizer to train): the figures
are the step's and the input path's, not a language model's. Where Horovod is not importable, the
step's Horovod calls go to bench.gpu_step.SingleProcessHorovod, and the report says so.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

GPT2_VOCAB = 50257  # GPT-2's BPE (Radford et al. 2019): uint16 token shards
SEQ_LEN = 1024
BATCH = 8           # sequences per step: nanoGPT's GPT-2 recipe's micro-batch is 12 at this context
LR, WEIGHT_DECAY = 6e-4, 0.1


def token_shards(workdir: Path, tokens: int = 1 << 22, vocab: int = GPT2_VOCAB, seed: int = 0) -> str:
    """A token dataset of `tokens` random tokens in train.tokens' layout (one shard, blocks of the
    product's default size); returns its directory."""
    import numpy as np

    from train import tokens as tk

    rng = np.random.default_rng(seed)
    values = rng.integers(0, vocab, tokens, dtype=np.uint16 if vocab <= 1 << 16 else np.uint32)
    out = workdir / "tokens"
    out.mkdir(parents=True, exist_ok=True)
    data, entry = tk.shard_entry(tk.shard_name(0), values, tk.BLOCK_TOKENS)
    (out / entry["name"]).write_bytes(data)
    (out / tk.INDEX).write_text(json.dumps({
        "format": tk.FORMAT, "kind": "tokens", "dtype": str(values.dtype), "vocab_size": vocab,
        "eod_token": vocab - 1, "block_tokens": tk.BLOCK_TOKENS, "tokens": tokens, "documents": 1,
        "shards": [entry]}))
    return str(out)


def _rates(tokens_per_step: int, times: list[float], elapsed: float, flops_per_token: float, device) -> dict:
    """The rate over `elapsed` (all the timed steps, to the GPU's last work), the median step."""
    from train.throughput import mfu, peak_flops

    rate = tokens_per_step * len(times) / elapsed
    out = {"tokens_per_sec": round(rate, 1), "median_step_ms": round(statistics.median(times) * 1e3, 2)}
    if device.type == "cuda":
        import torch

        peak = peak_flops(torch.cuda.get_device_name(device))
        out["mfu"] = round(mfu(flops_per_token, rate, peak), 4) if peak else None
    return out


def bare_loop(shape=None, vocab: int = GPT2_VOCAB, seq_len: int = SEQ_LEN, batch: int = BATCH,
              steps: int = 20, warmup: int = 5, precision: str = "bf16", compile_model: bool = False,
              device=None) -> dict:
    """tokens/s of the bare loop: train.gpt.GPT of `shape` (a train.gpt.Shape; GPT-2 small by default),
    AdamW over its decay groups, autocast, one batch of random tokens on the device reused each step."""
    import torch
    import torch.nn.functional as F

    from train import gpt
    from train.recipe import autocast_dtype

    device = device or torch.device("cuda")
    torch.manual_seed(0)
    model = gpt.GPT(vocab, seq_len, shape or gpt.PRESETS["gpt2-small"]).to(device)
    flops = gpt.flops_per_token(model)
    optimizer = torch.optim.AdamW(gpt.decay_groups(model, WEIGHT_DECAY), lr=LR)
    forward = torch.compile(model) if compile_model else model
    x = torch.randint(0, vocab, (batch, seq_len + 1), device=device)
    dtype = autocast_dtype(precision)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = forward(x[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).backward()
        optimizer.step()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    started = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    return {**_rates(batch * seq_len, times, elapsed, flops, device), "steps": steps, "batch_size": batch,
            "seq_len": seq_len, "precision": precision, "compile": compile_model}


def trainer_tokens_per_sec(data: str, preset: str | None = "gpt2-small", seq_len: int = SEQ_LEN,
                           batch: int = BATCH, steps: int = 20, warmup: int = 5, precision: str = "bf16",
                           compile_model: bool = False, model_flags: tuple[str, ...] = (), hvd=None) -> dict:
    """tokens/s of `Trainer.train_step` on the lm task, its batches from `data` through the task's
    stream (`--readahead-blocks 0`: the shards are on the local disk), over `steps` after `warmup`."""
    from bench.gpu_step import horovod_or_stand_in, timed_trainer_steps

    hvd = hvd or horovod_or_stand_in()[0]
    args = ["--task", "lm", "--data", data, "--seq-len", str(seq_len), "--batch-size", str(batch),
            "--precision", precision, "--optimizer", "adamw", "--lr", str(LR), "--weight-decay",
            str(WEIGHT_DECAY), "--steps", str(warmup + steps), "--readahead-blocks", "0", "--no-progress",
            "--cpu-affinity", "off", *(["--model-preset", preset] if preset else []), *model_flags,
            *(["--compile"] if compile_model else [])]
    trainer, times, elapsed = timed_trainer_steps(args, hvd, steps, warmup)  # elapsed: to the last sync
    flops = trainer.task.flops_per_token(trainer.model)
    trainer.task.close()
    return {**_rates(batch * seq_len, times, elapsed, flops, trainer.device), "steps": steps,
            "batch_size": batch, "seq_len": seq_len, "precision": trainer.precision, "compile": compile_model,
            "data": "token shards, local disk, task stream inline"}


def measure(report: dict, check) -> None:
    """gpu-check's lm checks; `check(report, name, fn)` records each."""
    from bench.gpu_step import horovod_or_stand_in

    hvd, note = horovod_or_stand_in()
    report["lm_step_horovod"] = note or "Horovod, one worker"
    bare: dict[bool, list[float]] = {False: [], True: []}

    def bare_run(compile_model: bool) -> dict:
        result = bare_loop(compile_model=compile_model)
        bare[compile_model].append(result["tokens_per_sec"])
        return result

    def against_bare(result: dict) -> dict:
        runs = bare[result["compile"]]
        base = statistics.mean(runs) if runs else None
        return {**result, "bare_loop_tokens_per_sec": base,
                "ratio_to_bare_loop": round(result["tokens_per_sec"] / base, 3) if base else None}

    check(report, "bare_loop_gpt2_small", lambda: bare_run(False))
    check(report, "bare_loop_gpt2_small_compile", lambda: bare_run(True))
    with tempfile.TemporaryDirectory(prefix="gpu-check-tokens-") as tmp:
        data = token_shards(Path(tmp))
        check(report, "trainer_lm_gpt2_small", lambda: against_bare(trainer_tokens_per_sec(data, hvd=hvd)))
        check(report, "trainer_lm_gpt2_small_compile",
              lambda: against_bare(trainer_tokens_per_sec(data, compile_model=True, hvd=hvd)))
    check(report, "bare_loop_gpt2_small_again", lambda: bare_run(False))  # the clocks, after the trainer
