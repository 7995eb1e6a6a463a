"""Fake mode under ``torch.inference_mode``: a CompositeImplicitAutograd op reaches the dispatch modes whole (no
Autograd key decomposed it), so fake mode runs its composite kernel with every op inside it tracked, as the GPU runs
it (fake_cuda.inference_decomposition). The case that found it: users' ``lstm_inference_val`` (an LSTM language
model's validation pass under inference_mode), whose peak is the logits and cross_entropy's ``_log_softmax`` of them."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.memory.script.runtime import fake_gpu

MiB = 1 << 20


def _extra_peak(fn, grad_mode) -> int:
    """Bytes ``fn`` takes above what is allocated before it, in a fresh fake GPU under ``grad_mode``."""
    with fake_gpu():
        args = [torch.randn(4096, 1024, device="cuda"), torch.zeros(4096, dtype=torch.long, device="cuda")]
        with grad_mode():
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(*args)
            return torch.cuda.max_memory_allocated() - base


def test_cross_entropy_under_inference_mode_holds_its_log_softmax():
    """cross_entropy_loss = _log_softmax (float32, the logits' size) then nll_loss: 16 MiB of logits take another
    16 MiB under inference_mode as under no_grad (before: only the loss, 512 bytes)."""
    extra = {m.__name__: _extra_peak(lambda x, t: F.cross_entropy(x, t), m)
             for m in (torch.no_grad, torch.inference_mode)}
    assert extra["inference_mode"] == extra["no_grad"]
    assert 16 * MiB <= extra["inference_mode"] < 17 * MiB


def test_linear_of_a_transposed_input_adds_its_bias_in_place_under_inference_mode():
    """Linear.cpp: an input it cannot flatten (an RNN's batch_first output, a transposed view) goes through matmul
    (a contiguous copy, then mm, which takes cuBLAS's 32 MiB workspace the first time) and the bias is added in
    place on a real tensor: one output, not two (before, the tracker saw aten.linear alone: the output, no
    workspace)."""
    lin = nn.Linear(1024, 4096)

    def run(x, _):
        return lin.cuda()(x.view(64, 64, 1024).transpose(0, 1))

    extra = _extra_peak(run, torch.inference_mode)
    weights, out = (4096 * 1024 + 4096) * 4, 4096 * 4096 * 4
    assert extra >= weights + out + 32 * MiB
    assert extra < weights + 2 * out


def test_eval_dropout_under_inference_mode_is_its_input():
    """Dropout.cpp: dropout in eval mode returns its input (torch._decomp's Python decomposition would clone it):
    nothing is allocated."""
    drop = nn.Dropout(0.2).eval()
    assert _extra_peak(lambda x, _: drop(x), torch.inference_mode) == 0
