"""A small decoder-only GPT (GPT-2 layout) used as the lab's reference workload.

Pre-norm blocks, causal self-attention through ``F.scaled_dot_product_attention`` (flash or
memory-efficient kernels on GPUs), GELU MLP with a 4x expansion, tied embeddings by default.
Returns ``(logits, loss)``: the loss is computed when ``targets`` are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.core.errors import LabkitError


@dataclass
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    seq_len: int = 256
    vocab_size: int = 8192
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise LabkitError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise LabkitError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise LabkitError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, L, V, S = self.n_embd, self.n_layer, self.vocab_size, self.seq_len
        b = 1 if self.bias else 0
        per_layer = 2 * (h + h * b) + (3 * h * h + 3 * h * b) + (h * h + h * b) + (4 * h * h + 4 * h * b) + (4 * h * h + h * b)
        head = 0 if self.tie_weights else V * h
        return V * h + S * h + L * per_layer + (h + h * b) + head


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = c.dropout
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.core(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core (what selective recomputation recomputes)."""
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)


class MLP(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.seq_len, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.seq_len:
            raise LabkitError(f"sequence of {T} tokens is longer than the model's seq_len={self.config.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def example_batch(self, batch_size: int, *, seq_len: int | None = None, generator: torch.Generator | None = None):
        """Random token ids and next-token targets (CPU tensors)."""
        T = seq_len or self.config.seq_len
        idx = torch.randint(0, self.config.vocab_size, (batch_size, T + 1), generator=generator)
        return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
