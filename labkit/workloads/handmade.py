"""Models users build by hand from PyTorch's own modules, for the corpus (``family="handmade"``).

Each builder takes the case's ``overrides`` (widths, layers, vocabulary) and returns an ``nn.Module``
whose ``forward(**batch)`` returns the loss, as a user's own training script computes it:

* ``encoder-lm``: ``nn.TransformerEncoder`` (``batch_first``, ``norm_first``) over token embeddings, a
  ``src_key_padding_mask`` (the last eighth of every sequence padded) and a causal ``mask``;
* ``decoder-lm``: ``nn.TransformerDecoder`` (``batch_first``, ``norm_first``) reading an encoded memory,
  a causal ``tgt_mask`` and a ``memory_key_padding_mask``;
* ``mha-lm``: a stack of ``nn.MultiheadAttention`` blocks with an ``attn_mask`` and a ``key_padding_mask``;
* ``lstm-lm`` / ``gru-lm`` / ``rnn-lm``: ``nn.LSTM`` (optionally with ``proj_size``) / ``nn.GRU`` / ``nn.RNN`` (tanh)
  language models (cuDNN on a GPU), inter-layer ``dropout`` optional;
* ``unet``: a UNet (Conv2d, BatchNorm2d, ReLU, max pooling, ConvTranspose2d, ``torch.cat``) with a
  per-pixel cross-entropy; ``gn-unet`` / ``in-unet`` the same with GroupNorm (8 groups) / InstanceNorm2d
  (affine, no running statistics) in place of BatchNorm2d;
* ``seq2seq``: ``nn.Transformer`` (encoder and decoder, ``batch_first``) translating one token sequence into
  another, with a causal ``tgt_mask`` and padding masks on the source, the target and the memory;
* ``mha-weights-lm``: ``mha-lm`` with ``need_weights=True`` (the averaged attention weights returned, as
  users who plot them ask for);
* ``bilstm-tagger``: a bidirectional ``nn.LSTM`` tagging every token (named-entity style; an embedding width of its own
  and inter-layer dropout optional);
* ``packed-gru``: a bidirectional ``nn.GRU`` fed by ``pack_padded_sequence`` (the lengths brought back to the CPU, unsorted),
  classifying each sequence from its last hidden states; ``packed-gru-encoder`` the same GRU's padded-back outputs
  (``pad_packed_sequence``) tagged token by token;
* ``conv1d-audio``: a waveform autoencoder of strided ``nn.Conv1d`` and ``nn.ConvTranspose1d`` layers with
  BatchNorm1d and an L1 loss (``s`` is the number of samples);
* ``mha-seqfirst-lm``: ``nn.MultiheadAttention`` blocks with ``batch_first=False`` (sequence-first activations), a
  float causal ``attn_mask`` and a float ``key_padding_mask``;
* ``unet3d``: a volumetric UNet (Conv3d, BatchNorm3d, ``max_pool3d``, ConvTranspose3d, ``torch.cat``; ``s`` is the
  cube's side); ``sr-pixelshuffle``: an EDSR-style super-resolution net upsampling by ``nn.PixelShuffle`` (L1 loss);
  ``wavenet``: dilated causal ``nn.Conv1d`` stacks with gated units over mu-law samples (``s`` samples);
* ``embbag-rec``: a recommender of ``nn.EmbeddingBag`` tables (sum over variable-length bags given by
  offsets), a dense MLP over their concatenation and a binary cross-entropy (``s`` ids per bag on average).

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
    def __init__(self, d_model: int, nhead: int, ff: int, dropout: float, need_weights: bool = False) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, key_padding_mask=pad, need_weights=self.need_weights)
        x = x + a
        return x + self.mlp(self.ln2(x))


class MHALM(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 1024, nhead: int = 16, ff: int = 4096, layers: int = 8,
                 dropout: float = 0.0, need_weights: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(MHABlock(d_model, nhead, ff, dropout, need_weights) for _ in range(layers))
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
                 dropout: float = 0.0, proj: int = 0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        if kind == "lstm":
            self.rnn: nn.RNNBase = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout,
                                           proj_size=proj)
        elif kind == "gru":
            self.rnn = nn.GRU(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        else:
            self.rnn = nn.RNN(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout, nonlinearity="tanh")
        self.head = nn.Linear(proj or hidden, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(input_ids))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class MHASeqFirstLM(nn.Module):
    """Attention as older code and ``nn.Transformer``'s own default lay it out: ``nn.MultiheadAttention`` with
    ``batch_first=False`` over (sequence, batch, width) activations, a float causal ``attn_mask`` (``-inf`` above the
    diagonal, ``generate_square_subsequent_mask``) and a float ``key_padding_mask`` (``-inf`` at padding)."""

    def __init__(self, vocab: int = 32000, d_model: int = 1024, nhead: int = 16, ff: int = 4096, layers: int = 6,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.attn = nn.ModuleList(nn.MultiheadAttention(d_model, nhead, dropout=dropout) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))
                                 for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(s, device=input_ids.device)
        pad = torch.zeros(padding_mask.shape, device=input_ids.device).masked_fill(padding_mask, float("-inf"))
        x = self.embed(input_ids.t())                                  # (s, b, d)
        for ln1, attn, ln2, mlp in zip(self.ln1, self.attn, self.ln2, self.mlp):
            h = ln1(x)
            x = x + attn(h, h, h, attn_mask=causal, key_padding_mask=pad, need_weights=False)[0]
            x = x + mlp(ln2(x))
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.t().flatten())


class UNet3D(nn.Module):
    """A volumetric UNet (medical segmentation style): Conv3d, BatchNorm3d, ReLU, ``max_pool3d``, ConvTranspose3d
    (kernel 2, stride 2), ``torch.cat`` of the skips, a per-voxel cross-entropy; one input channel."""

    def __init__(self, classes: int = 4, base: int = 32, depth: int = 3) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv3d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm3d(cout),
                                 nn.ReLU(inplace=True), nn.Conv3d(cout, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm3d(cout), nn.ReLU(inplace=True))

        self.down = nn.ModuleList([block(1, widths[0])] + [block(widths[i], widths[i + 1]) for i in range(depth)])
        self.up = nn.ModuleList(nn.ConvTranspose3d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth)))
        self.merge = nn.ModuleList(block(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.out = nn.Conv3d(widths[0], classes, 1)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        skips = []
        x = pixel_values
        for i, blk in enumerate(self.down):
            x = blk(x if i == 0 else F.max_pool3d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        return F.cross_entropy(self.out(x), labels)


class PixelShuffleSR(nn.Module):
    """A super-resolution net (EDSR style): a 3x3 stem, residual blocks (conv, ReLU, conv, scaled by 0.1, no
    normalisation), an upsampler of ``nn.PixelShuffle(2)`` stages, an L1 loss against the high-resolution image."""

    def __init__(self, channels: int = 64, blocks: int = 16, scale: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.body = nn.ModuleList(nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(inplace=True),
                                                nn.Conv2d(channels, channels, 3, padding=1)) for _ in range(blocks))
        ups: list[nn.Module] = []
        for _ in range(max(1, scale.bit_length() - 1)):
            ups += [nn.Conv2d(channels, 4 * channels, 3, padding=1), nn.PixelShuffle(2)]
        self.up = nn.Sequential(*ups, nn.Conv2d(channels, 3, 3, padding=1))

    def forward(self, pixel_values: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = h = self.stem(pixel_values)
        for blk in self.body:
            h = h + 0.1 * blk(h)
        return F.l1_loss(self.up(x + h), target)


class WaveNet(nn.Module):
    """WaveNet over 8-bit mu-law samples: an embedding, stacks of dilated causal ``nn.Conv1d`` (left padding by
    ``F.pad``, dilations 1..2**(layers-1)), gated ``tanh * sigmoid`` units, 1x1 residual and skip convolutions, and
    a per-sample cross-entropy over the 256 classes of the next sample."""

    def __init__(self, channels: int = 64, skip: int = 256, layers: int = 10, stacks: int = 3, classes: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(classes, channels)
        self.dilations = [2 ** i for i in range(layers)] * stacks
        self.filt = nn.ModuleList(nn.Conv1d(channels, 2 * channels, 2, dilation=d) for d in self.dilations)
        self.res = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in self.dilations)
        self.skip = nn.ModuleList(nn.Conv1d(channels, skip, 1) for _ in self.dilations)
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(skip, skip, 1), nn.ReLU(), nn.Conv1d(skip, classes, 1))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids).transpose(1, 2)                      # (b, channels, samples)
        out = 0
        for d, filt, res, skip in zip(self.dilations, self.filt, self.res, self.skip):
            f, g = filt(F.pad(x, (d, 0))).chunk(2, dim=1)
            z = torch.tanh(f) * torch.sigmoid(g)
            out = out + skip(z)
            x = x + res(z)
        return F.cross_entropy(self.head(out), labels)


_NORMS: dict[str, Callable[[int], nn.Module]] = {
    "batch": nn.BatchNorm2d, "group": lambda c: nn.GroupNorm(8, c), "instance": lambda c: nn.InstanceNorm2d(c, affine=True)}


def _double_conv(cin: int, cout: int, norm: str = "batch") -> nn.Sequential:
    n = _NORMS[norm]
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), n(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), n(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, classes: int = 21, base: int = 64, depth: int = 4, norm: str = "batch") -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(3, widths[0], norm)] +
                                  [_double_conv(widths[i], widths[i + 1], norm) for i in range(depth)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth)))
        self.merge = nn.ModuleList(_double_conv(2 * widths[i], widths[i], norm) for i in reversed(range(depth)))
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


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 512, nhead: int = 8, ff: int = 2048, layers: int = 6,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.core = nn.Transformer(d_model, nhead, layers, layers, ff, dropout, batch_first=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = labels.shape[1]
        tgt_pad = _padding_mask(labels).to(labels.device)
        causal = nn.Transformer.generate_square_subsequent_mask(s, device=labels.device)
        h = self.core(self.embed(input_ids), self.embed(labels), tgt_mask=causal, src_key_padding_mask=padding_mask,
                      tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=padding_mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.roll(-1, 1).flatten())


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab: int = 32000, hidden: int = 512, layers: int = 2, tags: int = 17, embed: int = 0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed or hidden)
        self.rnn = nn.LSTM(embed or hidden, hidden, num_layers=layers, batch_first=True, bidirectional=True,
                           dropout=dropout)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(input_ids))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class PackedGRU(nn.Module):
    def __init__(self, vocab: int = 32000, hidden: int = 512, layers: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=0)
        self.rnn = nn.GRU(hidden, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # pack_padded_sequence takes the lengths on the CPU: the batch's copy on the device comes back (a user's
        # ``lengths.cpu()``)
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(input_ids), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        _, h = self.rnn(packed)                           # (layers * 2, b, hidden): the last layer's two directions
        return F.cross_entropy(self.head(torch.cat([h[-2], h[-1]], dim=1)), labels)


class PackedGRUEncoder(nn.Module):
    """A sequence-to-sequence model's encoder in small: a bidirectional ``nn.GRU`` over packed, unsorted sequences,
    its outputs padded back (``pad_packed_sequence``) and tagged token by token (padding ignored in the loss)."""

    def __init__(self, vocab: int = 32000, hidden: int = 768, layers: int = 2, tags: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=0)
        self.rnn = nn.GRU(hidden, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(input_ids), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True,
                                                  total_length=input_ids.shape[1])
        return F.cross_entropy(self.head(out).flatten(0, 1), labels.flatten(), ignore_index=-100)


class Conv1dAudio(nn.Module):
    def __init__(self, channels: int = 64, depth: int = 5, kernel: int = 8, stride: int = 4) -> None:
        super().__init__()
        widths = [1] + [channels * 2 ** min(i, 3) for i in range(depth)]
        self.enc = nn.ModuleList(nn.Sequential(nn.Conv1d(widths[i], widths[i + 1], kernel, stride, padding=kernel // 2 - stride // 2),
                                               nn.BatchNorm1d(widths[i + 1]), nn.GELU()) for i in range(depth))
        self.dec = nn.ModuleList(nn.Sequential(nn.ConvTranspose1d(widths[i + 1], widths[i] if i else channels, kernel,
                                                                  stride, padding=kernel // 2 - stride // 2),
                                               nn.GELU()) for i in reversed(range(depth)))
        self.out = nn.Conv1d(channels, 1, 1)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        x = input_values
        for block in self.enc:
            x = block(x)
        for block in self.dec:
            x = block(x)
        return F.l1_loss(self.out(x), input_values)


class EmbBagRec(nn.Module):
    def __init__(self, tables: int = 8, rows: int = 100000, dim: int = 128, dense: int = 13, mlp: int = 512) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, mlp), nn.ReLU(), nn.Linear(mlp, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), mlp), nn.ReLU(), nn.Linear(mlp, mlp), nn.ReLU(),
                                 nn.Linear(mlp, 1))

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        feats = [self.bottom(dense)] + [bag(indices[i], offsets[i]) for i, bag in enumerate(self.bags)]
        logit = self.top(torch.cat(feats, dim=1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logit, labels)


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "encoder-lm": EncoderLM, "decoder-lm": DecoderLM, "mha-lm": MHALM,
    "lstm-lm": lambda **o: RNNLM("lstm", **o), "gru-lm": lambda **o: RNNLM("gru", **o),
    "rnn-lm": lambda **o: RNNLM("rnn_tanh", **o), "packed-gru-encoder": PackedGRUEncoder, "unet": UNet,
    "gn-unet": lambda **o: UNet(norm="group", **o), "in-unet": lambda **o: UNet(norm="instance", **o),
    "seq2seq": Seq2Seq, "mha-weights-lm": lambda **o: MHALM(need_weights=True, **o), "bilstm-tagger": BiLSTMTagger,
    "packed-gru": PackedGRU, "conv1d-audio": Conv1dAudio, "embbag-rec": EmbBagRec, "mha-seqfirst-lm": MHASeqFirstLM,
    "unet3d": UNet3D, "sr-pixelshuffle": PixelShuffleSR, "wavenet": WaveNet,
}
UNETS = ("unet", "gn-unet", "in-unet")
RNNS = ("lstm-lm", "gru-lm", "rnn-lm", "bilstm-tagger", "packed-gru", "packed-gru-encoder")


def build(arch: str, overrides: dict[str, Any]) -> nn.Module:
    if arch not in BUILDERS:
        raise LabkitError(f"hand-built model {arch!r} is not one of {sorted(BUILDERS)}")
    return BUILDERS[arch](**overrides)


def make_batch(arch: str, overrides: dict[str, Any], b: int, s: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A CPU batch: token ids, labels (and a padding mask for the attention models, lengths for the packed RNN),
    images and per-pixel labels for the UNets (``s`` is the image side), a waveform (``s`` samples), or dense
    features and bags of sparse ids (``s`` ids per bag on average)."""
    if arch in UNETS:
        classes = int(overrides.get("classes", 21))
        return {"pixel_values": torch.randn(b, 3, s, s, generator=g),
                "labels": torch.randint(0, classes, (b, s, s), generator=g)}
    if arch == "conv1d-audio":
        return {"input_values": torch.randn(b, 1, s, generator=g)}
    if arch == "unet3d":
        return {"pixel_values": torch.randn(b, 1, s, s, s, generator=g),
                "labels": torch.randint(0, int(overrides.get("classes", 4)), (b, s, s, s), generator=g)}
    if arch == "sr-pixelshuffle":
        scale = int(overrides.get("scale", 4))
        return {"pixel_values": torch.randn(b, 3, s, s, generator=g),
                "target": torch.randn(b, 3, scale * s, scale * s, generator=g)}
    if arch == "wavenet":
        classes = int(overrides.get("classes", 256))
        return {"input_ids": torch.randint(0, classes, (b, s), generator=g),
                "labels": torch.randint(0, classes, (b, s), generator=g)}
    if arch == "embbag-rec":
        tables, rows = int(overrides.get("tables", 8)), int(overrides.get("rows", 100000))
        lengths = torch.randint(1, 2 * s, (b,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        return {"dense": torch.randn(b, int(overrides.get("dense", 13)), generator=g),
                "indices": torch.randint(0, rows, (tables, int(lengths.sum())), generator=g),
                "offsets": offsets.expand(tables, b).contiguous(),
                "labels": torch.randint(0, 2, (b,), generator=g).float()}
    vocab = int(overrides.get("vocab", 32000))
    ids = torch.randint(0, vocab, (b, s), generator=g)
    if arch == "bilstm-tagger":
        return {"input_ids": ids, "labels": torch.randint(0, int(overrides.get("tags", 17)), (b, s), generator=g)}
    if arch in ("packed-gru", "packed-gru-encoder"):
        lengths = torch.randint(max(1, s // 4), s + 1, (b,), generator=g)
        lengths[0] = s                                        # the longest fills the padded batch
        pad = torch.arange(s) >= lengths[:, None]
        ids = ids.masked_fill(pad, 0)
        if arch == "packed-gru-encoder":
            tags = torch.randint(0, int(overrides.get("tags", 9)), (b, s), generator=g)
            return {"input_ids": ids, "lengths": lengths, "labels": tags.masked_fill(pad, -100)}
        return {"input_ids": ids, "lengths": lengths,
                "labels": torch.randint(0, int(overrides.get("classes", 4)), (b,), generator=g)}
    batch = {"input_ids": ids, "labels": torch.randint(0, vocab, (b, s), generator=g)}
    if arch in ("encoder-lm", "decoder-lm", "mha-lm", "mha-weights-lm", "seq2seq", "mha-seqfirst-lm"):
        batch["padding_mask"] = _padding_mask(ids)
    return batch


def tiny_overrides(arch: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The CI size of a hand-built model: 2 layers, width 64, vocabulary 512 (an RNN's projection and embedding
    widths, where it has its own, 32; UNets: base 8, depth 2; the audio net: 8 channels, depth 2; the recommender:
    2 tables of 1000 rows, width 16)."""
    if arch in UNETS:
        return dict(overrides, base=8, depth=2)
    if arch == "conv1d-audio":
        return dict(overrides, channels=8, depth=2)
    if arch == "embbag-rec":
        return dict(overrides, tables=2, rows=1000, dim=16, mlp=32)
    if arch == "unet3d":
        return dict(overrides, base=4, depth=2)
    if arch == "sr-pixelshuffle":
        return dict(overrides, channels=8, blocks=2)
    if arch == "wavenet":
        return dict(overrides, channels=8, skip=16, layers=3, stacks=1)
    o = dict(overrides, vocab=512, layers=2)
    if arch in RNNS:
        return dict(o, hidden=64, **{k: 32 for k in ("proj", "embed") if o.get(k)})
    return dict(o, d_model=64, nhead=4, ff=128)


__all__ = ["BUILDERS", "RNNS", "UNETS", "build", "make_batch", "tiny_overrides"]
