"""Fake-GPU mode: reproduce on CPU fake tensors what a CUDA GPU would allocate.

On a CPU-only build, backward on fake ``cuda`` tensors fails, so the step runs on fake ``cpu``
tensors and the GPU's different choices are made deliberately, by the rules of one torch on one GPU
(:class:`CudaTarget`: by default the H200 of ``targets/h200.json`` with the torch its recordings ran). The
report says which torch the rules are for and which is installed (``emulation["torch"]``); when the two
differ, fake mode warns once per process (:class:`TorchVersionWarning`).

* **Autocast**: CPU autocast casts a different set of ops than CUDA autocast. :class:`CudaAutocast`
  is a ``TorchFunctionMode`` that applies CUDA's lists (``ATen/autocast_mode.h``: lower-precision
  ops such as ``linear``/``matmul``/``addmm``/SDPA; float32 ops such as ``layer_norm``, ``pow``,
  ``nll_loss``; ``softmax``/``log_softmax``/``sum`` with ``dtype=float32``; held to the target torch's own
  AutocastCUDA kernels by tests/memory/trace/test_autocast_lists.py), with the same cache
  of lower-precision copies of leaf weights, cleared when the outermost region exits. A composite op
  on none of CUDA's lists (``cross_entropy``) runs its decomposition, whose sub-ops meet the lists
  one by one (:mod:`labkit.memory.trace.fake.autocast_composite`).
* **Attention**: :mod:`labkit.memory.trace.fake.sdpa` picks the kernel as ``select_sdp_backend`` does on
  the target (cuDNN, flash, mem-efficient or math, by dtype, head_dim, GQA, mask, dropout and torch
  version). The math path runs decomposed (its scores and probabilities are real tensors); the fused
  ones run the CPU flash kernel, which saves the output and a float32 logsumexp like the GPU kernels:
  cuDNN adds two int64 scalars on the device, mem-efficient pads the logsumexp to 32 rows; the backward
  kernels' float32 workspaces are added as transients (sizes measured per op on the H200).
* **Checkpointing under autocast**: ``torch.utils.checkpoint`` recomputes under the autocast state it
  saw in the forward; fake mode binds its own CUDA-autocast emulation to each checkpointed function
  the same way (a fresh cast cache, cleared when the recomputation exits, as torch's does).
* **Module conversion**: ``model.to(torch.bfloat16)`` on fake parameters replaces them (keeping tied
  parameters tied) instead of swapping tensor contents, which fake tensors refuse.
* **Grouped expert matmul**: ``torch._grouped_mm`` in float32 runs CUDA's per-group fallback (torch
  >= 2.9); the meta kernel only knows the bf16 fast path, so fake mode makes the output itself.
* **Reductions**: a bias gradient ``grad.sum(0)`` allocates an inter-block staging buffer whose size
  follows ``Reduce.cuh``'s launch configuration (SM count, threads per SM): reproduced exactly.
* **Embedding backward**: sort and per-segment buffers (approximate: they depend on the token ids).
* **Softmax backward**: CUDA's kernel first forms ``grad * output``, a temporary of the gradient's size
  (:func:`softmax_backward_temporaries`): with SDPA's math path that is one more (B, H, S, S) tensor.
* **cuDNN convolutions**: the workspace each pass takes and frees (:mod:`labkit.memory.trace.fake.conv_workspace`:
  NHWC copies of the operands, per-sample weight-gradient partials for 1x1; none for PyTorch's depthwise kernel).
* **cuBLAS**: a 32 MiB workspace per handle and stream; the forward thread and the autograd engine's
  device thread use different handles, hence two. They outlive every tensor (process state): in a warm
  process they exist, in segments of their own, before the model is built (see :class:`CudaTarget`).
* **Optimizer**: fused AdamW keeps its ``step`` counters on the device (512 bytes each).
* **Gradient accumulation**: the autograd engine sums two gradients of one tensor in place on plain
  tensors and out of place on fake ones (:mod:`labkit.memory.trace.fake.grad_accumulation`): fake mode
  sums in place where a plain run would.
* **Data-dependent choices** (:func:`data_dependent_choices`): what fake tensors cannot decide; a
  boolean ``.item()`` is answered from the statement that reads it where that decides it (an ``assert``'s test
  holds, an ``if`` that only raises is not taken: :func:`~labkit.memory.trace.fake.healthy_values.guard_answer`;
  a ``while`` loop whose test it cannot answer goes on once, then ends: ``loop_answer``), else False (``if mask.any():``, "no value fails the check"; one computed from a random draw, as LayerDrop's, is
  reported as random from step to step), a float one 0.0, each answer reported. MoE
  dispatch (:mod:`labkit.memory.trace.fake.moe`): the experts hit, each
  expert's rows (``nonzero``/``torch.where`` on the expert mask), ``bincount``/``histc`` counts and the
  integer reads of them are answered from the assumed routing (``moe_routing``: balanced by default, or
  each expert's share), reported; a boolean mask of unknown values (``x[mask]``, ``nonzero``, ``masked_select``)
  selects every element and ``torch.unique`` finds every value distinct, the largest results, reported; other
  data-dependent shapes (``unique`` with a ``dim``) and integer reads are refused with one line naming the op and
  the module.
* **Allocator**: every storage rounds up to 512 bytes; then ``labkit.memory.trace.reserved`` replays
  the requests through the allocator chapter's caching-allocator simulator (block reuse, segments).
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, is_fake, unset_fake_temporarily
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from labkit.core.errors import LabkitError
from labkit.core.facts import Facts
from labkit.core.spec import default
from labkit.core.vocab import MoeRouting
from labkit.memory.trace.fake.autocast_composite import composite_under_cuda_autocast, decomposes_under_cuda_autocast
from labkit.memory.trace.fake.constants import (every_element, known_mask_indexing, known_value,
                                                 unknown_mask_indexing, unknown_unique)
from labkit.memory.trace.fake.conv_workspace import conv_workspace_bytes
from labkit.memory.trace.fake.embedding_backward import embedding_backward_temporaries
from labkit.memory.trace.fake.fake_runtime import MOE_NAMES, ModuleStack, refusal, run_composite
from labkit.memory.trace.fake.grad_accumulation import engine_accumulation
from labkit.memory.trace.fake.healthy_values import RANDOM_DRAW, HealthyValues, guard_answer, loop_answer
from labkit.memory.trace.fake.moe import RoutingOracle
from labkit.memory.trace.fake.sdpa import SdpaTarget, parse_version, select_backend
from labkit.memory.trace.fake.targets import H200, TORCH_GATES

# transformers (10 s to import: python -X importtime, 2-core machine) is imported where a model of its runs.

# CUDA autocast op lists (torch ATen/autocast_mode.h), by Python-level function name.
LOWER_PRECISION = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    # the recurrent cells (nn.LSTMCell, nn.GRUCell, nn.RNNCell call them): autocast_mode.cpp KERNEL_CUDA(lstm_cell,
    # lower_precision_fp) and the rest; the H200's torch 2.11 registers an AutocastCUDA kernel for each
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
})
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # the upsampling kernels (AT_FORALL_FP32's last entries in autocast_mode.h): F.interpolate's modes but "area"
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
})
# F.interpolate's modes that run one of those kernels ("area" runs adaptive_avg_pool, which autocast leaves alone)
UPSAMPLE_MODES = frozenset({"nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic"})
FP32_SET_OPT_DTYPE = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                                "linalg_matrix_norm", "sum",
                                # torch.norm / Tensor.norm: autocast's fp32_append_dtype (the result in float32)
                                "norm"})
# what CUDA autocast refuses to run (autocast_mode.cpp's banned kernel: it raises whatever the dtypes)
BANNED = frozenset({"binary_cross_entropy"})
# in CUDA autocast's float32 list from torch 2.12 (targets/torch_gates.json autocast_rms_norm_fp32); before, rms_norm
# ran on the input's dtype (a bfloat16 input beside a float32 weight: the composite, a bfloat16 result)
FP32_FROM_2_12 = frozenset({"rms_norm"})
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
                     "index_put", "tensordot", "scatter_add"})
_RIGHT = {"__rmatmul__": "matmul", "__rpow__": "pow"}


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name in _RIGHT:
        return _RIGHT[name]
    if name.startswith("__") and name.endswith("__"):
        return name[2:-2]
    return name


@dataclass(frozen=True)
class CudaTarget:
    """The GPU whose choices fake mode reproduces. The defaults are the facts of
    ``labkit/memory/trace/fake/targets/h200.json`` (the H200 the lab's recordings ran on, with the torch and cuDNN
    it ran), each with its source there (:meth:`source`); :meth:`from_facts` reads another such file.

    ``torch_version`` is the torch whose rules fake mode applies. It selects the version-dependent rules
    (SDPA: which backends take GQA, cuDNN's place in the priority list and its dropout check; see
    :mod:`labkit.memory.trace.fake.sdpa`); ``sm`` and ``cudnn_version`` the hardware- and library-dependent
    ones. Other fields are the sizes the emulated kernels allocate.

    ``warm_process``: when the cuBLAS workspaces are allocated. ``CublasHandlePool.cpp``
    (``getCurrentCUDABlasHandle``) takes a handle from a per-thread pool and, the first time that
    handle meets a stream, allocates its workspace through the caching allocator into a static map
    keyed by (handle, stream), freed only at exit. So a process that ran any matmul forward and
    backward before (a warm-up, an earlier model, the recorded plain loops' earlier cases: their
    ``base_allocated`` is these 64 MiB) holds both workspaces in segments of their own before the model
    is built (True); a fresh process allocates each at its thread's first matmul, the autograd thread's
    from whatever block the cache has free at the first backward matmul (False). The default is
    ``RunSpec.process``'s (:mod:`labkit.core.spec`), the one ``labkit measure --process`` has: fresh, as a
    training script runs; a step measured in a notebook that ran matmuls before is warm.
    """

    name: str = H200["name"]
    allocator_rounding: int = H200["allocator_rounding"]          # every allocation rounds up to this
    cublas_workspace_bytes: int = H200["cublas_workspace_bytes"]  # per cuBLAS handle and stream
    cublas_handles: int = H200["cublas_handles"]                  # forward thread + autograd device thread
    warm_process: bool = default("process") == "warm"   # the cuBLAS workspaces exist before the model (see above)
    torch_version: str = H200["torch_version"]                    # the torch whose kernel choices are reproduced
    sm: tuple[int, int] = tuple(H200["sm"])                       # type: ignore[assignment]  # compute capability
    cudnn_version: int = H200["cudnn_version"]                    # cuDNN runtime (SDPA gates: sdpa_gates.json)
    cudnn_frontend_d256: bool = H200["cudnn_frontend_d256"]       # the frontend torch was built with: head_dim 256
    efficient_lse_block: int = H200["efficient_lse_block"]        # mem-efficient kernel pads logsumexp to these rows
    sm_count: int = H200["sm_count"]                              # streaming multiprocessors (reduction launches)
    max_threads_per_sm: int = H200["max_threads_per_sm"]
    cudnn_conv_workspaces: bool = True        # cuDNN convolution workspaces (labkit.memory.trace.fake.conv_workspace)
    emulate_kernels: bool = True              # False: count exactly what the CPU kernels allocate
    simulate_allocator: bool = True           # replay the requests through the caching-allocator simulator

    @classmethod
    def plain(cls) -> "CudaTarget":
        """No kernel emulation (autocast still follows CUDA's lists): for checking the fake machinery."""
        return cls(name="plain (CPU kernels)", cublas_workspace_bytes=0, emulate_kernels=False,
                   simulate_allocator=False)

    @classmethod
    def from_facts(cls, facts: Facts, **overrides: Any) -> "CudaTarget":
        """The target a facts file describes (the same fact names as ``targets/h200.json``)."""
        known = {f.name for f in fields(cls)}
        values = {name: facts[name] for name in facts if name in known}
        if "sm" in values:
            values["sm"] = tuple(values["sm"])
        return cls(**{**values, **overrides})

    @staticmethod
    def source(name: str) -> str:
        """Where the default of field ``name`` comes from (``targets/h200.json``)."""
        return H200.source(name)

    @property
    def sdpa(self) -> SdpaTarget:
        return SdpaTarget(sm=self.sm, torch_version=parse_version(self.torch_version), cudnn_version=self.cudnn_version,
                          cudnn_frontend_d256=self.cudnn_frontend_d256)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


class TorchVersionWarning(UserWarning):
    """Fake mode runs with an installed torch other than the one its rules are for."""


_WARNED: set[tuple[str, str]] = set()


def torch_versions(target: CudaTarget) -> dict[str, Any]:
    """Which torch fake mode's rules are for (``target.torch_version``), which torch is installed, and,
    when the two differ, a sentence saying what that means (the report's ``emulation["torch"]``)."""
    rules, installed = target.torch_version, torch.__version__
    out: dict[str, Any] = {"rules": rules, "installed": installed,
                           "same": parse_version(rules) == parse_version(installed)}
    if not out["same"]:
        major, minor = parse_version(installed)
        out["note"] = (f"fake mode's rules are for torch {rules} (CudaTarget.torch_version), the installed torch is "
                       f"{installed}: the step's ops come from {installed}, the GPU's kernel choices and workspaces "
                       f"from the rules for {rules} (CudaTarget(torch_version=\"{major}.{minor}\") applies "
                       f"{major}.{minor}'s; the H200 recordings ran {H200['torch_version']})")
    return out


def warn_if_other_torch(target: CudaTarget) -> dict[str, Any]:
    """:func:`torch_versions`, warning once per process (:class:`TorchVersionWarning`, on stderr) when the
    installed torch is not the rules' torch."""
    info = torch_versions(target)
    key = (info["rules"], info["installed"])
    if not info["same"] and key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(info["note"], TorchVersionWarning, stacklevel=3)
    return info


def _cast(x: Any, dtype: torch.dtype, cache: dict[int, tuple[torch.Tensor, torch.Tensor]] | None) -> Any:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == torch.float64 or x.dtype == dtype:
        return x
    if cache is not None and x.dtype == torch.float32 and x.requires_grad and x.is_leaf and not x._is_view():
        hit = cache.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        y = x.to(dtype)
        cache[id(x)] = (x, y)
        return y
    return x.to(dtype)


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return type(obj)(_map(o, fn) for o in obj)
    return fn(obj)


def cast_arguments(args: tuple, kwargs: dict, fn: Callable[[Any], Any]) -> tuple[tuple, dict]:
    """Apply autocast's cast ``fn`` to an op's arguments in the order the GPU build casts them: last to first.

    ``autocast_mode.h``'s ``WrapFunction_`` casts inside the redispatch's argument list,
    ``(*F)(cached_cast(dtype, args, device_type)...)``; C++ leaves the evaluation order of function
    arguments to the compiler, and GCC (PyTorch's Linux wheels) evaluates them right to left. The H200's
    allocation stream shows it: GPT-2's ``Conv1D`` calls ``addmm(bias, x, weight)`` and requests the
    weight's copy, then the input's, then the bias's (``stream__gpt2-medium-b8-ckpt2-amp-bf16__fresh``).
    The order decides which cached blocks each copy takes. Keyword arguments follow the positional ones in
    every schema, so they are cast first, last to first; a tensor list's members are cast in order.
    """
    new_kwargs = {k: _map(v, fn) for k, v in reversed(list(kwargs.items()))}
    new_args = [_map(a, fn) for a in reversed(args)][::-1]
    return tuple(new_args), {k: new_kwargs[k] for k in kwargs}


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast's casting rules applied to tensors of any device (see the module docstring)."""

    def __init__(self, dtype: torch.dtype, state: "_AutocastState") -> None:
        super().__init__()
        self.dtype = dtype
        self.state = state

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        out = run_composite(self, func, args, kwargs)   # e.g. nn.MultiheadAttention's body: cast op by op
        if out is not NotImplemented:
            return out
        name = _op_name(func)
        if name in BANNED:
            raise RuntimeError(f"{name} under CUDA autocast: the GPU refuses it (autocast_mode.cpp bans it as unsafe "
                               "in lower precision); use binary_cross_entropy_with_logits on the logits instead")
        if decomposes_under_cuda_autocast(name, args, kwargs):
            with self:   # the sub-ops of the decomposition meet these lists, as on the GPU
                return composite_under_cuda_autocast(name)(*args, **kwargs)
        if name in LOWER_PRECISION:
            # autocast_mode.cpp cached_cast: no cache inside inference_mode (pytorch/pytorch#158232, torch >= 2.9)
            # nor where the region turned it off (torch.autocast(cache_enabled=False))
            c = None if (torch.is_inference_mode_enabled() or not torch.is_autocast_cache_enabled()) else self.state.cache
            args, kwargs = cast_arguments(args, kwargs, lambda x: _cast(x, self.dtype, c))
        elif (name in FP32 or (name in FP32_FROM_2_12 and self.state.rms_norm_fp32)
              or (name == "interpolate" and _interpolate_mode(args, kwargs) in UPSAMPLE_MODES)):
            low = (torch.float16, torch.bfloat16)
            f = lambda x: _cast(x, torch.float32, None) if isinstance(x, torch.Tensor) and x.dtype in low else x  # noqa: E731
            args, kwargs = cast_arguments(args, kwargs, f)
        elif name in FP32_SET_OPT_DTYPE:
            first = args[0] if args else None
            if (isinstance(first, torch.Tensor) and first.dtype in (torch.float16, torch.bfloat16)
                    and kwargs.get("dtype") is None and not _has_positional_dtype(args)):
                kwargs["dtype"] = torch.float32
        elif name in PROMOTE:
            fl = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if fl:
                widest = max((a.dtype for a in fl), key=lambda d: torch.finfo(d).bits)
                args, kwargs = cast_arguments(args, kwargs, lambda x: _cast(x, widest, None))
        return func(*args, **kwargs)


def _interpolate_mode(args: tuple, kwargs: dict) -> str:
    """``F.interpolate(input, size, scale_factor, mode="nearest", ...)``'s mode. F.interpolate dispatches as
    itself (``has_torch_function_unary``), so the mode sees it, not the upsampling kernel it calls."""
    return kwargs.get("mode", args[3] if len(args) > 3 else "nearest")


def _has_positional_dtype(args: tuple) -> bool:
    return any(isinstance(a, torch.dtype) for a in args)


class _AutocastState:
    def __init__(self, target_torch: str = "") -> None:
        self.depth = 0
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # rms_norm in the float32 list: a gate on the target's torch (FP32_FROM_2_12)
        gate = parse_version(TORCH_GATES["autocast_rms_norm_fp32"]["torch"])
        self.rms_norm_fp32 = bool(target_torch) and parse_version(target_torch) >= gate


# an op overload's name and its base name ("mm.default", "mm"), looked up once per op (CudaEmulator.after)
_OP_NAMES: dict[Any, tuple[str, str]] = {}


class CudaEmulator:
    """Hooks for :class:`~labkit.memory.trace.storage.StorageTracker` that add the GPU's own allocations."""

    autocast_class = CudaAutocast  # the mode checkpointing's recomputation looks for (fake_runtime)

    def __init__(self, target: CudaTarget, policy: Any, moe_routing: Any = None) -> None:
        self.target = target
        self.policy = policy
        self.torch = warn_if_other_torch(target)
        self.autocast_state = _AutocastState(target.torch_version)
        self._workspaces = 0
        self._backward_thread_ws = False
        self._tracker: Any = None
        self._roles: Any = None
        self._phase = ""
        self._pending_sdpa: str | None = None
        self._sdpa_by_lse: dict[int, str] = {}
        self.sdpa_choices: dict[str, int] = {}     # "backend (why others were rejected)" -> calls
        self.assumptions: list[str] = []
        self.modules = ModuleStack()
        self.routing = RoutingOracle(MoeRouting.parse(moe_routing), self.modules, self.assume)
        self.healthy = HealthyValues()            # NaN / infinity checks, answered as for finite values
        self._loop_entries: dict = {}            # tests read per while loop (healthy_values.loop_answer)

    # -- autocast ----------------------------------------------------------------------------
    def autocast_factory(self, dtype: torch.dtype) -> Callable[[], ContextManager]:
        state = self.autocast_state

        @contextlib.contextmanager
        def region() -> Iterator[None]:
            state.depth += 1
            try:
                if state.depth == 1:
                    with CudaAutocast(dtype, state):
                        yield
                else:
                    # nested (a checkpointed segment inside the forward): the outer mode is active;
                    # in a recomputation during backward the outer region has exited: enter anew
                    if _mode_active(CudaAutocast):
                        yield
                    else:
                        with CudaAutocast(dtype, state):
                            yield
            finally:
                state.depth -= 1
                if state.depth == 0:
                    state.cache.clear()

        return region

    def grad_scaler(self) -> Any:
        return FakeGradScaler()

    def attach(self, step: Any, tracker: Any, roles: Any) -> None:
        self._tracker = tracker
        self._roles = roles

    def start(self, tracker: Any, roles: Any) -> None:
        """Before the model is built: in a warm process the cuBLAS workspaces already exist
        (``CudaTarget.warm_process``), first on the allocator's books."""
        self._roles = roles
        if not (self.target.emulate_kernels and self.target.warm_process and self.target.cublas_workspace_bytes):
            return
        while self._workspaces < self.target.cublas_handles:
            self._hold_workspace(tracker)
        self._backward_thread_ws = True

    # -- tracker hooks -----------------------------------------------------------------------
    def before(self, func: Any, args: tuple, kwargs: dict, tracker: Any) -> tuple[tuple, dict]:
        return args, kwargs

    @staticmethod
    def _safe_softmax_inner(args: tuple, kwargs: dict, tracker: Any) -> None:
        """``_safe_softmax`` (SDPA's math path) is one op to a dispatch mode, but its kernel is composite
        (``_safe_softmax`` in ``aten/src/ATen/native/transformers/attention.cpp``): after the softmax
        output it makes ``masked = self.eq(-inf)`` (bool, self's shape), ``masked_rows = all(masked, dim)``
        and a scalar, freed on return. Measured on the H200 (torch 2.11, Mistral fp32: 1 GiB scores): the
        result is the softmax output itself, followed by a 256 MiB, a 128 KiB and a 4-byte block."""
        x = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
        dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
        n = x.numel()
        rows = n // max(x.size(dim), 1) if x.dim() else n
        tracker.transient_group([n, rows, torch.empty((), dtype=dtype or x.dtype).element_size()])

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any, tracker: Any) -> None:
        self.routing.observe(func, args, kwargs, out)
        self.healthy.observe(func, args, kwargs, out)
        if not self.target.emulate_kernels:
            return
        names = _OP_NAMES.get(func)
        if names is None:
            name = getattr(func, "__name__", str(func))
            names = _OP_NAMES[func] = (name, name.split(".")[0])
        name, base = names
        if base in ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation"):
            self._cublas(tracker)
        elif base == "_scaled_dot_product_flash_attention_for_cpu":
            self._sdpa_forward(args, kwargs, out, tracker)
        elif base == "_scaled_dot_product_flash_attention_for_cpu_backward":
            self._sdpa_backward(args, kwargs, out, tracker)
        elif base == "_scaled_dot_product_efficient_attention":     # a learned bias (sdpa.run_sdpa)
            self._pending_sdpa = None
            # without dropout the philox seed and offset are host tensors (attention.cu, _efficient_attention_forward:
            # at::empty({}, at::dtype(at::kLong)))
            for t in out[2:4]:
                tracker.resize(t, 0)
        elif base == "_scaled_dot_product_efficient_attention_backward":
            grad_out, q = args[0], args[1]
            if not grad_out.transpose(1, 2).is_contiguous():         # grad_out_.contiguous() (attention_backward.cu)
                tracker.transient(grad_out.numel() * grad_out.element_size())
            tracker.transient_group(self._efficient_backward_workspace(q))

        elif base == "_safe_softmax":
            self._safe_softmax_inner(args, kwargs, tracker)
        elif base in ("sum", "mean") and name.endswith(("dim_IntList", "default")):
            self._reduction(args, kwargs, out, tracker)
        elif base == "embedding_dense_backward":
            self._embedding_backward(args, tracker)
        elif base == "_softmax_backward_data":
            tracker.transient_group(softmax_backward_temporaries(args[0], args[1]))
        elif base in ("convolution", "convolution_backward") and self.target.cudnn_conv_workspaces:
            self._conv_workspace(base == "convolution_backward", args, out, tracker)

    def _cublas(self, tracker: Any) -> None:
        in_backward = tracker.phases[-1] == "backward"
        if self._workspaces == 0 or (in_backward and not self._backward_thread_ws and self.target.cublas_handles > 1):
            self._hold_workspace(tracker)
            if in_backward:
                self._backward_thread_ws = True

    def _hold_workspace(self, tracker: Any) -> None:
        sid = tracker.hold(self.target.cublas_workspace_bytes)
        if self._roles is not None:
            self._roles.workspace.add(sid)
        self._workspaces += 1

    def _sdpa_kind(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, is_causal: bool) -> str:
        """The GPU kernel for a CPU flash call that did not come through :class:`CudaFunctionRules`."""
        return select_backend(q, k, v, mask, 0.0, bool(is_causal), q.size(-3) != k.size(-3),
                              target=self.target.sdpa).backend

    def _sdpa_forward(self, args: tuple, kwargs: dict, out: Any, tracker: Any) -> None:
        # CPU: (out, logsumexp (B, H, T) float32). The GPU kernels save the same output and a float32
        # logsumexp: (B, H, T, 1) for cuDNN plus two int64 scalars on the device (philox seed and
        # offset, 512 B blocks); (B, H, T) for flash; (B, H, T padded to 32) for mem-efficient.
        q, k, v = args[0], args[1], args[2]
        kind = self._pending_sdpa
        self._pending_sdpa = None
        if kind is None:
            kind = self._sdpa_kind(q, k, v, kwargs.get("attn_mask"), args[4] if len(args) > 4 else False)
        if kind == "math":      # a direct CPU-kernel call the GPU would run as math: not re-sized
            return
        B, H, T = q.size(0), q.size(1), q.size(2)
        lse = out[1]
        sid = tracker.storage_id(lse)
        if sid is not None:
            self._sdpa_by_lse[sid] = kind
        if kind == "cudnn":
            tracker.tie(lse, 8)
            tracker.tie(lse, 8)
        elif kind == "efficient":
            blk = self.target.efficient_lse_block
            tracker.resize(lse, B * H * (math.ceil(T / blk) * blk) * 4)
        if kind == "cudnn":
            tracker.transient(8)   # a scalar inside the cuDNN forward (measured: 512 B)

    def _sdpa_backward(self, args: tuple, kwargs: dict, out: Any, tracker: Any) -> None:
        # Workspaces inside the backward kernels, measured on the H200 (torch 2.11) per op:
        #   cuDNN: one block (cudnn_backward_workspace);
        #   mem-efficient (float32): (B, H, T, D) float32 + two float32 (B, H, T padded to 32);
        #   flash (FlashAttention-2 source): dq_accum (B, T->128, H, D->32) + softmax_d (B, H, T->128), float32;
        #   with GQA flash also writes dK, dV for every query head before summing over each group.
        q, k = args[1], args[2]
        B, H, T, D = q.size(0), q.size(1), q.size(2), q.size(3)
        sid = tracker.storage_id(args[5]) if len(args) > 5 else None
        kind = self._sdpa_by_lse.get(sid) if sid is not None else None
        if kind is None:
            kind = self._sdpa_kind(q, k, args[3], kwargs.get("attn_mask"), args[7] if len(args) > 7 else False)
        if kind == "cudnn":
            tracker.transient(cudnn_backward_workspace(q, k, args[3]))
        elif kind == "flash":
            t_r = math.ceil(T / 128) * 128
            d_r = math.ceil(D / 32) * 32
            sizes = [B * t_r * H * d_r * 4, B * H * t_r * 4]
            if k.size(1) != H:
                sk = k.size(2)
                sizes += [B * sk * H * D * k.element_size()] * 2
            tracker.transient_group(sizes)
        elif kind == "efficient":
            tracker.transient_group(self._efficient_backward_workspace(q))

    def _efficient_backward_workspace(self, q: torch.Tensor) -> list[int]:
        B, H, T, D = q.size(0), q.size(1), q.size(2), q.size(3)
        t_p = math.ceil(T / self.target.efficient_lse_block) * self.target.efficient_lse_block
        return [B * H * T * D * 4, B * H * t_p * 4, B * H * t_p * 4]

    def note_sdpa(self, choice: Any) -> None:
        key = choice.describe()
        self.sdpa_choices[key] = self.sdpa_choices.get(key, 0) + 1
        self._pending_sdpa = choice.backend if choice.backend != "math" else None

    def _reduction(self, args: tuple, kwargs: dict, out: Any, tracker: Any) -> None:
        x = args[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(x.dim()))
        elif isinstance(dims, int):
            dims = [dims]
        n = reduction_global_buffer_bytes(list(x.shape), list(x.stride()), [d % max(x.dim(), 1) for d in dims],
                                          x.element_size(), self.target.sm_count, self.target.max_threads_per_sm)
        if n:
            tracker.transient_group([n, 8])   # the global staging buffer and the semaphores

    def _conv_workspace(self, backward: bool, args: tuple, out: Any, tracker: Any) -> None:
        # cuDNN's workspace, taken and freed inside each pass (labkit.memory.trace.fake.conv_workspace)
        if backward:
            gy, x, w = args[0], args[1], args[2]
            stride, padding, dilation, transposed, groups, mask = args[4], args[5], args[6], args[7], args[9], args[10]
            passes = [p for p, on in zip(("backward_data", "backward_filter"), mask) if on]
        else:
            x, w, gy = args[0], args[1], out
            stride, padding, dilation, transposed, groups = args[3], args[4], args[5], args[6], args[8]
            passes = ["forward"]
        cl = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        for p in passes:
            n, why = conv_workspace_bytes(p, x.shape, w.shape, gy.shape, stride, padding, dilation, groups, x.dtype,
                                          transposed=bool(transposed), channels_last=cl)
            if why:
                self.assume(why)
            if n:
                tracker.transient(n)

    def _embedding_backward(self, args: tuple, tracker: Any) -> None:
        """The sort-and-reduce buffers of CUDA's embedding backward (:mod:`.embedding_backward`)."""
        grad, indices, num_weights = args[0], args[1], args[2]
        scale = bool(args[4]) if len(args) > 4 else False
        tracker.transient_group(embedding_backward_temporaries(grad, indices, num_weights, scale, self.target.sm_count))

    def describe(self) -> dict[str, Any]:
        return {"target": self.target.describe(), "torch": dict(self.torch), "cublas_workspaces": self._workspaces,
                "sdpa": dict(self.sdpa_choices), "assumptions": list(self.assumptions),
                "moe_routing": self.routing.describe()}

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    # -- ops fake tensors cannot run as the GPU does -------------------------------------------
    def replace(self, func: Any, args: tuple, kwargs: dict, tracker: Any) -> Any:
        """The op's result when fake mode must make it itself, else ``NotImplemented``."""
        routed = self.routing.replace(func, args, kwargs)    # MoE dispatch's data-dependent shapes
        if routed is not NotImplemented:
            return routed
        # what is computed from Python numbers alone has a value (constants.py); factories in the constructor only
        known = known_value(func, args, kwargs, factories=tracker.phases[-1] == "init")
        if known is not NotImplemented:
            return known
        indexed, mask_bytes = known_mask_indexing(func, args, kwargs)
        if indexed is not NotImplemented:
            tracker.transient_group([mask_bytes])       # the mask's nonzero, inside the op
            return indexed
        where = self.modules.where()
        # an expert dispatch the routing rules do not cover stays refused (every token to every expert is no answer)
        indexed, mask_bytes = (NotImplemented, 0) if any(k in where for k in MOE_NAMES) else \
            unknown_mask_indexing(func, args, kwargs)
        if indexed is not NotImplemented:
            self.assume(every_element(where, "torch.masked_select" if func is torch.ops.aten.masked_select.default
                                          else "torch.nonzero, x[mask]"))
            tracker.transient_group([mask_bytes])
            return indexed
        uniq, plan = unknown_unique(func, args, kwargs)
        if uniq is not NotImplemented:
            self.assume(plan.note(where))
            tracker.transient_group(list(plan.inside))
            return uniq
        if func in SCALAR_READS:
            return as_read_by(func, self._scalar_read(args[0]))
        if func in VALUE_COMPARISONS and not all(getattr(a, "constant", None) is not None
                                                 for a in args[:2] if isinstance(a, FakeTensor)):
            return self._compared(func)
        if torch.is_inference_mode_enabled():
            out = inference_decomposition(func, args, kwargs, tracker)
            if out is not NotImplemented:
                return out
        if self.target.emulate_kernels and func in (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                                                    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default):
            return self._gpu_layout(func, args, kwargs, tracker)
        if self.target.emulate_kernels and func is torch.ops.aten.add.Tensor:
            return engine_accumulation(func, args, kwargs, tracker.phases[-1])
        if self.target.emulate_kernels and func is torch.ops.aten.native_dropout.default:
            # Dropout.cu (dropout_cuda) allocates the mask before the output; the CPU kernel the other way
            out, mask = func(*args, **kwargs)
            if mask is not None:
                tracker.track(mask)
            return out, mask
        if func in CTC_FORWARD or func in CTC_BACKWARD:
            return ctc_loss_outputs(func, args, kwargs, tracker)
        if func is torch.ops.aten._grouped_mm.default and self.target.emulate_kernels:
            a, b = args[0], args[1]
            self.routing.independent("the grouped expert matmul (torch._grouped_mm)",
                                     experts=b.size(0) if b.dim() == 3 else None,
                                     rows=a.size(0) if tracker.phases[-1] == "forward" else None)
            if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
                return _grouped_mm_fallback_output(func, args, kwargs)
        return NotImplemented

    def _gpu_layout(self, func: Any, args: tuple, kwargs: dict, tracker: Any) -> Any:
        """The attention kernel's outputs in the layout the GPU allocates them. The CPU kernel's meta
        function lays its output and all three gradients out (B, S, H, D) whatever its inputs are; the
        GPU's kernels do not:

        * mem-efficient (attention.cu ``_efficient_attention_forward``: ``at::empty({B, M, num_heads,
          Kv})``; attention_backward.cu: ``grad_out_.contiguous()``, then ``grad_q/k/v =
          at::empty(query.sizes())``): (B, S, H, D) for all, and a contiguous copy of a grad_out that is
          not. ``nn.MultiheadAttention``'s views of its (S, B, E) projection are laid out (S, B, H, D):
          there the output needs the copy MHA's ``permute(...).contiguous()`` makes, and each gradient a
          copy for the ``view`` back;
        * cuDNN (MHA.cpp ``alloc_with_matching_layout(q, o)``; its backward ``empty_like`` q, k, v) and
          flash (``empty_like`` of the transposed q, k, v): the output in the query's layout, each
          gradient in its input's. A key or value made contiguous (B, H, S, D), as Hugging Face's
          ``DynamicCache.update`` concatenates them, gets a contiguous gradient, which the ``view`` back
          to (B, S, E) must copy; a query made contiguous by a rotary embedding gets a contiguous
          output, which ``transpose(1, 2).contiguous()`` must copy. cuDNN >= 9.5.1 copies a grad_out
          only when its last dimension is strided.

        Returns ``NotImplemented`` where the CPU kernel's layout is already the GPU's (or for math)."""
        backward = func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        if backward:
            sid = tracker.storage_id(args[5]) if len(args) > 5 else None
            kind = self._sdpa_by_lse.get(sid) if sid is not None else None
        else:
            kind = self._pending_sdpa
        if kind not in ("efficient", "cudnn", "flash"):
            return NotImplemented
        out = func(*args, **kwargs)
        if kind == "efficient":
            if backward:
                grad_out = args[0]
                if not grad_out.transpose(1, 2).is_contiguous():
                    tracker.transient(grad_out.numel() * grad_out.element_size())
                return tuple(_bmhk_like(g) for g in out)
            return (_bmhk_like(out[0]), out[1])
        if backward:
            grad_out = args[0]
            if kind == "cudnn" and grad_out.stride(-1) != 1:
                tracker.transient(grad_out.numel() * grad_out.element_size())
            return tuple(_layout_like(g, ref) for g, ref in zip(out, args[1:4]))
        return (_layout_like(out[0], args[0]),) + tuple(out[1:])

    def _compared(self, func: Any) -> bool:
        """``torch.equal``/``torch.allclose`` of values fake tensors do not have (a Python bool, no tensor): answered
        from the statement that reads it where that decides it (:func:`guard_answer`), else False, reported.
        Example: ``nn.utils.parametrizations.orthogonal`` checks whether the weight it is given is orthogonal
        already (``_is_orthogonal``) and makes it so when not, a weight of the same size either way."""
        name, where = f"torch.{func.__name__.split('.')[0]}", self.modules.where()
        return self._checked(f"{name} in ", where, f"{name} ({where}) read as False: fake tensors have no values to "
                                                   "compare")

    def _checked(self, what: str, where: str, otherwise: str) -> bool:
        """A boolean read answered from its statement (:func:`guard_answer`: an assert, an if that only raises;
        :func:`loop_answer`: a while loop's test), else False, with ``otherwise`` as the assumption."""
        guard = guard_answer()
        if guard is not None:
            self.assume(f"{what}{guard[1]} ({where}) read as {guard[0]}: a run that works passes its own checks")
            return guard[0]
        loop = loop_answer(self._loop_entries)
        if loop is not None:
            self.assume(f"{what}{loop[1]} ({where}) tests values fake tensors do not have: at such a test the loop "
                        "went on once, then ended; on the GPU it runs as many times as the values say (the memory "
                        "of more passes is not counted)")
            return loop[0]
        self.assume(otherwise)
        return False

    def _scalar_read(self, x: torch.Tensor) -> Any:
        const = getattr(x, "constant", None) if isinstance(x, FakeTensor) else None
        if const is not None:
            return NotImplemented
        known = self.routing.scalar(x)      # an expert id or a count fake mode made (MoE routing)
        if known is not None:
            return known
        where = self.modules.where()
        healthy = self.healthy.value(x)
        if healthy is not None:
            self.assume(f"a NaN/infinity check ({where}) read as {healthy}: the run's values are finite")
            return healthy
        if x.dtype == torch.bool and self.healthy.random(x):
            self.assume(f"{RANDOM_DRAW} ({where}) read as False, as if the draw never passed it: on the GPU "
                        f"it goes either way from step to step (Hugging Face's LayerDrop skips a layer so), and so "
                        f"does the peak")
            return False
        if x.dtype == torch.bool:
            return self._checked("", where, f"a boolean .item() ({where}) read as False: no value fails the check it "
                                            "guards")
        if x.is_floating_point():
            self.assume(f"a float .item() ({where}) read as 0.0: the value does not change the memory")
            return 0.0
        count = self.healthy.count(x)
        if count is not None:
            self.assume(f"a count of NaN/infinity checks ({where}) read as {count}: the run's values are finite")
            return count
        raise LabkitError(refusal("aten._local_scalar_dense (an integer .item())", where,
                                  "its value decides what follows"))


