"""Models users build by hand from PyTorch's own modules, for the corpus (``family="handmade"``).

Each builder takes the case's ``overrides`` (widths, layers, vocabulary) and returns an ``nn.Module``
whose ``forward(**batch)`` returns the loss, as a user's own training script computes it:

* ``encoder-lm``: ``nn.TransformerEncoder`` (``batch_first``, ``norm_first``) over token embeddings, a
  ``src_key_padding_mask`` (the last eighth of every sequence padded) and a causal ``mask``;
* ``decoder-lm``: ``nn.TransformerDecoder`` (``batch_first``, ``norm_first``) reading an encoded memory,
  a causal ``tgt_mask`` and a ``memory_key_padding_mask``;
* ``mha-lm``: a stack of ``nn.MultiheadAttention`` blocks with an ``attn_mask`` and a ``key_padding_mask``;
* ``lstm-lm`` / ``gru-lm``: ``nn.LSTM`` / ``nn.GRU`` language models (cuDNN on a GPU);
* ``unet``: a UNet (Conv2d, BatchNorm2d, ReLU, max pooling, ConvTranspose2d, ``torch.cat``) with a
  per-pixel cross-entropy.

Batches (:func:`make_batch`) are CPU tensors; the corpus moves them to the device.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.core.errors import LabkitError


def _padding_mask(ids: torch.Tensor) -> torch.Tensor:
    """True where a token is padding: the last eighth of every sequence."""
    s = ids.shape[1]
    pad = torch.zeros(ids.shape, dtype=torch.bool)
    pad[:, s - max(1, s // 8):] = True
    return pad


class EncoderLM(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 1024, nhead: int = 16, ff: int = 4096, layers: int = 8,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, ff, dropout, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(s, device=input_ids.device)
        h = self.enc(self.embed(input_ids), mask=causal, src_key_padding_mask=padding_mask, is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class DecoderLM(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 1024, nhead: int = 16, ff: int = 4096, layers: int = 6,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerDecoderLayer(d_model, nhead, ff, dropout, batch_first=True, norm_first=True)
        self.dec = nn.TransformerDecoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.embed(input_ids)
        causal = nn.Transformer.generate_square_subsequent_mask(s, device=input_ids.device)
        h = self.dec(x, x, tgt_mask=causal, memory_key_padding_mask=padding_mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class MHABlock(nn.Module):
    def __init__(self, d_model: int, nhead: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, key_padding_mask=pad, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class MHALM(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 1024, nhead: int = 16, ff: int = 4096, layers: int = 8,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(MHABlock(d_model, nhead, ff, dropout) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).triu(1)   # True: not attended
        x = self.embed(input_ids)
        for b in self.blocks:
            x = b(x, mask, padding_mask)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


class RNNLM(nn.Module):
    def __init__(self, kind: str = "lstm", vocab: int = 32000, hidden: int = 1024, layers: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(input_ids))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, classes: int = 21, base: int = 64, depth: int = 4) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(3, widths[0])] +
                                  [_double_conv(widths[i], widths[i + 1]) for i in range(depth)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth)))
        self.merge = nn.ModuleList(_double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.out = nn.Conv2d(widths[0], classes, 1)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        skips = []
        x = pixel_values
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        return F.cross_entropy(self.out(x), labels)


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "encoder-lm": EncoderLM, "decoder-lm": DecoderLM, "mha-lm": MHALM,
    "lstm-lm": lambda **o: RNNLM("lstm", **o), "gru-lm": lambda **o: RNNLM("gru", **o), "unet": UNet,
}


def build(arch: str, overrides: dict[str, Any]) -> nn.Module:
    if arch not in BUILDERS:
        raise LabkitError(f"hand-built model {arch!r} is not one of {sorted(BUILDERS)}")
    return BUILDERS[arch](**overrides)


def make_batch(arch: str, overrides: dict[str, Any], b: int, s: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A CPU batch: token ids, labels (and a padding mask for the attention models), or images and
    per-pixel labels for the UNet (``s`` is the image side)."""
    if arch == "unet":
        classes = int(overrides.get("classes", 21))
        return {"pixel_values": torch.randn(b, 3, s, s, generator=g),
                "labels": torch.randint(0, classes, (b, s, s), generator=g)}
    vocab = int(overrides.get("vocab", 32000))
    ids = torch.randint(0, vocab, (b, s), generator=g)
    batch = {"input_ids": ids, "labels": torch.randint(0, vocab, (b, s), generator=g)}
    if arch in ("encoder-lm", "decoder-lm", "mha-lm"):
        batch["padding_mask"] = _padding_mask(ids)
    return batch


def tiny_overrides(arch: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The CI size of a hand-built model: 2 layers, width 64, vocabulary 512."""
    if arch == "unet":
        return dict(overrides, base=8, depth=2)
    o = dict(overrides, vocab=512, layers=2)
    if arch in ("lstm-lm", "gru-lm"):
        return dict(o, hidden=64)
    return dict(o, d_model=64, nhead=4, ff=128)


__all__ = ["BUILDERS", "build", "make_batch", "tiny_overrides"]
