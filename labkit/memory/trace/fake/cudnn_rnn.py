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

Backward (``_cudnn_rnn_backward``; the reserve has no gradient, derivatives.yaml): zeros for the gradients nobody
gave (an unused output, ``hy``, ``cy``); ``_cudnn_rnn_backward_input`` makes the input and ``dy`` contiguous (copies
where they are the transposed views of a ``batch_first`` module), ``dx`` (seq, batch, input), ``dhx``, ``dcx`` and a
workspace; ``_cudnn_rnn_backward_weight`` the contiguous input again, a zeroed flat ``dw`` (the weight buffer's size
and dtype) and a workspace; the weights' gradients are views of ``dw``.

The reserve and workspace sizes are cuDNN's (``cudnnGetRNNTempSpaceSizes``, closed source): the rules below are
the shape of the sizes cuDNN 9.19 returned on the H200 (``benchmarks/gpu/record_handmade.py --part rnn``:
``rnn_cudnn__h200.json``, 64 unidirectional LSTM/GRU shapes; ``benchmarks/gpu/record_rnn.py``:
``rnn_grid__h200.json``, 157 configurations: LSTM, GRU, RNN-tanh/relu, 1-3 layers, uni- and bidirectional, hidden
64-2048, packed, ``proj_size``, dropout, float32/bfloat16/float16, training and inference; the rules fitted on its
reference third). :func:`reserve_bytes` gives every recorded reserve to the byte; :func:`workspace_bytes` the
standard algorithm's training workspaces within 0.6% on the grid's held-out unpacked rows, 0.75% on the reference
ones (packed: exact on the reference rows, within 1.5% on the held-out but a stacked unidirectional plain RNN's,
+21%, a kind no reference row had). Not modelled (stated where
they apply): cuDNN's persistent algorithms (:func:`cudnn_algo`; :data:`PERSIST_ASSUMPTION`) and the inference
workspace, taken as the training one (:data:`ASSUMPTION`). A training RNN with inter-layer dropout also makes
cuDNN's dropout state once per process (:data:`DROPOUT_STATE_BYTES`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes

# gates per cell (cuDNN's modes): RNN_RELU/RNN_TANH 1, LSTM 4, GRU 3
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
ASSUMPTION = ("cuDNN RNN reserve space and workspace from the sizes cuDNN 9.19 returned on the H200 for the standard "
              "algorithm in training (rnn_cudnn__h200.json, rnn_grid__h200.json); in inference (eval()) the "
              "training workspace is taken (the grid's inference workspaces are that or smaller)")
PERSIST_ASSUMPTION = ("cuDNN's persistent RNN algorithm (RNN.cpp get_algo: a hidden size up to 192, or one float16 "
                      "unidirectional layer) is not modelled: its workspace taken as the standard algorithm's, which "
                      "the H200 grid found 25-70% smaller")


def cudnn_algo(mode: str, layers: int, directions: int, hidden: int, input_size: int, batch: int, seq: int,
               half: bool, packed: bool, proj: int, forward: bool, sm: tuple[int, int], sm_count: int) -> str:
    """The algorithm ``RNN.cpp``'s ``get_algo`` picks: ``standard`` for projections and packed input, else
    ``persist_static_small_h`` for small hidden sizes (forward: 384 for plain RNNs, 192 for LSTM/GRU; backward: 256 and
    128) on sm >= 6, else ``persist_static`` for float16 with one unidirectional layer whose sizes are multiples of
    128 up to 1024 (``use_persist_common_heuristics``) at the batch sizes ``use_persist_device_heuristics`` takes."""
    if proj or packed:
        return "standard"
    plain = mode.startswith("rnn")
    if sm[0] >= 6 and hidden <= ((384 if plain else 192) if forward else (256 if plain else 128)):
        return "persist_static_small_h"
    if not half or not (layers == 1 and directions == 1 and hidden <= 1024 and hidden % 128 == 0
                        and input_size % 128 == 0):
        return "standard"
    if sm[0] == 7:
        device = sm[1] != 5 and ((batch % 16 == 0 and batch not in (80, 112)) or batch == 8) and (
            (seq >= 40 and batch <= 128) or (seq >= 20 and batch <= 96) or (seq >= 10 and batch <= 32))
    elif sm[0] >= 8 and sm_count >= 98 and sm[1] != 6:
        device = mode != "gru" and batch % 8 == 0 and batch <= 128 and (mode == "lstm" or batch < 96 or hidden < 896)
    else:
        device = False
    return "persist_static" if device else "standard"