# The ops that read one number from a tensor (``.item()``, ``if t:``, ``.tolist()``'s elements). A tensor made under
# ``torch.inference_mode`` carries no Autograd dispatch key (c10/core/InferenceMode.h), so the
# CompositeImplicitAutograd kernels of ``item`` and ``is_nonzero`` (aten/src/ATen/native/native_functions.yaml: no
# dispatch entry; TensorConversions.cpp ``item``, TensorProperties.cpp ``is_nonzero``, both ``_local_scalar_dense``
# underneath) have not decomposed them when a dispatch mode sees them: the mode sees ``aten.item`` and
# ``aten.is_nonzero`` (``bool(t)``, ``if t:``) themselves (checked with a logging TorchDispatchMode, torch 2.13).
SCALAR_READS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
                          torch.ops.aten.is_nonzero.default})
# The ops that compare two tensors' values into a Python bool (native_functions.yaml: ``equal``, ``allclose``)
VALUE_COMPARISONS = frozenset({torch.ops.aten.equal.default, torch.ops.aten.allclose.default})


def inference_decomposition(func: Any, args: tuple, kwargs: dict, tracker: Any) -> Any:
    """A CompositeImplicitAutograd op under ``torch.inference_mode`` run as its composite kernel, each op inside it
    seen by ``tracker`` (and the modes beneath); ``NotImplemented`` for any other op.

    Without the Autograd dispatch key (c10/core/InferenceMode.h) nothing has decomposed a composite op when a
    dispatch mode sees it (see :data:`SCALAR_READS`): the tracker would see ``aten.cross_entropy_loss`` alone, and
    fake mode decompose it beneath the tracker, so that the float32 ``_log_softmax`` output (the size of the logits)
    the GPU holds while ``nll_loss`` runs would never be counted, nor the cuBLAS workspace of ``aten.linear``'s
    ``addmm``. On the GPU the composite kernel runs (native_functions.yaml: ``cross_entropy_loss``, ``linear`` have no
    backend kernel), the same ops in the same order. One difference is a real tensor's: ``linear`` of an input it
    cannot flatten (a ``batch_first`` RNN's transposed output) is ``matmul``, then the bias added in place
    (aten/src/ATen/native/Linear.cpp ``linear``), out of place only for a tensor subclass such as a fake tensor."""
    if getattr(func, "namespace", None) != "aten" or not torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"):
        return NotImplemented
    with tracker:
        if func is torch.ops.aten.linear.default:
            x, w, bias = (list(args) + [kwargs.get("bias")])[:3]
            if bias is not None and x.dim() > 2 and not x.is_contiguous():
                return torch.matmul(x, w.t()).add_(bias)
        # the C++ composite kernel, not a Python decomposition (eval-mode dropout's clones its input)
        return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def as_read_by(func: Any, value: Any) -> Any:
    """The number read from a tensor as ``func`` returns it: ``is_nonzero`` its truth, the others the number."""
    if func is torch.ops.aten.is_nonzero.default and value is not NotImplemented:
        return bool(value)
    return value


