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

The reserve and workspace sizes are cuDNN's (``cudnnGetRNNTempSpaceSizes``, closed source): the rules
below are the shape of the sizes cuDNN 9.19 returned on the H200 (``benchmarks/gpu/record_handmade.py --part
rnn``, ``data/measurements/measure/rnn_cudnn__h200.json``: ``nn.LSTM`` and ``nn.GRU``, 1 and 2 layers, hidden 256
and 1024, batch 16 and 64, 64 and 256 steps, float32 and bf16, 64 shapes). :func:`reserve_bytes` gives every
recorded reserve to the byte; :func:`workspace_bytes` gives the LSTM workspaces within 0.3% and the GRU ones
within 1.2%. Plain ``nn.RNN`` and bidirectional layers are not measured (:data:`ASSUMPTION`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes

# gates per cell (cuDNN's modes): RNN_RELU/RNN_TANH 1, LSTM 4, GRU 3
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
ASSUMPTION = ("cuDNN RNN reserve space and workspace from the sizes cuDNN 9.19 returned on the H200 for LSTM and GRU "
              "layers (rnn_cudnn__h200.json); plain RNN (tanh/relu) layers and bidirectional ones are not measured: "
              "taken by the same rule (a plain RNN's reserve as its activations and layer outputs, its workspace as "
              "an LSTM's)")

# hidden-sized vectors the reserve keeps per layer, direction, step and sample (see reserve_bytes); rnn: assumed
RESERVE_VECTORS = {"lstm": 5, "gru": 6, "rnn_relu": 1, "rnn_tanh": 1}
# bytes cuDNN adds to every reserve (all 64 recorded shapes)
RESERVE_EXTRA = 256
# hidden-sized vectors per step and sample in the workspace (see workspace_bytes): 6, but 5 for a GRU of more
# than one layer
WORKSPACE_STEP_VECTORS = 6
WORKSPACE_STEP_VECTORS_GRU_STACKED = 5
# the workspace's part per layer and direction: fixed bytes, and hidden-sized vectors per sample
WORKSPACE_LAYER_BYTES = 8 * 1024 * 1024
WORKSPACE_SAMPLE_VECTORS = 11


def reserve_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int,
                  elem: int) -> int:
    """Bytes of the training reserve space: for every layer, direction, time step and sample
    :data:`RESERVE_VECTORS` hidden-sized vectors (an LSTM's four gate activations and its cell state, a GRU's
    three gate activations and three recurrent pre-activations ``W_h h + b_h``, whose candidate part its backward
    needs), plus the output of every layer but the last (the next layer's input; the last one's is the call's
    output ``y``), plus :data:`RESERVE_EXTRA`. Exact on the 64 recorded shapes (e.g. a 2-layer LSTM, hidden 1024,
    batch 64 x 256 steps, float32: 738,197,760 bytes = 11 x 64 MiB + 256). That a GRU keeps more than an LSTM of
    the same shapes is what cuDNN reports (https://github.com/pytorch/pytorch/issues/2895)."""
    vectors = layers * directions * RESERVE_VECTORS[mode] + (layers - 1) * directions
    return vectors * seq * batch * hidden * elem + RESERVE_EXTRA


def workspace_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int, elem: int,
                    input_size: int | None = None) -> int:
    """Bytes of the forward/backward workspace (one block, the same size in the forward and in each backward
    call), in the shape the recorded sizes take (what cuDNN keeps in it is not documented):
    :data:`WORKSPACE_STEP_VECTORS` hidden-sized vectors per step and sample (5 for a stacked GRU), per layer and
    direction :data:`WORKSPACE_LAYER_BYTES` and :data:`WORKSPACE_SAMPLE_VECTORS` hidden-sized vectors per sample,
    and the bytes of the weight matrices (gates x hidden x (layer input + hidden) per layer and direction;
    ``input_size`` defaults to ``hidden``). E.g. a 2-layer LSTM, hidden 1024, batch 64 x 256 steps, float32:
    491,782,912 bytes recorded, 492,306,432 by the rule."""
    inp = hidden if input_size is None else input_size
    per_step = WORKSPACE_STEP_VECTORS_GRU_STACKED if mode == "gru" and layers > 1 else WORKSPACE_STEP_VECTORS
    weights = sum(GATES[mode] * hidden * ((inp if layer == 0 else directions * hidden) + hidden)
                  for layer in range(layers)) * directions
    per_layer = WORKSPACE_LAYER_BYTES + WORKSPACE_SAMPLE_VECTORS * batch * hidden * elem
    return (directions * per_step * seq * batch * hidden + weights) * elem + layers * directions * per_layer