# hidden-sized vectors the reserve keeps per layer, direction, step and sample (see reserve_bytes)
RESERVE_VECTORS = {"lstm": 5, "gru": 6, "rnn_relu": 1, "rnn_tanh": 1}
# bytes cuDNN adds to every reserve (all recorded shapes)
RESERVE_EXTRA = 256
# the standard algorithm's workspace (see workspace_bytes), by cell family ("lstm"; "gru" and plain RNNs: "gru/rnn"),
# directions and whether layers are stacked: (hidden-sized vectors per step and sample, hidden-sized vectors per
# layer, direction and sample)
WORKSPACE_STEP = {("lstm", 1, False): (6, 11), ("lstm", 1, True): (6, 10), ("lstm", 2, False): (15, 12),
                  ("lstm", 2, True): (15, 12), ("gru/rnn", 1, False): (6, 5), ("gru/rnn", 1, True): (5, 14),
                  ("gru/rnn", 2, False): (12, 7), ("gru/rnn", 2, True): (14, 7)}
# a bidirectional single-layer GRU keeps one hidden-sized vector per step more than a plain RNN
WORKSPACE_STEP_GRU_BIDIR_SINGLE = 1
# input-width vectors per step and sample, by family and directions: (below the hidden size, above it)
WORKSPACE_INPUT = {("lstm", 1): (1, 3), ("lstm", 2): (1, 5), ("gru/rnn", 1): (2, 3), ("gru/rnn", 2): (2, 6)}
# the workspace's fixed part per layer and direction
WORKSPACE_LAYER_BYTES = 8 * 1024 * 1024
# a packed batch's workspace: hidden-sized vectors per token, by cell, directions and (single, stacked) layers; and
# hidden-sized vectors per layer, direction and sample: by cell, 2 more for a bidirectional layer (a GRU's or plain
# RNN's input narrower than its hidden size costs nothing more there)
WORKSPACE_PACKED = {("lstm", 1): (4, 4), ("lstm", 2): (12, 12), ("gru", 1): (3, 3), ("gru", 2): (10, 10),
                    ("rnn", 1): (2, 2), ("rnn", 2): (6, 8)}
WORKSPACE_PACKED_SAMPLES = {"lstm": 6, "gru": 3, "rnn": 1}
# cuDNN's dropout state (cudnnDropoutGetStatesSize, RNN.cpp get_dropout_state: allocated once per process for the
# first training RNN with inter-layer dropout): the bytes torch._cudnn_init_dropout_state returned on the H200
# (rnn_grid__h200.json, dropout_state_bytes)
DROPOUT_STATE_BYTES = 6488064


def reserve_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int,
                  elem: int, *, tokens: int | None = None, proj: int = 0, dropout: bool = False) -> int:
    """Bytes of the training reserve space: for every layer, direction, time step and sample
    :data:`RESERVE_VECTORS` hidden-sized vectors (an LSTM's four gate activations and its cell state, a GRU's
    three gate activations and three recurrent pre-activations ``W_h h + b_h``, whose candidate part its backward
    needs, a plain RNN's activation), plus the output of every layer but the last (the next layer's input; the last
    one's is the call's output ``y``), plus :data:`RESERVE_EXTRA`. A packed batch keeps them for its ``tokens``
    (the sum of the lengths), not ``seq x batch``; an LSTM with ``proj_size`` keeps five projection-sized vectors
    more per layer and direction; inter-layer dropout one bit per element of every later layer's input, per
    direction. Exact on the 64 unidirectional shapes of rnn_cudnn__h200.json and the 157 of rnn_grid__h200.json
    (bidirectional, packed, plain RNNs, projections, dropout): e.g. a 2-layer LSTM, hidden 1024, batch 64 x 256
    steps, float32: 738,197,760 bytes = 11 x 64 MiB + 256. That a GRU keeps more than an LSTM of the same shapes
    is what cuDNN reports (https://github.com/pytorch/pytorch/issues/2895)."""
    n = seq * batch if tokens is None else tokens
    per = layers * directions * (RESERVE_VECTORS[mode] * hidden + (5 * proj if proj else 0))
    per += (layers - 1) * directions * hidden
    mask = (layers - 1) * directions * directions * hidden * n // 8 if dropout else 0
    return per * n * elem + mask + RESERVE_EXTRA


