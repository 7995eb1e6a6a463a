"""``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` as a CUDA GPU runs them: cuDNN's ``_cudnn_rnn``, in fake mode.

On the CPU, fake mode's ``torch._VF.lstm`` runs oneDNN's ``mkldnn_rnn_layer``, whose fake kernel returns an
empty workspace (``torch/_meta_registrations.py``: ``mkldnn_rnn_layer`` and, for ``_cudnn_rnn``, "TODO: Query
cudnnGetRNNTrainingReserveSize": ``reserve_shape = 0``). On a GPU the same call is one ``_cudnn_rnn`` over
all layers (``aten/src/ATen/native/cudnn/RNN.cpp``), which allocates, in this order:

* a contiguous (seq, batch, features) copy of a ``batch_first`` input (``input.transpose(0, 1)``, then
  ``input.contiguous()``), freed on return;
* the output ``y`` (seq, batch, directions x hidden), ``hy`` and, for an LSTM, ``cy``
  (layers x directions, batch, hidden);
* the workspace and, in training, the reserve space, both sized by ``cudnnGetRNNTempSpaceSizes``
  (``_cudnn_get_workspace_and_reserve_size``): the workspace is freed on return, the reserve is an output
  autograd keeps for backward (with the input, ``hx``, ``cx``, the output and the weight buffer);
* no weight buffer where the module's weights are already one flat buffer (``flatten_parameters``, which
  ``nn.RNNBase`` calls at construction on a GPU, and after ``.to``), a flat copy where they are not.

Under autocast, ``_cudnn_rnn`` is dispatched through ``_cudnn_rnn_cast_reflatten``
(``aten/src/ATen/cudnn/AutocastRNN.cpp``): the input and ``hx``/``cx`` are cast to float16 (``kHalf``, whatever
the autocast dtype: bfloat16 autocast runs cuDNN's RNN in float16, the same bytes) and the weights are cast
*and re-flattened* into a new flat float16 buffer (``copy_weights_to_flat_buf_views``), which the backward
keeps.

Backward (``_cudnn_rnn_backward``): ``_cudnn_rnn_backward_input`` makes ``dy`` contiguous (a copy where the
output's gradient is the transposed view a ``batch_first`` module returns), ``dx`` (seq, batch, input),
``dhx``, ``dcx`` and a workspace; ``_cudnn_rnn_backward_weight`` a zeroed flat ``dw`` (the weight buffer's size
and dtype) and a workspace; the weights' gradients are views of ``dw``.

The reserve and workspace sizes are cuDNN's (closed source): :func:`reserve_bytes` and
:func:`workspace_bytes` state the rule used and :data:`ASSUMPTION` says so in the report;
``benchmarks/gpu/record_handmade.py --part rnn`` records the sizes cuDNN returns on the H200.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

# gates per cell (cuDNN's modes): RNN_RELU/RNN_TANH 1, LSTM 4, GRU 3
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
ASSUMPTION = ("cuDNN RNN reserve space taken as the gate activations, the cell state or recurrent "
              "pre-activations and the layer's output per layer, direction, step and sample; workspace as one "
              "layer's input projections for every step (cudnnGetRNNTempSpaceSizes is not modelled from a recording "
              "yet: benchmarks/gpu/record_handmade.py --part rnn records it)")


# hidden-sized vectors the reserve keeps per layer, direction, step and sample (see reserve_bytes)
RESERVE_VECTORS = {"lstm": 4 + 1 + 1, "gru": 3 + 3 + 1, "rnn_relu": 1 + 1, "rnn_tanh": 1 + 1}


def reserve_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int,
                  elem: int) -> int:
    """Bytes of the training reserve space: for every layer, direction, time step and sample, what the
    backward pass reads back (:data:`RESERVE_VECTORS` vectors of ``hidden``): an LSTM's four gate activations,
    its cell state and its output; a GRU's three gate activations, the three recurrent pre-activations
    (``W_h h + b_h``: the candidate gate's backward needs its part, the GEMM makes all three) and its output; a
    plain RNN's pre-activation and output. That a GRU keeps more than an LSTM of the same shapes is what cuDNN
    reports (https://github.com/pytorch/pytorch/issues/2895: reserve 864,000,000 vs 736,000,000 bytes, a ratio
    of 1.17; 7/6 here)."""
    return layers * directions * seq * batch * RESERVE_VECTORS[mode] * hidden * elem


def workspace_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int, elem: int) -> int:
    """Bytes of the forward/backward workspace: the input projections of one layer for every step (cuDNN's
    standard algorithm computes them for the whole sequence at once)."""
    return directions * seq * batch * GATES[mode] * hidden * elem


def _numel(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in ts)


class _CudnnRNN(torch.autograd.Function):
    """The memory of ``_cudnn_rnn`` and its backward on fake tensors (shapes and lifetimes; no values)."""

    @staticmethod
    def forward(ctx: Any, meta: dict, x: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor | None,
                *weights: torch.Tensor) -> Any:
        tracker, mode = meta["tracker"], meta["mode"]
        seq, batch = x.shape[0], x.shape[1]
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        y = x.new_empty(seq, batch, dirs * hidden)
        hy = hx.new_empty(hx.shape)
        cy = cx.new_empty(cx.shape) if cx is not None else None
        if meta["train"]:
            reserve = x.new_empty(reserve_bytes(mode, layers, dirs, seq, batch, hidden, elem), dtype=torch.uint8)
        else:
            reserve = x.new_empty(0, dtype=torch.uint8)
        # input.contiguous() (a copy of a batch_first input's transpose) and the workspace, freed on return
        copy = 0 if x.is_contiguous() else x.numel() * elem
        tracker.transient_group([copy, workspace_bytes(mode, layers, dirs, seq, batch, hidden, elem)])
        wbuf = meta.get("weight_buf")
        ctx.meta = meta
        ctx.save_for_backward(x, hx, *( [cx] if cx is not None else []), y, reserve,
                              *([wbuf] if wbuf is not None else []))
        ctx.shapes = [w.shape for w in weights]
        ctx.wdtype = weights[0].dtype if weights else x.dtype
        ctx.has_cx = cx is not None
        ctx.mark_non_differentiable(reserve)
        return (y, hy, cy, reserve) if cy is not None else (y, hy, reserve)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        meta = ctx.meta
        tracker, mode = meta["tracker"], meta["mode"]
        saved = ctx.saved_tensors
        x, hx = saved[0], saved[1]
        gy = grads[0]
        seq, batch = x.shape[0], x.shape[1]
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        if gy is None:
            gy = x.new_zeros(seq, batch, dirs * hidden)
        # _cudnn_rnn_backward_input: dx, dhx, dcx; dy = grad_output.contiguous(), input.contiguous() and the
        # workspace live inside the call
        dx = x.new_empty(x.shape)
        dhx = hx.new_empty(hx.shape)
        dcx = hx.new_empty(hx.shape) if ctx.has_cx else None
        tracker.transient_group([0 if gy.is_contiguous() else gy.numel() * gy.element_size(),
                                 0 if x.is_contiguous() else x.numel() * elem,
                                 workspace_bytes(mode, layers, dirs, seq, batch, hidden, elem)])
        # _cudnn_rnn_backward_weight: one zeroed flat dw, the weights' gradients are views of it
        total = sum(math.prod(s) for s in ctx.shapes)
        dw = torch.zeros(total, dtype=ctx.wdtype, device=x.device)
        tracker.transient(workspace_bytes(mode, layers, dirs, seq, batch, hidden, elem))
        gws, off = [], 0
        for s in ctx.shapes:
            n = math.prod(s)
            gws.append(dw[off:off + n].view(s))
            off += n
        return (None, dx, dhx, dcx, *gws)


def run_cudnn_rnn(mode: str, args: tuple, kwargs: dict, tracker: Any, autocast_dtype: torch.dtype | None) -> Any:
    """``torch._VF.<mode>(input, hx, weights, bias, num_layers, dropout, train, bidirectional, batch_first)``
    as cuDNN runs it (see the module docstring), or ``NotImplemented`` for the packed-sequence form."""
    if kwargs or len(args) != 9 or not isinstance(args[2], (list, tuple)):
        return NotImplemented                        # packed sequences (batch_sizes): fake mode's own path
    x, hx, weights, _bias, layers, _dropout, train, bidir, batch_first = args
    weights = list(weights)
    if mode == "lstm":
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    dirs = 2 if bidir else 1
    hidden = c0.shape[-1] if c0 is not None else h0.shape[-1]
    weight_buf = None
    half = torch.float16                  # AutocastRNN.cpp casts to kHalf whatever the autocast dtype
    if autocast_dtype is not None and x.is_floating_point() and x.dtype != torch.float64 and weights[0].dtype != half:
        # _cudnn_rnn_cast_reflatten: input, hx, cx cast; the weights cast into one new flat buffer
        x = x.to(half)
        h0 = h0.to(half)
        c0 = c0.to(half) if c0 is not None else None
        weight_buf = torch.empty(_numel(weights), dtype=half, device=x.device)
        views, off = [], 0
        for w in weights:                     # the cast weights are views of the one buffer: no more storage
            views.append(weight_buf[off:off + w.numel()].view(w.shape))
            off += w.numel()
        weights = [_CastView.apply(w, v) for w, v in zip(weights, views)]
    xs = x.transpose(0, 1) if batch_first else x         # RNN.cpp: a view; its contiguous copy is transient
    meta = {"tracker": tracker, "mode": mode, "hidden": hidden, "layers": layers, "dirs": dirs, "train": train,
            "weight_buf": weight_buf}
    outs = _CudnnRNN.apply(meta, xs, h0, c0, *weights)
    y = outs[0].transpose(0, 1) if batch_first else outs[0]
    if mode == "lstm":
        return y, outs[1], outs[2]
    return y, outs[1]


class _CastView(torch.autograd.Function):
    """A weight as its autocast copy inside the flat buffer: forward returns the view, backward casts the
    gradient back to the weight's dtype (autocast's cast, ToCopyBackward)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        ctx.dtype = w.dtype
        return view.view_as(view)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g.to(ctx.dtype), None


__all__ = ["ASSUMPTION", "GATES", "reserve_bytes", "run_cudnn_rnn", "workspace_bytes"]
