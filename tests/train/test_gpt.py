"""The lm task's model (train.gpt) and its throughput figures: tokens/s and MFU (train.throughput)."""

from __future__ import annotations

import pytest
import torch

from train import gpt, throughput


def _tiny(**kw) -> gpt.GPT:
    torch.manual_seed(0)
    return gpt.GPT(vocab_size=50, seq_len=16, shape=gpt.Shape(2, 2, 16), **kw)


def test_gpt2_small_has_gpt2s_124_m_parameters():
    # GPT-2 small: 124,439,808 parameters with its 50,257-token vocabulary and 1,024 positions (the output
    # layer tied to the token embedding; HF's GPT2LMHeadModel and nanoGPT count the same)
    with torch.device("meta"):
        model = gpt.GPT(50257, 1024, gpt.PRESETS["gpt2-small"])
    assert gpt.parameter_count(model) == 124_439_808
    assert model.head.weight is model.tokens.weight


def test_attention_is_causal():
    model = _tiny().eval()
    x = torch.randint(0, 50, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 50  # change only the future of position 9
    a, b = model(x), model(y)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])


def test_activation_checkpointing_gives_the_same_gradients():
    x = torch.randint(0, 50, (2, 16))
    grads = []
    for ckpt in (False, True):
        model = _tiny(activation_checkpointing=ckpt).train()
        model(x).logsumexp(-1).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))


def test_weight_decay_spares_norms_and_biases():
    model = _tiny()
    decay, no_decay = gpt.decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in no_decay["params"]} == {
        n for n, _ in model.named_parameters() if n.endswith(".bias") or ".norm" in n or n.startswith("norm")}
    assert "tokens.weight" in {names[id(p)] for p in decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_flops_per_token_is_six_n_plus_attention():
    model = _tiny()
    n = gpt.parameter_count(model) - 16 * 16  # without the position embedding
    assert gpt.flops_per_token(model) == 6 * n + 12 * 2 * 16 * 16


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.05),
    ("NVIDIA A10", 125.0), ("NVIDIA A10G", None), ("Tesla T4", None),
])
def test_the_peak_table_knows_the_gpus_it_cites(name, tflops):
    assert throughput.peak_flops(name) == (None if tflops is None else tflops * 1e12)


def test_tokens_per_sec_and_mfu_from_samples_per_sec():
    rate = throughput.TokenRate(tokens_per_sample=1024, flops_per_token=6 * 124e6, peak=989.4e12)
    record = rate.record(samples_per_sec=400.0, world_size=8)
    assert record["tokens_per_sec"] == 409_600
    assert record["mfu"] == pytest.approx(6 * 124e6 * 409_600 / 8 / 989.4e12)
    assert "mfu" not in throughput.TokenRate(1024, 6e6, None).record(1.0, 1)  # a CPU: no MFU
    assert throughput.TokenRate().record(1.0, 1) == {}  # a task counting no tokens
