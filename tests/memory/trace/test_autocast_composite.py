"""Composite ops under CUDA autocast: cross_entropy on bfloat16 logits runs LossNLL.cpp's
decomposition (bfloat16 log_softmax, float32 nll_loss), as on the GPU, not a float32 cross_entropy."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.memory.trace.fake import autocast_composite
from labkit.memory.trace.fake.fake_cuda import CudaAutocast, _AutocastState
from labkit.memory.trace.step import measure_step
from labkit.workloads import StepPolicy
from labkit.memory.trace.storage import StorageTracker


@pytest.mark.parametrize("kw", [
    {}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 2},
    {"weight": True}, {"weight": True, "reduction": "none"},
    {"label_smoothing": 0.1}, {"label_smoothing": 0.1, "weight": True, "ignore_index": 2},
    {"label_smoothing": 0.2, "reduction": "sum"}, {"label_smoothing": 0.2, "reduction": "none", "ignore_index": 1},
    {"probabilities": True}, {"probabilities": True, "weight": True, "label_smoothing": 0.1},
    {"probabilities": True, "reduction": "none"}, {"spatial": True}, {"spatial": True, "label_smoothing": 0.1},
])
def test_the_decomposition_computes_what_torch_computes(kw):
    kw = dict(kw)
    g = torch.Generator().manual_seed(0)
    spatial = kw.pop("spatial", False)
    x = torch.randn((3, 5, 4) if spatial else (6, 5), generator=g, dtype=torch.float64, requires_grad=True)
    if kw.pop("probabilities", False):
        t = torch.softmax(torch.randn(x.shape, generator=g, dtype=torch.float64), 1)
    else:
        t = torch.randint(0, 5, (3, 4) if spatial else (6,), generator=g)
    if kw.pop("weight", False):
        kw["weight"] = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    ours = autocast_composite.cross_entropy(x, t, **kw)
    ref = F.cross_entropy(x, t, **kw)
    torch.testing.assert_close(ours, ref)
    (g1,) = torch.autograd.grad(ours.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g1, g2)


def test_cuda_autocast_keeps_the_log_probabilities_in_bfloat16_and_casts_for_nll_loss():
    seen = []
    tr = StorageTracker(rounding=1, observers=(lambda f, a, k, o, ph: seen.append(
        (str(f), [x.dtype for x in a if isinstance(x, torch.Tensor)], getattr(o, "dtype", None))),))
    lin = nn.Linear(8, 16)
    mode = CudaAutocast(torch.bfloat16, _AutocastState())
    with tr:
        with mode:
            loss = F.cross_entropy(lin(torch.randn(4, 8)), torch.zeros(4, dtype=torch.long))
        loss.backward()
    ops = {name: (ins, out) for name, ins, out in seen}
    assert loss.dtype == torch.float32
    assert ops["aten._log_softmax.default"] == ([torch.bfloat16], torch.bfloat16)       # explicit dtype kept
    assert ops["aten.nll_loss_forward.default"][0][0] == torch.float32                  # nll_loss: float32 list
    assert ops["aten._log_softmax_backward_data.default"][1] == torch.bfloat16
    # a float32 input is left to torch's own kernel (the causal-LM losses upcast their logits first)
    with mode:
        assert not autocast_composite.decomposes_under_cuda_autocast("cross_entropy", (torch.randn(2, 3),), {})


class _MaskedLMHead(nn.Module):
    """An embedding, an output projection and ``nn.CrossEntropyLoss`` on its logits (BERT's MLM loss),
    at a size where the logits dominate the step (no bias: its gradient's reduction staging buffer
    would set the peak)."""

    def __init__(self, vocab: int, hidden: int, upcast: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.decoder = nn.Linear(hidden, vocab, bias=False)
        self.upcast = upcast

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(self.emb(input_ids))
        if self.upcast:
            logits = logits.float()
        return nn.CrossEntropyLoss()(logits.view(-1, logits.size(-1)), labels.view(-1))


def test_bfloat16_logits_peak_one_bfloat16_logits_below_upcast_logits():
    # On the GPU (LossNLL.cpp under CUDA autocast): bf16 logits keep bf16 log-probs (2 B/elem) and
    # nll_loss's float32 copy (4); nll_loss's backward adds a float32 gradient (4): 10 B per logit at
    # the loss-backward peak. Upcast logits keep float32 log-probs (4) through a float32 nll_loss
    # gradient (4) and log_softmax's float32 gradient (4): 12. Casting the whole loss to float32
    # (what fake mode did) predicts 12 for both.
    B, S, V, H = 4, 256, 16384, 16     # logits (168 MB at 10 B each) well above the two 32 MiB cuBLAS workspaces
    ids = torch.randint(0, V, (B, S))
    batch = {"input_ids": ids, "labels": ids}

    def peak(upcast: bool) -> int:
        rep = measure_step(lambda: _MaskedLMHead(V, H, upcast), batch, StepPolicy(precision="amp-bf16"),
                           device="fake-cuda", call=lambda m, b: m(**b), loss_fn=lambda out, b: out, steps=1)
        return rep.peak_bytes

    # the two peaks fall in different ops, whose 512-byte scalars (the loss, its gradient) differ
    assert abs(peak(True) - peak(False) - B * S * V * 2) <= 4 * 512
