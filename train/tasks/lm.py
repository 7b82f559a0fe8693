"""The built-in `lm` task: a GPT-style decoder over pre-tokenized shards, evaluated by perplexity.

    python -m train.data pack text --src "$(python -m cluster.example_data stdlib)" \
        --out s3://bucket/stdlib/train --eval-out s3://bucket/stdlib/eval --eval-fraction 0.02 --seq-len 128
    python -m train --task lm --data s3://bucket/stdlib/train --eval-data s3://bucket/stdlib/eval \
        --layers 4 --heads 4 --dim 256 --lr-schedule cosine --warmup-steps 50 --optimizer adam --lr 3e-4

The model is built from its flags (nothing is downloaded): token and position embeddings, pre-norm
transformer blocks with causal self-attention, the output layer tied to the token embedding. The
tokens are bytes (a vocabulary of 256, as `pack text` writes them, one byte per token in a sample's
`tokens` file); each sample holds seq_len + 1 tokens, the model predicts tokens 1..n from 0..n-1.
Decoding a sample is a copy, so the shard stream (train.shards) feeds the training process directly,
without DataLoader workers.
"""

from __future__ import annotations

import argparse
import math
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from train import shards
from train.errors import BadInput
from train.task import Example, Task


class Decoder(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, dim: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(seq_len, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2
        for emb in (self.tokens, self.positions):
            nn.init.normal_(emb.weight, std=0.02)  # GPT-2's scale: N(0, 1) logits would start near 30 nats
        causal = nn.Transformer.generate_square_subsequent_mask(seq_len)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        h = self.tokens(idx) + self.positions(torch.arange(n, device=idx.device))
        h = self.blocks(h, mask=self.causal[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def decode_tokens(sample: dict) -> torch.Tensor:
    data = sample.get("tokens")
    if data is None:
        raise BadInput(f"sample {sample.get('__key__')} in shard {sample.get('__url__')} has no tokens")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class LanguageModelTask(Task):
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--layers", type=int, default=4)
        parser.add_argument("--heads", type=int, default=4)
        parser.add_argument("--dim", type=int, default=256, help="model width (a multiple of --heads)")
        parser.add_argument("--dropout", type=float, default=0.0)
        parser.add_argument("--eval-data", default=None, help="packed evaluation text (perplexity)")
        parser.add_argument("--readahead-shards", type=int, default=2, help="shards fetched ahead per worker")

    @classmethod
    def check_arguments(cls, args: argparse.Namespace) -> list[str]:
        problems = [f"{flag} {value}: must be >= 1" for flag, value in
                    (("--layers", args.layers), ("--heads", args.heads), ("--dim", args.dim),
                     ("--readahead-shards", args.readahead_shards)) if value < 1]
        if args.heads >= 1 and args.dim % args.heads:
            problems.append(f"--dim {args.dim}: must be a multiple of --heads {args.heads}")
        if not 0.0 <= args.dropout < 1.0:
            problems.append(f"--dropout {args.dropout}: must be in [0, 1)")
        return problems

    @classmethod
    def example(cls) -> Example:
        """A few packages of this Python's standard library source as byte-token shards: about 2.7 MB,
        21 k samples of 128 + 1 bytes (the whole library would be ~10x that, for no better example),
        with a small decoder."""
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        packages = ("asyncio", "email", "json", "http", "logging", "unittest", "xml")
        sources = tuple(str(stdlib / p) for p in packages)
        return Example(
            "stdlib-seq128", "the Python standard library's source, packed as byte tokens",
            (("{python}", "-m", "train.data", "pack", "text", "--src", *sources, "--out", "{train}",
              "--eval-out", "{eval}", "--eval-fraction", "0.02", "--seq-len", "128",
              "--samples-per-shard", "1000"),),
            (("--layers", "2"), ("--heads", "4"), ("--dim", "64"), ("--optimizer", "adam"),
             ("--lr", "0.001")))

    train_set: shards.ShardedDataset | None = None
    eval_set: shards.ShardedDataset | None = None
    _stream: shards.ShardStream | None = None

    def prepare(self, rank: int, size: int) -> None:
        ctx = self.ctx
        if ctx.data == "synthetic":
            raise BadInput("--task lm reads pre-tokenized shards: give --data (written by "
                           "`python -m train.data pack text ...`)")
        self.train_set = shards.open_dataset(ctx.data, ctx.s3_endpoint_url, "tokens")
        shards.check_fits(self.train_set, ctx.batch_size, size)
        if self.args.eval_data:
            self.eval_set = shards.open_dataset(self.args.eval_data, ctx.s3_endpoint_url, "tokens")
            theirs, ours = (self.eval_set.index["seq_len"], self.eval_set.index["vocab_size"]), self._shape()
            if theirs != ours:
                raise BadInput(f"--eval-data {self.args.eval_data}: seq_len/vocab_size {theirs}, "
                               f"--data has {ours}")

    def _shape(self) -> tuple[int, int]:
        return self.train_set.index["seq_len"], self.train_set.index["vocab_size"]

    def build_model(self) -> nn.Module:
        seq_len, vocab = self._shape()
        a = self.args
        return Decoder(vocab, seq_len, a.dim, a.layers, a.heads, a.dropout)

    def train_batches(self, position, rank, size):
        if self._stream is not None:
            self._stream.close()
        self._stream = shards.ShardStream(self.train_set, self.ctx.seed, self.ctx.batch_size, rank, size,
                                          position, readahead=self.args.readahead_shards)
        for samples, after in self._stream:
            yield torch.stack([decode_tokens(s) for s, _ in samples]), after

    def loss(self, model, batch):
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))

    def eval_batches(self, rank, size):
        return None if self.eval_set is None else self._eval_batches(rank, size)

    def _eval_batches(self, rank, size):
        batch = []
        for sample in shards.eval_samples(self.eval_set, rank, size):
            batch.append(decode_tokens(sample))
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
