"""The standard recipe's trainer side (issue 35): the learning rate's scaling rule per optimizer, AdamW
with betas, no weight decay on biases and normalisation weights, bf16 by default on GPUs that support
it, what a resume under another layout changes, and samples/s without evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from tests.train.proc import REPO, run, train_cmd
from tests.train.slow_eval_task import EVAL_S
from train.config import parse_args
from train.errors import BadInput
from train.recipe import build_optimizer, layout_change, lr_at, param_groups, resolve_precision
from train.summary import parse_summary


def test_each_optimizer_scales_the_lr_by_its_rule_and_the_flag_overrides_it():
    sgd = parse_args(["--lr", "0.1"])
    adam = parse_args(["--lr", "0.1", "--optimizer", "adam"])
    adamw = parse_args(["--lr", "0.1", "--optimizer", "adamw", "--backward-passes-per-step", "2"])
    assert (sgd.optim.lr_scaling, adam.optim.lr_scaling, adamw.optim.lr_scaling) == ("linear", "sqrt", "sqrt")
    assert lr_at(0, sgd, 4, 4, False) == pytest.approx(0.4)
    assert lr_at(0, adam, 4, 4, False) == pytest.approx(0.2)  # not x 4: the square-root rule
    assert lr_at(0, adamw, 8, 8, False) == pytest.approx(0.4)  # sqrt(8 workers x 2 passes)
    none = parse_args(["--lr", "0.1", "--optimizer", "adam", "--lr-scaling", "none"])
    linear = parse_args(["--lr", "0.1", "--optimizer", "adam", "--lr-scaling", "linear"])
    assert lr_at(0, none, 4, 4, False) == pytest.approx(0.1)
    assert lr_at(0, linear, 4, 4, False) == pytest.approx(0.4)
    with pytest.raises(BadInput, match=r"--betas 0.9 1.0: each must be in \[0, 1\)"):
        parse_args(["--optimizer", "adamw", "--betas", "0.9", "1.0"])


def test_adamw_takes_its_betas_and_weight_decay_skips_biases_and_norms():
    cfg = parse_args(["--optimizer", "adamw", "--betas", "0.8", "0.95", "--weight-decay", "0.05"])
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.LayerNorm(4 * 6 * 6), torch.nn.Linear(4 * 6 * 6, 2))
    groups = param_groups(list(model.named_parameters()), cfg.optim.weight_decay)
    opt = build_optimizer(cfg, groups)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.8, 0.95)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert {p.ndim for p in decayed["params"]} == {2, 4}  # conv and linear weights only
    assert len(plain["params"]) == 6  # conv, linear biases; batch and layer norms' weights and biases
    # without weight decay one group, as checkpoints written before the split hold it
    assert len(param_groups(list(model.named_parameters()), 0.0)) == 1


def test_precision_auto_is_bf16_on_gpus_that_support_it_and_fp32_elsewhere():
    assert parse_args([]).precision == "auto"
    assert resolve_precision("auto", on_gpu=True, bf16_supported=True) == "bf16"
    assert resolve_precision("auto", on_gpu=True, bf16_supported=False) == "fp32"
    assert resolve_precision("auto", on_gpu=False, bf16_supported=False) == "fp32"
    assert resolve_precision("fp16", on_gpu=True, bf16_supported=True) == "fp16"


def test_a_resume_under_another_layout_says_what_changes():
    cfg = parse_args(["--lr", "0.1", "--batch-size", "16"])
    same = {"step": 40, "world_size": 4, "batch_size": 16, "backward_passes_per_step": 1}
    assert layout_change(same, cfg, 4, 4, False) is None
    line = layout_change({**same, "world_size": 8, "batch_size": 32}, cfg, 4, 4, False)
    assert "global batch 8 workers x 32 x 1 passes = 256 -> 4 x 16 x 1 = 64" in line
    assert "learning rate at this step 0.8 -> 0.4 (--lr-scaling linear)" in line
    assert "samples not yet read this epoch go to the new workers" in line


def test_samples_per_sec_and_the_logged_throughput_leave_evaluation_out(tmp_path):
    metrics = tmp_path / "m.jsonl"
    task = f"{REPO / 'tests' / 'train' / 'slow_eval_task.py'}:SlowEvalTask"
    r = run(train_cmd("--task", task, "--steps", "6", "--eval-every", "2", "--log-every", "2",
                      "--batch-size", "32", "--metrics-file", str(metrics)), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    s = parse_summary(r.stdout)
    assert s.eval is not None
    # 2 evaluations inside the loop (steps 2 and 4) of EVAL_S each: counted, 192 samples would give
    # at most 192 / 4 s = 48/s; a few milliseconds of steps give thousands
    with_eval_bound = 6 * 32 / (2 * EVAL_S)
    assert s.samples_per_sec > 4 * with_eval_bound, s
    import json

    rates = [rec["samples_per_sec"] for rec in map(json.loads, metrics.read_text().splitlines())
             if "samples_per_sec" in rec]
    assert len(rates) == 3 and min(rates) > 4 * 64 / EVAL_S, rates
    assert math.isfinite(s.final_loss)