def cudnn_backward_workspace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes of the one workspace block cuDNN's SDPA backward takes (``run_cudnn_SDP_bprop`` allocates the
    graph's ``get_workspace_size()`` at once). cudnn-frontend's ``CompositeSDPABackwardNode`` sizes it as a
    float32 dQ accumulator (B, H, T, D) + the float32 softmax sum (B, H, T) + with GQA dK and dV for every
    query head (B, H, S, D, in q's dtype, then summed per group); the backend adds 256 bytes. Measured on
    the H200 (torch 2.11, cuDNN 9.19): GPT-2 b8 (12 heads, D 64) 25,559,296 B; Gemma 3 b2 (4 query heads,
    1 kv head, D 256) 16,810,240 B, both exactly this."""
    B, H, T, D = q.size(0), q.size(1), q.size(2), q.size(3)
    n = B * H * T * D * 4 + B * H * T * 4 + 256
    if k.size(1) != H:
        n += B * H * k.size(2) * D * q.element_size() + B * H * v.size(2) * v.size(3) * q.element_size()
    return n


def _bmhk_like(t: torch.Tensor) -> torch.Tensor:
    """A new (B, H, S, D) tensor like ``t`` laid out (B, S, H, D) (contiguous after ``transpose(1, 2)``)."""
    if t.transpose(1, 2).is_contiguous():
        return t
    b, h, s, d = t.shape
    return torch.empty((b, s, h, d), dtype=t.dtype, device=t.device).transpose(1, 2)


def _layout_like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``t``, or a new tensor of its shape, dense in ``ref``'s dimension order (``alloc_with_matching_layout``:
    the dimensions filled innermost first by ``ref``'s ascending strides)."""
    order = sorted(range(ref.dim()), key=lambda i: ref.stride(i) or 1)
    strides = [0] * t.dim()
    step = 1
    for i in order:
        strides[i] = step
        step *= t.size(i)
    if list(t.stride()) == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)


