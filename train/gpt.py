"""A GPT-2-style decoder: presets from the published configurations, causal attention through
`F.scaled_dot_product_attention` (flash or memory-efficient kernels where the GPU has them), the output
layer tied to the token embedding, optional activation checkpointing, and its FLOPs per token.

Presets (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2: 12/24/36/48
layers of width 768/1024/1280/1600; heads of 64 dimensions as in OpenAI's released hparams.json: 12, 16,
20, 25 heads; context 1,024; vocabulary 50,257). The sizes come with the preset; the vocabulary and the
context come from the data (the tokenizer) and --seq-len, so a preset on a 32 k BPE is the same body
with a smaller embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    dim: int


PRESETS: dict[str, Shape] = {
    "gpt2-small": Shape(12, 12, 768),     # 124 M parameters with GPT-2's vocabulary
    "gpt2-medium": Shape(24, 16, 1024),   # 350 M
    "gpt2-large": Shape(36, 20, 1280),    # 774 M
    "gpt2-xl": Shape(48, 25, 1600),       # 1.5 B
}


class Block(nn.Module):
    """Pre-norm transformer block (GPT-2's: LayerNorm before attention and MLP, GELU MLP of 4x width)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, n, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.norm2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, shape: Shape, dropout: float = 0.0,
                 activation_checkpointing: bool = False):
        super().__init__()
        self.shape, self.seq_len = shape, seq_len
        self.activation_checkpointing = activation_checkpointing
        self.tokens = nn.Embedding(vocab_size, shape.dim)
        self.positions = nn.Embedding(seq_len, shape.dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(shape.dim, shape.heads, dropout) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.dim)
        self.head = nn.Linear(shape.dim, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied (Press & Wolf 2017), as GPT-2
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 x layers)
            for proj in (block.proj, block.out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * shape.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        x = self.drop(self.tokens(idx) + self.positions(torch.arange(n, device=idx.device)))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                # recompute the block's activations in the backward pass: memory for one more forward
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight is listed once


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token: 6 N for the matmuls over the N parameters outside the embeddings (the
    output layer counted: it is the tied embedding) plus 12 L d T for attention's scores and mixing at
    context T (Chowdhery et al. 2022, "PaLM", Appendix B; Kaplan et al. 2020, section 2.1; the same
    estimate as nanoGPT's estimate_mfu)."""
    n = parameter_count(model) - model.positions.weight.numel()
    s = model.shape
    return 6.0 * n + 12.0 * s.layers * s.dim * model.seq_len


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: weight decay on the matrices (linear and embedding weights), none on
    norms and biases (the 1-D parameters), as GPT-2's reproductions and nanoGPT do (Loshchilov &
    Hutter 2019 decouple the decay; decaying a LayerNorm gain or a bias only pulls it towards 0)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
