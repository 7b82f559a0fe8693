"""The lm task's bare loop (bench/lm_loop.py): the trainer's GPT, batches and loss, read through memmaps."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.lm_loop import LmShape, bare_batches, lm_workload, tokens_per_s
from bench.sections import PRODUCTION
from bench.trainer_run import TrainerRun, window_rate
from bench.workerlib import worker_args
from train import tokens
from train.config import parse_args
from train.shards import Plan
from train.task import TaskContext
from train.tasks.lm import LanguageModelTask


def write_token_shards(root, shard_tokens: list[int], block_tokens: int, vocab: int = 500):
    """Random token shards in the layout `pack tokens` writes (train/tokens.py), checksums included."""
    rng = np.random.default_rng(1)
    root.mkdir()
    entries = []
    for i, n in enumerate(shard_tokens):
        data, entry = tokens.shard_entry(tokens.shard_name(i), rng.integers(0, vocab, n, dtype=np.uint16),
                                         block_tokens)
        (root / entry["name"]).write_bytes(data)
        entries.append(entry)
    index = {"format": tokens.FORMAT, "kind": "tokens", "dtype": "uint16", "vocab_size": vocab,
             "eod_token": 0, "block_tokens": block_tokens, "tokens": sum(shard_tokens), "documents": 1,
             "shards": entries}
    (root / tokens.INDEX).write_text(json.dumps(index))
    return root


@pytest.fixture
def shards(tmp_path):
    # Blocks of 200 tokens hold 12 windows of 16 + 1; the shards' last blocks hold fewer (8 and 3), so
    # the ranks' shares differ and each epoch leaves a tail that the stream drops.
    return write_token_shards(tmp_path / "tokens", [1000, 730, 455], block_tokens=200)


@pytest.mark.parametrize("reads", ["memmap", "range"])
@pytest.mark.parametrize("rank", [0, 1])
def test_the_bare_loops_yield_the_task_streams_batches_bit_for_bit(shards, rank, reads):
    view = tokens.open_dataset(str(shards), None).windows(16)
    seed, batch, world = 7, 5, 2
    count = sum(Plan(e, world, None, 0).length(view, seed, batch) for e in range(3)) + 1  # into epoch 4
    stream = tokens.WindowStream(view, seed, batch, rank, world, None)
    expected = [b for b, _ in itertools.islice(stream, count)]
    stream.close()
    got = [b.copy() for b in itertools.islice(bare_batches(view, seed, batch, rank, world, reads), count)]
    assert len(got) == len(expected) == count
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype == np.int64 and np.array_equal(g, e), f"batch {i}"


def lm_shape(data) -> LmShape:
    return LmShape(str(data), steps=10, warmup=10, layers=2, heads=2, dim=16, seq_len=16, batch_size=4)


def test_the_bare_loop_trains_the_trainers_gpt_on_its_batches_with_its_loss(shards, tmp_path):
    shape = lm_shape(shards)
    cfg = parse_args(TrainerRun(shape, None, 0).trainer_args(tmp_path / "m.jsonl", "r1"))
    bare = worker_args([*shape.args(), *PRODUCTION.args()])
    # What the bare Horovod loop (bench/worker_hvd.py) hard-codes is the trainer's default for the lm
    # task on CPU workers: SGD at 0.05 per worker, scaled by the workers, momentum 0.9, fp32.
    o = cfg.optim
    assert (o.name, o.lr, o.momentum, o.weight_decay, o.lr_scaling, o.warmup_steps, o.clip_grad_norm) == (
        "sgd", 0.05, 0.9, 0.0, "linear", 0, None)
    assert cfg.precision == "auto" and cfg.horovod.backward_passes_per_step == 1
    assert (cfg.data.batch_size, cfg.seed, cfg.task.args.dropout) == (bare.batch_size, bare.seed, 0.0)

    task = LanguageModelTask(cfg.task.args, TaskContext(cfg.data.source, cfg.data.batch_size, cfg.seed,
                                                        cfg.steps, torch.device("cpu"), None, 0, 2))
    task.prepare(0, 2)
    torch.manual_seed(cfg.seed)  # as the trainer and the bare loop seed before building
    theirs = task.build_model()
    torch.manual_seed(bare.seed)
    ours, next_batch = lm_workload(bare, 0, 2)
    assert [t.shape for t in theirs.state_dict().values()] == [t.shape for t in ours[0].state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(theirs.parameters(), ours.parameters(), strict=True))
    batches = task.train_batches(None, 0, 2)
    for _ in range(3):
        batch, _ = next(batches)
        x, y = next_batch()
        assert torch.equal(x, batch[:, :-1]) and torch.equal(y, batch[:, 1:].reshape(-1))
        assert torch.equal(F.cross_entropy(ours(x), y), task.loss(theirs, batch))
    task.close()


def test_worker_args_take_the_lm_task_and_refuse_what_it_cannot_run(capsys):
    args = worker_args(lm_shape("/data/tokens").args())
    assert (args.task, args.layers, args.heads, args.dim, args.seq_len) == ("lm", 2, 2, 16, 16)
    assert worker_args(["--data", "/data/images"]).task == "image"
    assert worker_args([]).task == "demo"
    for argv, message in ((["--task", "lm", "--data", "/d", "--layers", "2"], "needs --layers, --heads"),
                          (["--task", "lm"], "image and lm read a dataset"),
                          (["--task", "demo", "--data", "/d"], "demo trains on synthetic data"),
                          ([*lm_shape("/d").args(), "--seq-len", "0"], "--seq-len must be >= 1")):
        with pytest.raises(SystemExit) as e:
            worker_args(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_tokens_per_s_is_the_windows_samples_per_s_times_the_targets_per_sample():
    records = [{"step": 10, "time": 100.0}, {"step": 20, "time": 102.0}]
    rate = window_rate(records, 10, 20, samples_per_step=2 * 8)  # 2 workers x 8 windows
    assert tokens_per_s({"samples_per_sec": rate}, 256)["tokens_per_s"] == pytest.approx(10 * 16 * 256 / 2.0)
