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
        seq, batch = meta["packed"] or (x.shape[0], x.shape[1])
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        y = x.new_empty(*x.shape[:-1], dirs * hidden)          # (seq, batch, .) or packed (tokens, .)
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
        seq, batch = meta["packed"] or (x.shape[0], x.shape[1])
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        if gy is None:
            gy = x.new_zeros(*x.shape[:-1], dirs * hidden)
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


PACKED_ASSUMPTION = ("pack_padded_sequence's lengths are tensor values fake mode does not have: every sequence "
                     "taken at the full padded length (the most memory)")


def _constant(mode: Any, values: list[int]) -> torch.Tensor:
    """A CPU int64 fake tensor that knows its values (made as FakeTensorMode makes its constants: the real
    tensor outside every mode)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        real = torch.tensor(values, dtype=torch.int64)
        return mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)


def _values(t: Any) -> list[int] | None:
    """The values a fake tensor knows (its ``constant``, read outside the fake mode), or None."""
    from torch.utils._python_dispatch import _disable_current_modes

    known = getattr(t, "constant", None)
    if known is None:
        return None
    with _disable_current_modes():
        return [int(v) for v in known.tolist()]


def pack_padded(args: tuple, kwargs: dict, assume: Any) -> Any:
    """``torch._VF._pack_padded_sequence(input, lengths, batch_first)`` in fake mode: its output's size is the
    sum of the lengths, values fake tensors lack unless they are known (a constant); otherwise every sequence
    is taken at its full padded length (:data:`PACKED_ASSUMPTION`). Returns ``(data, batch_sizes)``,
    ``batch_sizes`` a CPU int64 tensor that knows its values (``nn.LSTM`` and ``pad_packed_sequence`` read
    them)."""
    p = dict(zip(("input", "lengths", "batch_first"), args))
    p.update(kwargs)
    x, lengths, batch_first = p["input"], p["lengths"], bool(p["batch_first"])
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    lens = _values(lengths)
    if lens is None:
        assume(PACKED_ASSUMPTION)
        lens = [steps] * batch
    sizes = [sum(1 for n in lens if n > t) for t in range(max(lens))]
    return _PackPadded.apply(x, (sum(lens), *x.shape[2:])), _constant(x.fake_mode, sizes)


class _PackPadded(torch.autograd.Function):
    """``_pack_padded_sequence``'s memory: the packed data; backward, the padded input's gradient (its CPU
    kernels read the batch sizes' data before any dispatch: fake mode answers the call as a whole)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: tuple) -> torch.Tensor:
        ctx.x_shape = x.shape
        return x.new_empty(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad.new_zeros(ctx.x_shape), None


class _PadPacked(torch.autograd.Function):
    """``_pad_packed_sequence``'s memory: the padded output; backward, the packed data's gradient."""

    @staticmethod
    def forward(ctx: Any, data: torch.Tensor, shape: tuple) -> torch.Tensor:
        ctx.data_shape = data.shape
        return data.new_zeros(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad.new_empty(ctx.data_shape), None


def pad_packed(args: tuple, kwargs: dict) -> Any:
    """``_pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)`` in fake mode, from
    the batch sizes :func:`pack_padded` made: ``(padded, lengths)``; else ``NotImplemented``. (Its CPU kernel
    reads the batch sizes' data itself, before any dispatch: fake mode answers the call as a whole.)"""
    p = dict(zip(("data", "batch_sizes", "batch_first", "padding_value", "total_length"), args))
    p.update(kwargs)
    data, sizes = p["data"], _values(p["batch_sizes"])
    if not sizes:
        return NotImplemented
    batch, steps = sizes[0], max(int(p["total_length"]), len(sizes))
    shape = (batch, steps) if p["batch_first"] else (steps, batch)
    lens = [sum(1 for b in sizes if b > i) for i in range(batch)]
    return _PadPacked.apply(data, (*shape, *data.shape[1:])), _constant(data.fake_mode, lens)


def run_cudnn_rnn(mode: str, args: tuple, kwargs: dict, tracker: Any, autocast_dtype: torch.dtype | None) -> Any:
    """``torch._VF.<mode>(input, hx, weights, bias, num_layers, dropout, train, bidirectional, batch_first)``
    as cuDNN runs it (see the module docstring); the packed form ``(data, batch_sizes, hx, weights, bias,
    num_layers, dropout, train, bidirectional)`` with the batch sizes :func:`pack_padded` made (cuDNN sizes the
    reserve for the longest sequence times the batch); else ``NotImplemented``."""
    if kwargs or len(args) != 9:
        return NotImplemented
    if isinstance(args[1], torch.Tensor) and isinstance(args[3], (list, tuple)):      # a PackedSequence
        sizes = _values(args[1])
        if not sizes:
            return NotImplemented
        data, _, hx, weights, _bias, layers, _dropout, train, bidir = args
        return _run(mode, data, hx, list(weights), layers, train, bidir, False, tracker, autocast_dtype,
                    packed=(len(sizes), sizes[0]))
    if not isinstance(args[2], (list, tuple)):
        return NotImplemented
    x, hx, weights, _bias, layers, _dropout, train, bidir, batch_first = args
    return _run(mode, x, hx, list(weights), layers, train, bidir, batch_first, tracker, autocast_dtype)


def _run(mode: str, x: torch.Tensor, hx: Any, weights: list, layers: int, train: bool, bidir: bool,
         batch_first: bool, tracker: Any, autocast_dtype: torch.dtype | None,
         packed: tuple[int, int] | None = None) -> Any:
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
            "weight_buf": weight_buf, "packed": packed}
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


__all__ = ["ASSUMPTION", "GATES", "PACKED_ASSUMPTION", "pack_padded", "pad_packed", "reserve_bytes", "run_cudnn_rnn",
           "workspace_bytes"]