def _all_ones_padding(batch: Any) -> bool:
    """Whether every ``*attention_mask`` in the user's (real, CPU) batch is all ones: no padding."""
    if not isinstance(batch, dict):
        return False
    masks = [v for k, v in batch.items() if k.endswith("attention_mask") and isinstance(v, torch.Tensor)]
    return bool(masks) and all(bool((m != 0).all()) for m in masks)


@contextlib.contextmanager
def data_dependent_choices(batch: Any = None,
                           host_values: Callable[[Any], torch.Tensor | None] | None = None) -> Iterator[list[str]]:
    """Answer the data-dependent questions libraries ask, which fake tensors cannot answer.

    Hugging Face ``transformers`` (``masking_utils``), under fake tensors ("tracing"), neither checks
    position ids for packed sequences (``find_packed_sequence_indices``: it assumes packing) nor
    checks whether the padding mask masks anything (``_ignore_causal_mask_sdpa``,
    ``_ignore_bidirectional_mask_sdpa``): it builds an explicit (batch, 1, seq, seq) mask, which
    excludes the flash kernel and is kept by the others. A GPU run with the same batch checks the
    values. Fake mode answers "one sequence per row" for the packing question (the case when the
    model makes its own position ids) and, when every ``attention_mask`` of the user's batch is all
    ones (read before the batch is faked), "nothing is masked", as the GPU run would find.

    ``host_values`` (a user's script, whose batches are not known in advance): given a fake GPU tensor,
    the real host values it was copied from, or None. Where the mask a model passes to transformers'
    mask builder (``_preprocess_mask_arguments``, which every ``create_*_mask`` calls first) has known
    values, the padding check answers from them: a mask with a 0 is needed (the explicit mask is
    built, as the GPU finds for that batch), one without is skipped; unknown values: "nothing is
    masked", as for ``batch``. Position ids with known values answer the packing question from them
    (``find_packed_sequence_indices`` run on the host values: packed rows get the block mask).
    Yields the list of choices made (for the report).
    """
    made: list[str] = []
    undo: list[tuple[Any, str, Any]] = []
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None and "transformers" in sys.modules:   # a model factory may import it later
        try:
            import transformers.masking_utils as mu
        except ImportError:
            mu = None

    if mu is not None and hasattr(mu, "find_packed_sequence_indices"):
        original = mu.find_packed_sequence_indices

        def unpacked(position_ids: torch.Tensor, _original: Callable = original) -> Any:
            if is_fake(position_ids):
                known = host_values(position_ids) if host_values is not None else None
                if known is not None and _original(known) is not None:
                    if "hf-packed-sequences (position ids read on the host)" not in made:
                        made.append("hf-packed-sequences (position ids read on the host)")
                    return _original(position_ids)      # its "is anything packed" read answers False: packed
                choice = ("hf-unpacked-sequences (position ids read on the host)" if known is not None
                          else "hf-unpacked-sequences")
                if choice not in made:
                    made.append(choice)
                return None
            return _original(position_ids)

        undo.append((mu, "find_packed_sequence_indices", original))
        mu.find_packed_sequence_indices = unpacked
    padded: list[bool | None] = [None]    # whether the mask the model passed last masks a token (host values)
    if mu is not None and host_values is not None and hasattr(mu, "_preprocess_mask_arguments"):
        preprocess = mu._preprocess_mask_arguments

        def judged(*a: Any, **k: Any) -> Any:
            mask = k["attention_mask"] if "attention_mask" in k else (a[2] if len(a) > 2 else None)
            known = host_values(mask) if isinstance(mask, torch.Tensor) else None
            padded[0] = None if known is None else bool((known == 0).any())
            return preprocess(*a, **k)

        undo.append((mu, "_preprocess_mask_arguments", preprocess))
        mu._preprocess_mask_arguments = judged
    if mu is not None and _all_ones_padding(batch):
        for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa"):
            fn = getattr(mu, name, None)
            if fn is None:
                continue

            def no_padding(padding_mask: Any, *a: Any, _fn: Callable = fn, **k: Any) -> Any:
                if padding_mask is not None and is_fake(padding_mask) and padded[0] is not None:
                    choice = ("hf-padding (the attention_mask read on the host masks tokens)" if padded[0] else
                              "hf-no-padding (the attention_mask read on the host masks nothing)")
                    if choice not in made:
                        made.append(choice)
                    return False if padded[0] else _fn(None, *a, **k)   # a mask that masks: never skipped
                if padding_mask is not None and is_fake(padding_mask):
                    if "hf-no-padding (the batch's attention_mask is all ones)" not in made:
                        made.append("hf-no-padding (the batch's attention_mask is all ones)")
                    return _fn(None, *a, **k)
                return _fn(padding_mask, *a, **k)

            undo.append((mu, name, fn))
            setattr(mu, name, no_padding)
    try:
        yield made
    finally:
        for mod, name, fn in undo:
            setattr(mod, name, fn)


