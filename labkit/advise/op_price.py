"""What one ATen op of a fake-mode step costs on the target GPU and on the host that issues it.

Rules, each from what PyTorch's CUDA build runs for that op, priced with the microbenchmarked
kernel table (:mod:`labkit.advise.kernel_table`):

* **GEMMs** (``mm``, ``addmm``, ``bmm``, ``baddbmm``): the recorded GEMM time at the op's (m, n, k),
  dtype and operand layout (read from the strides: a transposed operand is column-major), a batched
  one as one GEMM of ``batch x m`` rows. Float32 matmuls run without TF32 (PyTorch's default
  ``torch.backends.cuda.matmul.allow_tf32 = False``).
* **Grouped expert GEMM** (``_grouped_mm``): ``GroupedBlas.cpp`` ``_grouped_mm_cuda`` takes the
  one-kernel fast path only when both operands are bf16 on sm90/sm100; otherwise
  ``_grouped_mm_fallback`` (``GroupedMMUtils.h``) copies the offsets to the host (a sync) and runs one
  ``mm`` per group (the tokens split evenly among the groups: the fake run cannot know the routing).
* **Convolutions**: as the implicit GEMM cuDNN runs (m = N x output pixels, n = output channels,
  k = input channels per group x kernel area), float32 at the TF32 rate (``torch.backends.cudnn.allow_tf32``
  defaults to True), never faster than its bytes; the backward as its input- and weight-gradient GEMMs.
* **Attention** (the fused SDPA ops): the backend ``select_sdp_backend`` would pick on the target
  (:func:`labkit.memory.trace.fake.sdpa.select_backend`: cuDNN, flash or mem-efficient), priced at that
  backend's recorded seconds per FLOP; the math backend runs decomposed in fake mode, so its GEMMs and
  softmax are priced one by one.
* **Memory-bound kernels**: the recorded time of a kernel of the same kind (copy, unary, binary,
  reduction, softmax, normalisation) moving the same bytes (each tensor's footprint: broadcast
  dimensions of stride 0 read once); multi-tensor ops (``_foreach_*``, fused AdamW) at the recorded
  fused-AdamW time for their bytes.
* **No kernel**: views, allocations and metadata queries. ``prim.device`` and ``sym_*`` are fake-mode
  queries a real tensor answers without dispatching: no host cost either.
* **Synchronising ops**: a data-dependent output size or a scalar read (``nonzero``, ``.item()``,
  ``masked_select``, ``unique``, a boolean index, ``repeat_interleave`` without ``output_size``, a copy
  between host and device) makes the host wait until the GPU is done.
* **Host cost** of an op: the recorded eager cost of one op (recording its autograd node in the
  forward; one autograd node run by the engine in the backward), of one view, of one allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from labkit.advise.kernel_table import KernelTable, conv_kind
from labkit.memory.trace.fake.sdpa import select_backend

_QUERY = frozenset({"device", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
                    "_has_compatible_shallow_copy_type", "is_contiguous", "dim", "size", "stride", "numel"})
_ALLOC = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "set_",
                    "lift_fresh", "_to_copy_meta"})
_VIEWLIKE = frozenset({"detach", "alias", "_unsafe_view", "view", "_reshape_alias", "lift_fresh_copy"})
_SYNC = frozenset({"nonzero", "_local_scalar_dense", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "unique_dim_consecutive", "is_nonzero", "equal", "bincount"})
_SOFTMAX = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data")
_NORM = ("native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
         "native_group_norm", "native_group_norm_backward", "native_batch_norm", "native_batch_norm_backward",
         "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
         "cudnn_batch_norm", "cudnn_batch_norm_backward", "batch_norm_backward")
_REDUCE = ("sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm",
           "linalg_vector_norm", "nll_loss_forward", "nll_loss2d_forward", "argmax", "argmin", "any", "all", "prod",
           "cumsum", "logsumexp", "_foreach_norm")
_COPY = ("_to_copy", "copy_", "clone", "cat", "stack", "constant_pad_nd", "index_select", "gather", "embedding",
         "index", "index_put", "index_put_", "_index_put_impl_", "scatter", "scatter_", "scatter_add", "scatter_add_",
         "slice_backward", "select_backward", "slice_scatter", "select_scatter", "masked_fill", "masked_fill_",
         "fill_", "zero_", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "full", "full_like", "new_full",
         "arange", "embedding_dense_backward", "repeat", "expand_copy", "_unsafe_index", "roll", "flip", "tril",
         "triu", "where", "narrow_copy", "split_with_sizes_copy", "unfold_backward", "diagonal_backward")
_ATTENTION_FWD = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_flash_attention_forward", "_efficient_attention_forward")


@dataclass
class Price:
    """One op: ``gpu_s`` of kernel time (``kernels`` launches), ``host_s`` to issue it, and whether the
    host then waits for the GPU (``sync``)."""

    kind: str
    gpu_s: float = 0.0
    host_s: float = 0.0
    kernels: int = 0
    sync: bool = False
    flops: float = 0.0
    bytes: float = 0.0


def _bound(func, args: tuple, kwargs: dict) -> dict:
    try:
        names = [a.name for a in func._schema.arguments]
    except Exception:  # an op without a schema: positional arguments only
        names = []
    d = dict(zip(names, args))
    d.update(kwargs or {})
    return d


def dtype_name(dt: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dt, "fp32")


def _layout(x: torch.Tensor) -> str:
    """'t' when the matrix (last two dims) is stored column-major, as a transposed operand is."""
    if x.dim() < 2:
        return "n"
    s0, s1 = x.stride(-2), x.stride(-1)
    return "t" if s0 == 1 and s1 != 1 and x.size(-1) > 1 else "n"


def align_bytes(*mats: torch.Tensor | None) -> int:
    """The bytes (at most 16) that every matrix's leading dimension and storage offset are a multiple
    of: cuBLAS's fast Hopper kernels need 16 (a vocabulary of 50257 in bf16 gives 2)."""
    g = 16
    for x in mats:
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            continue
        es = x.element_size()
        t = _layout(x) == "t"
        ld, other = (x.stride(-1), x.size(-1)) if t else (x.stride(-2), x.size(-2))
        if other > 1:
            g = math.gcd(g, int(ld * es))
        g = math.gcd(g, int(x.storage_offset() * es))
    return g