def _numel(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in ts)


class _CudnnRNN(torch.autograd.Function):
    """The memory of ``_cudnn_rnn`` and its backward on fake tensors, allocated and freed in ``RNN.cpp``'s order
    (shapes and lifetimes; no values)."""

    @staticmethod
    def forward(ctx: Any, meta: dict, x: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor | None,
                *weights: torch.Tensor) -> Any:
        mode = meta["mode"]
        seq, batch = meta["packed"] or (x.shape[0], x.shape[1])
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        # _cudnn_rnn: x = input.contiguous() (a copy of a batch_first input's transpose), the output, hy, cy,
        # the workspace, the reserve (training); the copy and the workspace are freed on return
        xc = x.contiguous()
        # (seq, batch, .) or packed (tokens, .); an LSTM with proj_size outputs its projection (RNN.cpp _output_size)
        y = x.new_empty(*x.shape[:-1], dirs * hx.shape[-1])
        hy = hx.new_empty(hx.shape)
        cy = cx.new_empty(cx.shape) if cx is not None else None
        ws = x.new_empty(workspace_bytes(mode, layers, dirs, seq, batch, hidden, elem, x.shape[-1]),
                         dtype=torch.uint8)
        if meta["train"]:
            reserve = x.new_empty(reserve_bytes(mode, layers, dirs, seq, batch, hidden, elem), dtype=torch.uint8)
        else:
            reserve = x.new_empty(0, dtype=torch.uint8)
        del xc, ws
        wbuf = meta.get("weight_buf")
        ctx.meta = meta
        ctx.save_for_backward(x, hx, *([cx] if cx is not None else []), y, reserve,
                              *([wbuf] if wbuf is not None else []))
        ctx.shapes = [w.shape for w in weights]
        ctx.wdtype = weights[0].dtype if weights else x.dtype
        ctx.has_cx = cx is not None
        ctx.mark_non_differentiable(reserve)
        # the reserve has no gradient: autograd must not make a zero one for backward (_cudnn_rnn's derivative
        # takes grads[0..2] only, tools/autograd/derivatives.yaml)
        ctx.set_materialize_grads(False)
        return (y, hy, cy, reserve) if cy is not None else (y, hy, reserve)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        meta = ctx.meta
        mode = meta["mode"]
        saved = ctx.saved_tensors
        x, hx = saved[0], saved[1]
        cx = saved[2] if ctx.has_cx else None
        y = saved[3 if ctx.has_cx else 2]
        gy, ghy = grads[0], grads[1]
        gcy = grads[2] if ctx.has_cx else None
        if gy is None and ghy is None and gcy is None:          # _cudnn_rnn_backward: nothing to do
            return (None,) * (4 + len(ctx.shapes))
        seq, batch = meta["packed"] or (x.shape[0], x.shape[1])
        hidden, layers, dirs = meta["hidden"], meta["layers"], meta["dirs"]
        elem = x.element_size()
        ws_bytes = workspace_bytes(mode, layers, dirs, seq, batch, hidden, elem, x.shape[-1])
        # _cudnn_rnn_backward: zeros for the gradients nobody gave (an unused output, hy or cy)
        gy = torch.zeros_like(y) if gy is None else gy
        ghy = torch.zeros_like(hx) if ghy is None else ghy
        gcy = torch.zeros_like(cx) if cx is not None and gcy is None else gcy
        # _cudnn_rnn_backward_input: x = input.contiguous(), dy = grad_output.contiguous() (copies of a
        # batch_first module's transposed views), dx, dhx, dcx, the workspace; the copies and the workspace are
        # freed on return
        xc, dyc = x.contiguous(), gy.contiguous()
        dx = x.new_empty(x.shape)
        dhx = hx.new_empty(hx.shape)
        dcx = cx.new_empty(cx.shape) if cx is not None else None
        ws = x.new_empty(ws_bytes, dtype=torch.uint8)
        del xc, dyc, ws
        # _cudnn_rnn_backward_weight: x = input.contiguous() again, one zeroed flat dw, the workspace; the
        # weights' gradients are views of dw
        xc = x.contiguous()
        total = sum(math.prod(s) for s in ctx.shapes)
        dw = torch.zeros(total, dtype=ctx.wdtype, device=x.device)
        ws = x.new_empty(ws_bytes, dtype=torch.uint8)
        del xc, ws
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
    with _disable_current_modes():
        real = torch.tensor(values, dtype=torch.int64)
        return mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)


def _values(t: Any) -> list[int] | None:
    """The values a fake tensor knows (its ``constant``, read outside the fake mode), or None."""
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