def softmax_backward_temporaries(grad: torch.Tensor, output: torch.Tensor) -> list[int]:
    """Bytes CUDA's ``_softmax_backward_data`` allocates besides its result, live together inside the op.

    ``softmax_backward_cuda_out`` (``aten/src/ATen/native/cuda/SoftMax.cu``) computes
    ``Tensor tmp = grad * output`` and passes it to ``host_softmax_backward`` (its epilogue expects
    ``gradOutput * output``), which takes ``grad_.contiguous()`` and ``output_.contiguous()``: a copy
    of each that is not contiguous. The CPU kernel (and so fake mode's meta kernel) forms no
    temporary. ``_log_softmax_backward_data`` has none on CUDA either. Measured on the H200 (torch 2.11,
    ``data/measurements/measure/plain__ckpt_nodes.json``): inside ``SafeSoftmaxBackward0`` of SDPA's math
    path the allocator peaks at two (B, H, S, S) float32 tensors above the node's start, the result and
    this temporary; with HF gradient checkpointing that is the step's peak.
    """
    if grad.numel() == 0:
        return []
    tmp = grad.numel() * torch.result_type(grad, output).itemsize
    sizes = [tmp]
    if not grad.is_contiguous():    # the product takes the gradient's layout; the kernel wants it contiguous
        sizes.append(tmp)
    if not output.is_contiguous():
        sizes.append(output.numel() * output.element_size())
    return sizes


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def reduction_global_buffer_bytes(shape: list[int], strides: list[int], reduce_dims: list[int], elem_size: int,
                                  sm_count: int = H200["sm_count"],
                                  max_threads_per_sm: int = H200["max_threads_per_sm"]) -> int:
    """Bytes of the inter-block staging buffer a CUDA reduction allocates (``Reduce.cuh``
    ``setReduceConfig`` and ``ReduceConfig::global_memory_size``; accumulation in float32).

    Handles a contiguous input whose reduced dims are all leading (e.g. a bias gradient
    ``grad.sum(0)``) or all trailing; other layouts return 0 (not modelled).
    """
    nd = len(shape)
    red = sorted(set(reduce_dims))
    if nd == 0 or not red:
        return 0
    contiguous = all(strides[i] == math.prod(shape[i + 1:]) for i in range(nd))
    if not contiguous:
        return 0
    inputs = math.prod(shape[i] for i in red)
    outputs = math.prod(shape[i] for i in range(nd) if i not in red)
    if outputs == 0 or inputs <= 1:
        return 0
    leading = red == list(range(len(red)))
    trailing = red == list(range(nd - len(red), nd))
    if outputs == 1:
        leading, trailing = False, True
    if not (leading or trailing):
        return 0
    acc = 4
    max_threads = 512
    vt0 = 4
    if trailing:          # reduction along the fastest dimension: block.x reduces
        dim0, dim1 = inputs, outputs
        if dim0 > 128:
            dim0 //= vt0  # vectorised input loads
        out_vec = 1
    else:                 # reduction across rows: block.x spans outputs, vectorised along outputs
        out_vec = 4
        while outputs % out_vec:
            out_vec //= 2
        dim0, dim1 = outputs // out_vec, inputs
    mnt = max_threads // out_vec
    d0 = _last_pow2(dim0) if dim0 < mnt else mnt
    d1 = _last_pow2(dim1) if dim1 < mnt else mnt
    bw = min(d0, 32)
    bh = min(d1, mnt // bw)
    bw = min(d0, mnt // bh)
    nthreads = bw * bh
    step_input, step_output = 1, 1
    block_x_reduce = trailing
    if trailing:
        step_input *= bw
    else:
        step_output *= bw
    vpt = -(-inputs // step_input)
    split_warps = vpt >= min(bh * 16, 256)
    if split_warps:
        step_input *= bh
    else:
        step_output *= bh
    target_grid = sm_count * (max_threads_per_sm // nthreads)
    grid_x = -(-(outputs // out_vec) // step_output)
    vpt = -(-inputs // step_input)
    if not (split_warps and vpt >= 256 and grid_x <= target_grid):
        return 0
    ctas = max(min(-(-target_grid // grid_x), -(-vpt // 16)), -(-vpt // 256))
    if ctas <= 1:
        return 0
    size = acc * outputs * ctas
    if not block_x_reduce:
        size *= bw * out_vec
    return size


CTC_FORWARD = (torch.ops.aten._ctc_loss.default, torch.ops.aten._ctc_loss.Tensor)
CTC_BACKWARD = (torch.ops.aten._ctc_loss_backward.default, torch.ops.aten._ctc_loss_backward.Tensor)


def ctc_loss_outputs(func: Any, args: tuple, kwargs: dict, tracker: Any) -> Any:
    """The outputs of CUDA's native CTC loss, whose shapes PyTorch's fake tensors leave unknown
    (``torch/_subclasses/fake_impls.py`` registers ``_ctc_loss`` as a dynamic-output-shape op), from the target
    lengths where fake mode knows them (the batch's labels keep their values: ``backends.FakeCudaBackend``).

    ``aten/src/ATen/native/cuda/LossCTC.cu``, ``ctc_loss_gpu_template``: the longest target is ``targets.size(1)``
    for (batch, max length) targets, else the largest target length; it allocates ``log_alpha`` (batch,
    input length, 2 * longest + 1), then ``neg_log_likelihood`` (batch), both in the log-probabilities' dtype.
    ``ctc_loss_backward_gpu_template``: ``log_beta`` shaped as ``log_alpha``, then the gradient (``full_like``
    the log-probabilities); ``log_beta`` is freed when the op returns. Where the lengths are unknown, fake mode
    refuses as before (``NotImplemented``)."""
    log_probs, targets = args[0 if func in CTC_FORWARD else 1], args[1 if func in CTC_FORWARD else 2]
    if func in CTC_BACKWARD:
        log_alpha = args[6]
        log_beta = torch.empty(tuple(log_alpha.shape), dtype=log_alpha.dtype)
        tracker.track(log_beta)
        grad = torch.empty(tuple(log_probs.shape), dtype=log_probs.dtype)
        tracker.track(grad)
        del log_beta
        return grad
    lengths = args[3]
    if targets.dim() == 2:
        longest = targets.size(1)
    elif isinstance(lengths, torch.Tensor):
        if getattr(lengths, "constant", None) is None:
            return NotImplemented
        with unset_fake_temporarily():
            longest = max(lengths.constant.tolist(), default=0)
    else:
        longest = max(lengths, default=0)
    batch = log_probs.size(1)
    log_alpha = torch.empty((batch, log_probs.size(0), 2 * longest + 1), dtype=log_probs.dtype)
    tracker.track(log_alpha)
    return torch.empty((batch,), dtype=log_probs.dtype), log_alpha


def _grouped_mm_fallback_output(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """The output of CUDA's per-group ``_grouped_mm`` fallback (non-bf16 inputs, torch >= 2.9): the
    shape the bf16 kernel would give, in the inputs' dtype (no other device memory: one mm per group)."""
    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            dt = torch.bfloat16 if x.is_floating_point() else x.dtype
            return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=dt, device="meta")
        return x

    with unset_fake_temporarily():
        shape = tuple(func(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()}).shape)
    dtype = kwargs.get("out_dtype") or args[0].dtype
    return torch.empty(shape, dtype=dtype)


def _mode_active(cls: type) -> bool:
    return any(isinstance(m, cls) for m in _get_current_function_mode_stack())


class FakeGradScaler:
    """The memory of ``torch.amp.GradScaler`` on fake tensors: a scale, a growth tracker, an
    in-place unscale of the gradients (no data-dependent skip: fake tensors have no values)."""

    def __init__(self, init_scale: float = 2.0 ** 16) -> None:
        self.init_scale = init_scale
        self._scale: torch.Tensor | None = None
        self._growth_tracker: torch.Tensor | None = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        if self._scale is None:
            self._scale = torch.full((), self.init_scale, dtype=torch.float32)
            self._growth_tracker = torch.full((), 0, dtype=torch.int32)
        return loss * self._scale

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        assert self._scale is not None
        inv = self._scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)
        optimizer.step()

    def update(self) -> None:
        pass