def weight_count(mode: str, layers: int, directions: int, hidden: int, input_size: int, proj: int = 0) -> int:
    """Elements of the weight matrices (gates x hidden x (layer input + output) per layer and direction, and the
    projection), as cuDNN's flat buffer holds them (biases aside)."""
    out = proj or hidden
    return directions * sum(GATES[mode] * hidden * ((input_size if layer == 0 else directions * out) + out)
                            + hidden * proj for layer in range(layers))


def workspace_bytes(mode: str, layers: int, directions: int, seq: int, batch: int, hidden: int, elem: int,
                    input_size: int | None = None, *, tokens: int | None = None, proj: int = 0) -> int:
    """Bytes of the standard algorithm's workspace (one block, the same size in the forward and in each backward
    call), in the shape cuDNN 9.19's sizes take on the H200 (what it keeps in it is not documented): per step and
    sample :data:`WORKSPACE_STEP` hidden-sized vectors (by cell family, directions, stacked layers) and
    :data:`WORKSPACE_INPUT` input-width vectors for the input's width beyond or short of the hidden size, the weight
    matrices, and per layer and direction :data:`WORKSPACE_LAYER_BYTES` and hidden-sized vectors per sample. A
    packed batch's steps are its ``tokens``. Recorded: rnn_cudnn__h200.json (64 unidirectional LSTM/GRU shapes)
    and rnn_grid__h200.json (fitted on its reference third; the held-out third's errors in
    tests/memory/trace/test_cudnn_rnn.py). E.g. a 2-layer LSTM, hidden 1024, batch 64 x 256 steps, float32:
    491,782,912 bytes recorded, 491,782,144 by the rule."""
    inp = hidden if input_size is None else input_size
    fam = "lstm" if mode == "lstm" else "gru/rnn"
    if tokens is not None:
        cell = mode if mode in ("lstm", "gru") else "rnn"
        below, above = WORKSPACE_INPUT[(fam, directions)]
        below = below if fam == "lstm" else 0
        width = (WORKSPACE_PACKED[(cell, directions)][layers > 1] * hidden + below * (min(inp, hidden) - hidden)
                 + above * (max(inp, hidden) - hidden) + directions * proj)
        samples = WORKSPACE_PACKED_SAMPLES[cell] + 2 * (directions - 1)
        return ((tokens * width + weight_count(mode, layers, directions, hidden, inp, proj)) * elem
                + layers * directions * (WORKSPACE_LAYER_BYTES + samples * batch * hidden * elem))
    vec, samples = WORKSPACE_STEP[(fam, directions, layers > 1)]
    if mode == "gru" and directions == 2 and layers == 1:
        vec += WORKSPACE_STEP_GRU_BIDIR_SINGLE
    below, above = WORKSPACE_INPUT[(fam, directions)]
    width = vec * hidden + below * (min(inp, hidden) - hidden) + above * (max(inp, hidden) - hidden)
    width += directions * proj
    per_layer = WORKSPACE_LAYER_BYTES + samples * batch * hidden * elem
    weights = weight_count(mode, layers, directions, hidden, inp, proj)
    return (seq * batch * width + weights) * elem + layers * directions * per_layer


def _numel(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in ts)


class _CudnnRNN(torch.autograd.Function):
    """The memory of ``_cudnn_rnn`` and its backward on fake tensors, allocated and freed in ``RNN.cpp``'s order
    (shapes and lifetimes; no values)."""

    @staticmethod
    def forward(ctx: Any, meta: dict, x: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor | None,
                *weights: torch.Tensor) -> Any:
        elem = x.element_size()
        # _cudnn_rnn: x = input.contiguous() (a copy of a batch_first input's transpose), the output, hy, cy,
        # the workspace, the reserve (training); the copy and the workspace are freed on return
        xc = x.contiguous()
        # (seq, batch, .) or packed (tokens, .); an LSTM with proj_size outputs its projection (RNN.cpp _output_size)
        y = x.new_empty(*x.shape[:-1], meta["dirs"] * hx.shape[-1])
        hy = hx.new_empty(hx.shape)
        cy = cx.new_empty(cx.shape) if cx is not None else None
        ws = x.new_empty(_sizes(meta, x, elem)[0], dtype=torch.uint8)
        if meta["train"]:
            reserve = x.new_empty(_sizes(meta, x, elem)[1], dtype=torch.uint8)
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
        saved = ctx.saved_tensors
        x, hx = saved[0], saved[1]
        cx = saved[2] if ctx.has_cx else None
        y = saved[3 if ctx.has_cx else 2]
        gy, ghy = grads[0], grads[1]
        gcy = grads[2] if ctx.has_cx else None
        if gy is None and ghy is None and gcy is None:          # _cudnn_rnn_backward: nothing to do
            return (None,) * (4 + len(ctx.shapes))
        ws_bytes = _sizes(meta, x, x.element_size())[0]
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


