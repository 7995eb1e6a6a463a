"""``nn.LSTMCell`` and ``nn.GRUCell`` as a CUDA build runs them: two matmuls, then one fused cell kernel.

``lstm_cell`` and ``gru_cell`` are composite ops (aten/src/ATen/native/RNN.cpp, ``LSTMCell`` and ``GRUCell``). On a
CUDA tensor they compute the input and hidden gates with two matmuls (``igates = input @ w_ih.T``, ``hgates = hx @
w_hh.T``) and call ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` (aten/src/ATen/native/cuda/RNN.cu), whose
kernel writes the new state and a workspace of the gates, ``(batch, 4 * hidden)`` for an LSTM and ``(batch, 5 *
hidden)`` for a GRU. Their derivative (tools/autograd/derivatives.yaml) names the gates, the biases, the old state
and the workspace, so autograd saves all of them: per step an LSTM cell keeps ``igates``, ``hgates`` and the
workspace (12 x hidden per sample) where a CPU build's composite (sigmoid and tanh in place on one ``gates`` tensor)
keeps about half as much. Fake mode runs on a CPU build, so it makes the CUDA path's allocations itself.

Measured on the H200 (torch 2.11, batch 256, input 512, hidden 1024, 8 steps, float32): an LSTM cell added 14 MiB
per step (4 + 4 + 4 for the gates and the workspace, 1 + 1 for hy and cy), a GRU cell 12 to 13 MiB; the CPU composite
gave 7 MiB for both (``_probe``-style measurements quoted in the commit that added this rule).

The backward kernels write the gates' gradient (one tensor for an LSTM, used for both matmuls; two for a GRU) and
the old state's, and sum the bias gradients from them. ``nn.RNNCell`` has no fused kernel: its cell is
``tanh(linear_hh(hx) + linear_ih(input))`` on the GPU too, and runs as composed.
"""

from __future__ import annotations

from typing import Any

import torch

_LSTM_PARAMS = ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh")


def run_fused_cell(kind: str, args: tuple, kwargs: dict) -> Any:
    """``torch._VF.lstm_cell`` / ``gru_cell`` with the CUDA path's allocations, or ``NotImplemented``."""
    p = dict(zip(_LSTM_PARAMS, args))
    p.update(kwargs)
    x, hx, w_ih, w_hh = p["input"], p["hx"], p["w_ih"], p["w_hh"]
    b_ih, b_hh = p.get("b_ih"), p.get("b_hh")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        return NotImplemented
    igates = torch.matmul(x, w_ih.t())
    if kind == "lstm":
        h, c = hx
        hgates = torch.matmul(h, w_hh.t())
        return _FusedLSTMCell.apply(igates, hgates, c, b_ih, b_hh)
    hgates = torch.matmul(hx, w_hh.t())
    return _FusedGRUCell.apply(igates, hgates, hx, b_ih, b_hh)


class _FusedLSTMCell(torch.autograd.Function):
    """``_thnn_fused_lstm_cell``: (hy, cy); saves the gates, the biases, cx, cy and the workspace."""

    @staticmethod
    def forward(ctx: Any, igates: torch.Tensor, hgates: torch.Tensor, cx: torch.Tensor, b_ih: Any, b_hh: Any) -> Any:
        workspace = torch.empty_like(igates, memory_format=torch.contiguous_format)
        hy = torch.empty_like(cx, memory_format=torch.contiguous_format)
        cy = torch.empty_like(cx, memory_format=torch.contiguous_format)
        biases = [b for b in (b_ih, b_hh) if b is not None]
        ctx.save_for_backward(igates, hgates, cx, cy, workspace, *biases)
        ctx.has_bias = bool(biases)
        ctx.set_materialize_grads(False)
        return hy, cy

    @staticmethod
    def backward(ctx: Any, grad_hy: Any, grad_cy: Any) -> Any:
        saved = ctx.saved_tensors
        cx, workspace = saved[2], saved[4]
        if grad_hy is None and grad_cy is None:
            return None, None, None, None, None
        grad_gates = torch.empty_like(workspace, memory_format=torch.contiguous_format)
        grad_cx = torch.empty_like(cx, memory_format=torch.contiguous_format)
        grad_bias = grad_gates.sum(0) if ctx.has_bias else None
        return grad_gates, grad_gates, grad_cx, grad_bias, grad_bias


class _FusedGRUCell(torch.autograd.Function):
    """``_thnn_fused_gru_cell``: hy; saves the gates, the biases, hx and the (batch, 5 * hidden) workspace."""

    @staticmethod
    def forward(ctx: Any, igates: torch.Tensor, hgates: torch.Tensor, hx: torch.Tensor, b_ih: Any, b_hh: Any) -> Any:
        hidden = hx.size(-1)
        hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
        workspace = igates.new_empty((hx.size(0), 5 * hidden))
        biases = [b for b in (b_ih, b_hh) if b is not None]
        ctx.save_for_backward(igates, hgates, hx, workspace, *biases)
        ctx.has_bias = bool(biases)
        ctx.set_materialize_grads(False)
        return hy

    @staticmethod
    def backward(ctx: Any, grad_hy: Any) -> Any:
        saved = ctx.saved_tensors
        hx, workspace = saved[2], saved[3]
        if grad_hy is None:
            return None, None, None, None, None
        hidden = hx.size(-1)
        grad_igates = workspace.new_empty((workspace.size(0), 3 * hidden))
        grad_hgates = workspace.new_empty((workspace.size(0), 3 * hidden))
        grad_hx = torch.empty_like(grad_hy, memory_format=torch.contiguous_format)
        gb_ih = grad_igates.sum(0) if ctx.has_bias else None
        gb_hh = grad_hgates.sum(0) if ctx.has_bias else None
        return grad_igates, grad_hgates, grad_hx, gb_ih, gb_hh


__all__ = ["run_fused_cell"]