def footprint(x: torch.Tensor) -> float:
    """Bytes a kernel touches in ``x``: broadcast (stride-0) dimensions count once."""
    n = 1
    for size, stride in zip(x.shape, x.stride()):
        if stride != 0:
            n *= size
    return float(n * x.element_size()) if x.numel() else 0.0


def _tensors(obj) -> list[torch.Tensor]:
    return [x for x in tree_leaves(obj) if isinstance(x, torch.Tensor)]


def _moved_bytes(args: tuple, kwargs: dict, out) -> float:
    seen, total = set(), 0.0
    for x in _tensors((args, kwargs)) + _tensors(out):
        if id(x) in seen:
            continue
        seen.add(id(x))
        total += footprint(x)
    return total


def _mutates(func) -> bool:
    try:
        return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
    except Exception:  # no schema: judge by the name
        return False


class OpPricer:
    """Prices ops with one kernel table; ``backend_of`` remembers each attention forward's backend
    for its backward (keyed by the query's shape)."""

    def __init__(self, table: KernelTable) -> None:
        self.t = table
        self.host = table.host
        self._attention_backend: dict[tuple, str] = {}

    # -- host ----------------------------------------------------------------------------------
    def _host(self, phase: str, kind: str) -> float:
        h = self.host
        if kind == "query":
            return 0.0
        if kind == "view":
            return h["view_s"]
        if kind == "alloc":
            return h["empty_s"]
        if phase == "backward":
            return h["backward_node_s"]
        if phase == "forward":
            return h["op_alloc_grad_s"]
        return h["op_alloc_s"]

    def _host_ratio(self, name: str, args, kwargs) -> float:
        """An op's recorded host cost as a multiple of a plain elementwise op's (1.0 when not recorded)."""
        r = self.t.host_op_ratio
        if not r:
            return 1.0
        if name in ("index_put", "index_put_", "_index_put_impl_"):
            acc = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
            return r.get("_index_put_impl_" if acc else "index_put_", 1.0)
        return r.get(name, r.get(name.rstrip("_"), 1.0))

    # -- GPU -----------------------------------------------------------------------------------
    def gemm(self, m: float, n: float, k: float, dt: torch.dtype, layout: str = "nn", align: int = 16) -> float:
        return self.t.gemm_seconds(m, n, k, dtype_name(dt), layout, align)

    def price(self, func, args: tuple, kwargs: dict, out, phase: str) -> Price:
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name in _QUERY:
            return Price("query")
        outs = _tensors(out)
        if getattr(func, "is_view", False) or name in _VIEWLIKE:
            return Price("view", host_s=self._host(phase, "view"))
        if name in _ALLOC:
            return Price("alloc", host_s=self._host(phase, "alloc"))
        # an op that issues more than a plain op's work: its recorded extra on top (kernel_rates_extra5)
        host = self._host(phase, "op") + (self._host_ratio(name, args, kwargs) - 1.0) * self.host["op_alloc_s"]
        if name == "_local_scalar_dense" and phase == "optimizer":
            # fake mode keeps every tensor on the CPU; torch.optim's non-fused, non-capturable step
            # counters really are host tensors (adam.py ``_init_group``: ``torch.tensor(0.0)``), so
            # reading them waits for nothing
            return Price("query", host_s=host)
        if name in _SYNC:
            p = Price("sync", host_s=host + self.host["item_s"], sync=True)
            if name != "_local_scalar_dense":       # a kernel computes the result before it is read
                p.kernels, p.gpu_s = 1, self.t.memory_seconds("reduce", _moved_bytes(args, kwargs, out))
            return p
        if not outs and not _mutates(func):
            return Price("query", host_s=host)
        a = _bound(func, args, kwargs)
        nbytes = _moved_bytes(args, kwargs, out)
        p = self._compute(name, a, args, kwargs, out, nbytes)
        if p is None:
            p = self._memory(name, args, kwargs, out, nbytes)
        p.host_s += host
        p.bytes = nbytes
        if name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
                x.dtype == torch.bool for x in _tensors(a.get("indices"))):
            p.sync, p.host_s = True, p.host_s + self.host["nonzero_s"]   # a boolean index runs nonzero first
        if name in ("repeat_interleave",) and a.get("output_size") is None and isinstance(a.get("repeats"), torch.Tensor):
            p.sync = True
        if name in ("_to_copy", "copy_") and self._crosses_host(args, kwargs, outs):
            p.sync, p.host_s = True, p.host_s + self.host["item_s"]
        return p

    @staticmethod
    def _crosses_host(args, kwargs, outs) -> bool:
        devs = {x.device.type for x in _tensors((args, kwargs)) + outs}
        return "cpu" in devs and len(devs) > 1

    def _compute(self, name: str, a: dict, args, kwargs, out, nbytes: float) -> Price | None:
        if name in ("mm", "addmm"):
            x, w = (a.get("self"), a.get("mat2")) if name == "mm" else (a.get("mat1"), a.get("mat2"))
            m, k, n = x.size(0), x.size(1), w.size(1)
            s = self.gemm(m, n, k, x.dtype, _layout(x) + _layout(w), align_bytes(x, w, *_tensors(out)))
            return Price("gemm", gpu_s=s, kernels=1, flops=2.0 * m * n * k)
        if name in ("bmm", "baddbmm"):
            x, w = (a.get("self"), a.get("mat2")) if name == "bmm" else (a.get("batch1"), a.get("batch2"))
            b, m, k, n = x.size(0), x.size(1), x.size(2), w.size(2)
            s = self.gemm(b * m, n, k, x.dtype, _layout(x) + _layout(w), align_bytes(x, w, *_tensors(out)))
            return Price("gemm", gpu_s=s, kernels=1, flops=2.0 * b * m * n * k)
        if name == "_grouped_mm":
            return self._grouped_mm(a, out)
        if name == "convolution":
            return self._conv(a, out, nbytes)
        if name == "convolution_backward":
            return self._conv_backward(a, nbytes)
        if name in _ATTENTION_FWD or (name.endswith("_backward") and name[:-len("_backward")] in _ATTENTION_FWD):
            return self._attention(name, a)
        recorded = self._recorded_kernel(name, a, out)
        if recorded is not None:
            return recorded
        if name in ("_fused_adamw_", "_fused_adam_", "_fused_sgd_"):
            lists = [_tensors(a.get(k)) for k in ("self", "grads", "exp_avgs", "exp_avg_sqs")]
            moved = 2 * sum(footprint(x) for i, xs in enumerate(lists) for x in xs if i != 1) + sum(
                footprint(x) for x in lists[1])
            return Price("optimizer", gpu_s=self.t.adamw_seconds(moved), kernels=1)
        if name.startswith("_foreach_"):
            kind = "reduce" if name == "_foreach_norm" else "optimizer"
            return Price(kind, gpu_s=self.t.adamw_seconds(nbytes), kernels=1)
        return None

    def _recorded_kernel(self, name: str, a: dict, out) -> Price | None:
        """Kernels recorded forward and backward against their bytes (the third recording): batch
        norm, gather and its backward scatter-add, embedding and its backward, index_put with accumulate."""
        outs = _tensors(out)
        x = a.get("input", a.get("self"))
        if name in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                    "cudnn_batch_norm", "native_batch_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward"):
            x = x if isinstance(x, torch.Tensor) else next(iter(_tensors(a.values())), None)
            if x is None:
                return None
            key, nb, back = "batch_norm", 2 * footprint(x), name.endswith("backward")
        elif name == "gather" and outs:
            key, nb, back = "gather", 2 * footprint(outs[0]) + footprint(a.get("index")), False
            x = outs[0]
        elif name in ("scatter_add", "scatter_add_") and isinstance(a.get("src"), torch.Tensor):
            x = a["src"]
            key, nb, back = "gather", 2 * footprint(x) + footprint(a.get("index")), True
        elif name == "embedding" and outs:
            x = outs[0]
            key, nb, back = "embedding", 2 * footprint(x), False
        elif name == "embedding_dense_backward":
            x = a.get("grad_output")
            key, nb, back = "embedding", 2 * footprint(x), True
        elif name in ("index_put", "index_put_", "_index_put_impl_") and a.get("accumulate"):
            x = a.get("values")
            if not isinstance(x, torch.Tensor):
                return None
            key, nb, back = "index_put_acc", 2 * footprint(x) + sum(footprint(i) for i in _tensors(a.get("indices"))), False
        else:
            return None
        if not isinstance(x, torch.Tensor):
            return None
        if key == "batch_norm" and x.dim() >= 2:
            s = self.t.batch_norm_seconds(dtype_name(x.dtype), x.size(1), x.numel() // max(x.size(1), 1), nb, back)
        else:
            s = self.t.kernel_seconds(key, dtype_name(x.dtype), nb, back)
        return None if s is None else Price("memory", gpu_s=s, kernels=1 + back)

    def _grouped_mm(self, a: dict, out) -> Price:
        x, w, offs = a.get("self"), a.get("mat2"), a.get("offs")
        groups = offs.numel() if isinstance(offs, torch.Tensor) else (w.size(0) if w.dim() == 3 else 1)
        if x.dim() == 2 and w.dim() == 3:          # tokens (rows, K) x experts (G, K, N)
            m, k, n = x.size(0) / groups, x.size(1), w.size(2)
        elif x.dim() == 2 and w.dim() == 2:        # weight gradient: (K, rows) x (rows, N) -> (G, K, N)
            m, k, n = x.size(0), x.size(1) / groups, w.size(1)
        elif x.dim() == 3 and w.dim() == 3:
            m, k, n = x.size(1), x.size(2), w.size(2)
        else:                                      # (G, M, K) x (rows, N): per-group rows of b
            m, k, n = x.size(1), w.size(0) / groups, w.size(1)
        flops = 2.0 * groups * m * n * k
        if x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16:   # the CUTLASS grouped kernel, one launch
            return Price("gemm", gpu_s=self.t.grouped_gemm_seconds(groups, groups * m, n, k), kernels=1, flops=flops)
        # the fallback's per-group slices start at a token offset: their alignment is that of one element
        per = self.gemm(m, n, k, x.dtype, "nn", x.element_size())
        return Price("gemm", gpu_s=groups * per, kernels=groups, flops=flops, sync=True,
                     host_s=self.host["item_s"] + groups * self.host["op_alloc_s"])

    def _conv_dims(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, groups: int) -> tuple[float, float, float]:
        m = float(y.size(0) * math.prod(y.shape[2:]))
        return m, float(w.size(0)), float(w.size(1) * math.prod(w.shape[2:]))

    def _conv_dtype(self, dt: torch.dtype) -> str:
        return "tf32" if dt == torch.float32 and torch.backends.cudnn.allow_tf32 else dtype_name(dt)

    def _conv_seconds(self, x: torch.Tensor, w: torch.Tensor, groups: int, flops: float, nbytes: float,
                      backward: bool) -> float | None:
        """The recorded convolution of this kind, in the input's memory layout where it was recorded in it
        (cuDNN picks its kernels by the layout PyTorch suggests from the input and weight)."""
        c_in, area = w.size(1) * groups, math.prod(w.shape[2:])
        cl = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        s = self.t.conv_seconds(conv_kind(c_in, groups, area, True), dtype_name(x.dtype), flops, nbytes,
                                backward) if cl else None
        if s is None:
            s = self.t.conv_seconds(conv_kind(c_in, groups, area), dtype_name(x.dtype), flops, nbytes, backward)
        return s

    def _conv(self, a: dict, out, nbytes: float) -> Price:
        x, w, y = a.get("input"), a.get("weight"), _tensors(out)[0]
        g = int(a.get("groups") or 1)
        m, n, k = self._conv_dims(x, w, y, g)
        flops = 2.0 * m * n * k
        s = self._conv_seconds(x, w, g, flops, nbytes, backward=False)
        if s is None:   # no convolution recording: the implicit GEMM, never faster than its bytes
            s = max(self.t.gemm_seconds(m, n, k, self._conv_dtype(x.dtype), "nn"),
                    self.t.memory_seconds("binary", nbytes, x.element_size()))
        return Price("conv", gpu_s=s, kernels=1, flops=flops)

    def _conv_backward(self, a: dict, nbytes: float) -> Price:
        gy, x, w = a.get("grad_output"), a.get("input"), a.get("weight")
        mask = list(a.get("output_mask") or (True, True, True))
        g = int(a.get("groups") or 1)
        m, n, k = self._conv_dims(x, w, gy, g)
        fwd_bytes = footprint(x) + footprint(w) + footprint(gy)
        rec = self._conv_seconds(x, w, g, 2.0 * m * n * k, fwd_bytes, backward=True)
        if rec is not None and mask[0] and mask[1]:
            return Price("conv", gpu_s=rec, kernels=2 + bool(len(mask) > 2 and mask[2]), flops=4.0 * m * n * k)
        if rec is not None:   # one of the two gradients (the first layer's input needs none): half the backward
            return Price("conv", gpu_s=rec / 2, kernels=1, flops=2.0 * m * n * k)
        d = self._conv_dtype(x.dtype)
        s, kernels = 0.0, 0
        if mask[0]:
            s += self.t.gemm_seconds(m, k, n, d, "nn")      # input gradient: (m x n) @ (n x k)
            kernels += 1
        if mask[1]:
            s += self.t.gemm_seconds(n, k, m, d, "tn")      # weight gradient: (n x m) @ (m x k)
            kernels += 1
        if len(mask) > 2 and mask[2]:
            s += self.t.memory_seconds("reduce", footprint(gy), gy.element_size())
            kernels += 1
        s = max(s, self.t.memory_seconds("binary", nbytes, x.element_size()))
        return Price("conv", gpu_s=s, kernels=kernels, flops=2.0 * m * n * k * (mask[0] + mask[1]))

    def _attention(self, name: str, a: dict) -> Price | None:
        q, k, v = a.get("query"), a.get("key"), a.get("value")
        backward = name.endswith("_backward")
        if q is None or k is None or q.dim() != 4:
            return None
        b, h, sq, d = q.shape
        sk = k.size(-2)
        causal = bool(a.get("is_causal", False))
        mask = a.get("attn_mask", a.get("attn_bias"))
        key = (tuple(q.shape), tuple(k.shape), causal)
        backend = self._attention_backend.get(key) if backward else None
        if backend is None:
            try:
                choice = select_backend(q, k, v, mask if isinstance(mask, torch.Tensor) else None,
                                        float(a.get("dropout_p") or 0.0), causal, q.size(-3) != k.size(-3), grad=True)
                backend = choice.backend
            except Exception:  # a call the rules cannot read: the backend that takes any dtype
                backend = "efficient"
            self._attention_backend[key] = backend
        flops = 4.0 * b * h * sq * sk * d * (2.5 if backward else 1.0)
        s = self.t.sdpa_seconds(backend, dtype_name(q.dtype), causal, d, float(sk), flops, backward, batch_heads=b * h)
        return Price("attention", gpu_s=s, kernels=1, flops=flops)

    def _outer_reduce(self, name: str, args, kwargs) -> Price | None:
        """A sum/mean that keeps the last dimension and reduces outer ones (a linear layer's bias
        gradient summed over the tokens): rows = the reduced elements per column."""
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if x is None or x.dim() < 2 or dims is None or not x.is_contiguous():
            return None
        dims = [dims] if isinstance(dims, int) else list(dims)
        if not dims:
            return None
        dims = sorted({d % x.dim() for d in dims})
        if x.dim() - 1 in dims:
            return None
        rows = math.prod(x.size(d) for d in dims)
        s = self.t.outer_reduce_seconds(dtype_name(x.dtype), rows, x.numel() / max(rows, 1))
        return Price("memory", gpu_s=s, kernels=1) if s is not None else None

    def _memory(self, name: str, args, kwargs, out, nbytes: float) -> Price:
        if name in ("sum", "mean"):
            p = self._outer_reduce(name, args, kwargs)
            if p is not None:
                return p
        tens = _tensors((args, kwargs)) + _tensors(out)
        es = max((x.element_size() for x in tens if x.is_floating_point()), default=4)
        if name in _SOFTMAX:
            kind = "softmax"
        elif name in _NORM:
            kind = "layer_norm"
        elif name in _REDUCE:
            kind = "reduce"
        elif name in _COPY:
            kind = "copy"
        else:
            kind = "unary" if len(_tensors((args, kwargs))) <= 1 else "binary"
        if kind == "softmax" and tens and tens[0].dim() and tens[0].size(-1) > 1024:
            kind = "softmax_wide"      # SoftMax.cu: rows over 1024 go to the block-per-row kernel
        if kind in ("unary", "binary") or name in ("_to_copy", "copy_", "clone", "where", "masked_fill", "masked_fill_"):
            kind = _iterator_path(_tensors((args, kwargs)), _tensors(out)) or kind
            if kind == "cast":   # recorded from a tensor of the input's dtype to the other
                es = next((x.element_size() for x in _tensors((args, kwargs)) if x.is_floating_point()), es)
        if name in ("cat", "stack") and any(x.numel() and not x.is_contiguous() for x in _tensors((args, kwargs))):
            kind = "strided"   # a non-contiguous input (a KV cache's transposed keys) is read strided, not vectorized
        return Price("memory", gpu_s=self.t.memory_seconds(kind, nbytes, es), kernels=1)


def _iterator_path(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> str | None:
    """The TensorIterator loop an elementwise op runs (``ATen/native/cuda/Loops.cuh``): None for the
    vectorized one (contiguous, one dtype); ``cast``/``mixed`` when float dtypes differ (one input /
    several), ``broadcast`` when an input's shape differs from the output's, ``strided`` when any
    operand is not contiguous. 0-dim tensors are scalars, read once."""
    ts = [x for x in ins + outs if x.dim() > 0]
    if not ts:
        return None
    floats = {x.dtype for x in ts if x.is_floating_point()}
    if len(floats) > 1:
        return "cast" if len([x for x in ins if x.dim() > 0]) <= 1 else "mixed"
    shape = tuple((outs or ts)[0].shape)
    if any(tuple(x.shape) != shape or 0 in x.stride() for x in ts):
        return "broadcast"
    if any(not x.is_contiguous() for x in ts):
        return "strided"
    return None
