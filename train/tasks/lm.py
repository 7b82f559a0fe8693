"""The built-in `lm` task: a GPT over token shards, evaluated by held-out loss and perplexity.

    ringtrain data tokenizer train --src corpus/ --column text --vocab-size 32768 --out tokenizer.json
    ringtrain data pack tokens --src corpus/ --column text --tokenizer tokenizer.json \
        --out s3://bucket/corpus/train --eval-out s3://bucket/corpus/eval --eval-fraction 0.001
    python -m train --task lm --data s3://bucket/corpus/train --eval-data s3://bucket/corpus/eval \
        --model-preset gpt2-small --seq-len 1024 --optimizer adamw --weight-decay 0.1 --lr 6e-4 \
        --lr-schedule cosine --warmup-steps 700 --precision bf16 --backward-passes-per-step 8

The model (train.gpt) is a preset from GPT-2's published sizes or --layers/--heads/--dim, its
vocabulary the tokenizer's (the dataset's index), its context --seq-len. Samples are windows of
seq_len + 1 tokens read by each worker from its own blocks of the token shards (train.tokens: byte
ranges, each verified against its checksum); a window is tokens 0..n, the model predicts 1..n from
0..n-1. Batches are int64 tensors ready for the embedding, so the stream feeds the training process
directly, without DataLoader workers.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

from train import gpt, tokens
from train.errors import BadInput
from train.task import Example, Task

DEFAULT_SHAPE = gpt.Shape(layers=4, heads=4, dim=256)
DEFAULT_SEQ_LEN = 256


def shape_from_args(args: argparse.Namespace) -> gpt.Shape:
    if args.model_preset:
        return gpt.PRESETS[args.model_preset]
    d = DEFAULT_SHAPE
    return gpt.Shape(*(default if value is None else value for value, default in
                       ((args.layers, d.layers), (args.heads, d.heads), (args.dim, d.dim))))


class LanguageModelTask(Task):
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-preset", choices=tuple(gpt.PRESETS), default=None,
                            help="GPT-2's published sizes (small 124 M, medium 350 M, large 774 M, xl 1.5 B "
                                 "with its 50 k vocabulary); otherwise --layers/--heads/--dim")
        d = DEFAULT_SHAPE
        parser.add_argument("--layers", type=int, default=None, help=f"blocks (default {d.layers})")
        parser.add_argument("--heads", type=int, default=None, help=f"attention heads (default {d.heads})")
        parser.add_argument("--dim", type=int, default=None,
                            help=f"model width, a multiple of --heads (default {d.dim})")
        parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="context: tokens per sample")
        parser.add_argument("--dropout", type=float, default=0.0)
        parser.add_argument("--activation-checkpointing", action="store_true",
                            help="recompute each block's activations in the backward pass (less memory, "
                                 "about a third more compute)")
        parser.add_argument("--compile", action="store_true", help="run the model through torch.compile")
        parser.add_argument("--eval-data", default=None, help="held-out token shards (loss, perplexity)")
        parser.add_argument("--readahead-blocks", type=int, default=4,
                            help="blocks fetched ahead per worker, on threads (default 4, for S3); 0 reads "
                                 "each block when it is needed, on the training thread: for data on a local "
                                 "disk, where a read costs less than a hand-off between threads")

    @classmethod
    def check_arguments(cls, args: argparse.Namespace) -> list[str]:
        problems = []
        if args.model_preset:
            given = [f for f, v in (("--layers", args.layers), ("--heads", args.heads), ("--dim", args.dim))
                     if v is not None]
            if given:
                problems.append(f"--model-preset {args.model_preset} sets the model's size: drop "
                                f"{', '.join(given)} (or the preset)")
        shape = shape_from_args(args)
        problems += [f"{flag} {value}: must be >= 1" for flag, value in
                     (("--layers", shape.layers), ("--heads", shape.heads), ("--dim", shape.dim),
                      ("--seq-len", args.seq_len)) if value < 1]
        if args.readahead_blocks < 0:
            problems.append(f"--readahead-blocks {args.readahead_blocks}: must be >= 0 (0 reads each block "
                            "when it is needed, on the training thread)")
        if shape.heads >= 1 and shape.dim % shape.heads:
            problems.append(f"--dim {shape.dim}: must be a multiple of --heads {shape.heads}")
        if not 0.0 <= args.dropout < 1.0:
            problems.append(f"--dropout {args.dropout}: must be in [0, 1)")
        return problems

    @classmethod
    def example(cls) -> Example:
        """Seven packages of this Python's standard library source (about 2.7 MB of text) written as
        Parquet, a 2,048-token byte-level BPE trained on it, token shards in blocks of 8,192 tokens (~100
        blocks of 63 windows of 128 + 1 for the workers to share), and a small GPT: the path a user's
        corpus takes, at the size of an example."""
        packages = ("asyncio", "email", "json", "http", "logging", "unittest", "xml")
        corpus, tokenizer_json = "{scratch}/stdlib-parquet", "{scratch}/tokenizer.json"
        return Example(
            "stdlib-bpe2048", "the Python standard library's source as Parquet, packed as tokens of a "
            "2,048-token BPE trained on it",
            (("{python}", "-m", "cluster.example_data", "stdlib-parquet", "--out", corpus, "--packages",
              *packages),
             ("{python}", "-m", "train.data", "tokenizer", "train", "--src", corpus, "--column", "text",
              "--vocab-size", "2048", "--out", tokenizer_json),
             ("{python}", "-m", "train.data", "pack", "tokens", "--src", corpus, "--column", "text",
              "--tokenizer", tokenizer_json, "--out", "{train}", "--eval-out", "{eval}", "--eval-fraction",
              "0.05", "--block-tokens", "8192", "--shard-mb", "1", "--memory-mb", "256")),
            (("--layers", "2"), ("--heads", "4"), ("--dim", "64"), ("--seq-len", "128"),
             ("--optimizer", "adam"), ("--lr", "0.001")))

    train_view: tokens.WindowView | None = None
    eval_view: tokens.WindowView | None = None
    _stream: tokens.WindowStream | None = None
    _forward = None

    def prepare(self, rank: int, size: int) -> None:
        ctx, a = self.ctx, self.args
        if ctx.data == "synthetic":
            raise BadInput("--task lm reads token shards: give --data (written by `ringtrain data pack "
                           "tokens --src ... --tokenizer ... --out ...`)")
        self.train_view = tokens.open_dataset(ctx.data, ctx.s3_endpoint_url).windows(a.seq_len)
        tokens.check_fits(self.train_view, ctx.batch_size, size)
        if a.eval_data:
            self.eval_view = tokens.open_dataset(a.eval_data, ctx.s3_endpoint_url).windows(a.seq_len)
            theirs, ours = (self._vocab(self.eval_view), self._vocab(self.train_view))
            if theirs != ours:
                raise BadInput(f"--eval-data {a.eval_data}: vocabulary/end-of-document token {theirs}, "
                               f"--data has {ours} (pack both with the same tokenizer)")
            if not any(s["samples"] for s in self.eval_view.shards):
                raise BadInput(f"--eval-data {a.eval_data}: no block holds a window of --seq-len "
                               f"{a.seq_len}")

    @staticmethod
    def _vocab(view: tokens.WindowView) -> tuple[int, int]:
        return view.ds.index["vocab_size"], view.ds.index["eod_token"]

    _model_vocab: int | None = None  # a loaded export's vocabulary (train/export.py)

    def model_info(self) -> dict:
        index = self.train_view.ds.index
        tokenizer = index.get("tokenizer")
        return {"vocab_size": index["vocab_size"], "eod_token": index["eod_token"],
                "seq_len": self.args.seq_len,
                # the tokenizer the data was packed with, beside the training data's index
                "tokenizer": f"{self.ctx.data.rstrip('/')}/{tokenizer}" if tokenizer else None}

    def use_model_info(self, info: dict) -> None:
        self._model_vocab = int(info["vocab_size"])
        self._model_eod = int(info["eod_token"])

    def prepare_eval(self) -> None:
        a = self.args
        self.eval_view = tokens.open_dataset(a.eval_data, self.ctx.s3_endpoint_url).windows(a.seq_len)
        ours = (self._model_vocab, self._model_eod)
        if self._vocab(self.eval_view) != ours:
            raise BadInput(f"--eval-data {a.eval_data}: vocabulary/end-of-document token "
                           f"{self._vocab(self.eval_view)}, the model's are {ours}")

    def build_model(self) -> nn.Module:
        a = self.args
        vocab = self._model_vocab or self.train_view.ds.index["vocab_size"]
        return gpt.GPT(vocab, a.seq_len, shape_from_args(a), a.dropout,
                       activation_checkpointing=a.activation_checkpointing)

    def parameter_groups(self, model, weight_decay):
        return gpt.decay_groups(model, weight_decay)

    def tokens_per_sample(self):
        return self.args.seq_len  # the targets of a window of seq_len + 1

    def flops_per_token(self, model):
        return gpt.flops_per_token(model)

    def train_batches(self, position, rank, size):
        if self._stream is not None:
            self._stream.close()
        self._stream = tokens.WindowStream(self.train_view, self.ctx.seed, self.ctx.batch_size, rank, size,
                                           position, readahead=self.args.readahead_blocks)
        for batch, after in self._stream:
            yield torch.from_numpy(batch), after

    def _logits(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        if self._forward is None or self._forward[0] is not model:
            # compiled once per model object; the model's own parameters and state_dict stay as they are
            self._forward = (model, torch.compile(model) if self.args.compile else model)
        return self._forward[1](inputs)

    def loss(self, model, batch):
        logits = self._logits(model, batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))

    def eval_batches(self, rank, size):
        return None if self.eval_view is None else self._eval_batches(rank, size)

    def _eval_batches(self, rank, size):
        batch = []
        for window in tokens.eval_windows(self.eval_view, rank, size):
            batch.append(torch.from_numpy(window.astype("int64")))
            if len(batch) == self.ctx.batch_size:
                yield torch.stack(batch)
                batch = []
        if batch:
            yield torch.stack(batch)

    def eval_sums(self, model, batch):
        logits = model(batch[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1),
                              reduction="sum")
        return {"nll": nll.item(), "tokens": batch[:, 1:].numel()}

    def eval_metrics(self, sums):
        loss = sums.get("nll", 0.0) / max(sums.get("tokens", 0.0), 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": sums.get("tokens", 0.0)}

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