def _sizes(meta: dict, x: torch.Tensor, elem: int) -> tuple[int, int]:
    """The call's workspace and training reserve bytes (``x``: the sequence-major or packed input)."""
    seq, batch = meta["packed"] or (x.shape[0], x.shape[1])
    tokens = x.shape[0] if meta["packed"] else None
    shape = (meta["mode"], meta["layers"], meta["dirs"], seq, batch, meta["hidden"], elem)
    return (workspace_bytes(*shape, x.shape[-1], tokens=tokens, proj=meta["proj"]),
            reserve_bytes(*shape, tokens=tokens, proj=meta["proj"], dropout=meta["dropout"] > 0))


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


def run_cudnn_rnn(mode: str, args: tuple, kwargs: dict, tracker: Any, autocast_dtype: torch.dtype | None,
                  target: Any = None, assume: Any = None) -> Any:
    """``torch._VF.<mode>(input, hx, weights, bias, num_layers, dropout, train, bidirectional, batch_first)``
    as cuDNN runs it (see the module docstring); the packed form ``(data, batch_sizes, hx, weights, bias,
    num_layers, dropout, train, bidirectional)`` with the batch sizes :func:`pack_padded` made (cuDNN sizes the
    reserve and workspace by the packed tokens); else ``NotImplemented``. ``target`` (a ``CudaTarget``) and
    ``assume`` state where cuDNN would pick a persistent algorithm (:data:`PERSIST_ASSUMPTION`)."""
    if kwargs or len(args) != 9:
        return NotImplemented
    if isinstance(args[1], torch.Tensor) and isinstance(args[3], (list, tuple)):      # a PackedSequence
        sizes = _values(args[1])
        if not sizes:
            return NotImplemented
        data, _, hx, weights, _bias, layers, dropout, train, bidir = args
        return _run(mode, data, hx, list(weights), layers, float(dropout), train, bidir, False, tracker,
                    autocast_dtype, packed=(len(sizes), sizes[0]), target=target, assume=assume)
    if not isinstance(args[2], (list, tuple)):
        return NotImplemented
    x, hx, weights, _bias, layers, dropout, train, bidir, batch_first = args
    return _run(mode, x, hx, list(weights), layers, float(dropout), train, bidir, batch_first, tracker,
                autocast_dtype, target=target, assume=assume)


def _run(mode: str, x: torch.Tensor, hx: Any, weights: list, layers: int, dropout: float, train: bool, bidir: bool,
         batch_first: bool, tracker: Any, autocast_dtype: torch.dtype | None,
         packed: tuple[int, int] | None = None, target: Any = None, assume: Any = None) -> Any:
    if mode == "lstm":
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    dirs = 2 if bidir else 1
    hidden = c0.shape[-1] if c0 is not None else h0.shape[-1]
    proj = h0.shape[-1] if c0 is not None and h0.shape[-1] != hidden else 0
    if train and dropout > 0 and not getattr(tracker, "cudnn_dropout_state", False):
        # RNN.cpp get_dropout_state: the state is made once per process, before the first such call, and kept
        tracker.hold(DROPOUT_STATE_BYTES)
        tracker.cudnn_dropout_state = True
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
    if target is not None and assume is not None:
        seq, batch = packed or ((x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1]))
        if any(cudnn_algo(mode, layers, dirs, hidden, x.shape[-1], batch, seq, x.dtype == torch.float16,
                          packed is not None, proj, fwd, tuple(target.sm), target.sm_count) != "standard"
               for fwd in ((True, False) if train else (True,))):
            assume(PERSIST_ASSUMPTION)
    xs = x.transpose(0, 1) if batch_first else x         # RNN.cpp: a view; its contiguous copy is transient
    meta = {"mode": mode, "hidden": hidden, "layers": layers, "dirs": dirs, "train": train, "proj": proj,
            "dropout": dropout if train else 0.0, "weight_buf": weight_buf, "packed": packed}
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


__all__ = ["ASSUMPTION", "DROPOUT_STATE_BYTES", "GATES", "PACKED_ASSUMPTION", "PERSIST_ASSUMPTION", "cudnn_algo",
           "pack_padded", "pad_packed", "reserve_bytes", "run_cudnn_rnn", "weight_count", "workspace_bytes"]
