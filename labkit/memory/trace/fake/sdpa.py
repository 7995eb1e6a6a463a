"""Which kernel ``F.scaled_dot_product_attention`` runs on a CUDA GPU, decided as PyTorch decides it.

:func:`select_backend` reproduces ``sdp::select_sdp_backend`` (``aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp``) for dense inputs: the backends are tried in priority order and the first whose
checks all pass runs. Sources read (pytorch/pytorch on GitHub, through the lab's code index):

* ``cuda/sdp_utils.cpp`` at commit 001f694a (2026 main): ``priority_order`` and
  ``check_prefer_cudnn_attention`` (cuDNN first on sm90/sm10x with cuDNN > 9.15), ``can_use_cudnn_attention``,
  ``can_use_flash_attention``, ``can_use_mem_efficient_attention`` and the checks they list
  (``check_cudnn_tensor_shapes``: head_dim <= 128, or <= 256 on sm90 with cuDNN > 9.22; a multiple of 8;
  seq_k != 1; ``check_cudnn_dropout``: a multiple of 1/16; ``check_head_dim_size_flash``: q, k, v head_dim
  equal and <= 256; ``check_head_dim_size_mem_efficient`` / ``minimum_gemm_alignment``: a multiple of 4
  (float32) or 8 (16-bit) on sm80+; ``check_flash_causal_non_square_seqlens``; dtype lists: flash and
  cuDNN fp16/bf16, mem-efficient fp16/bf16/fp32 on sm80+).
* the same file at commit 21c3369e (torch 2.4 era): priority flash, mem-efficient, math, cuDNN.
* ``sdp_utils_cpp.h`` at commit 0119c205: ``check_for_attn_mask`` (flash takes no explicit mask),
  ``check_attn_mask_shape`` (cuDNN: a mask that does not require grad, 2-D or broadcastable 4-D),
  ``check_batch_size_and_num_heads_dense`` / ``check_grouped_query_attention`` (different K/V head counts
  only with ``enable_gqa`` on a backend that supports it, and Hq % Hkv == 0), ``check_tensor_shapes``
  (4-D), ``check_nonzero_sequence_lengths_dense``, ``check_last_dim_stride_equals_1_dense``.

Where the rules change with the torch and cuDNN versions and the GPU, they read a named gate of
``targets/sdpa_gates.json`` (:data:`labkit.memory.trace.fake.targets.SDPA_GATES`), each with its source:
which backends take GQA, cuDNN's place in the priority list, cuDNN's dropout checks and head_dim
limits, each backend's GPU range. The default target (:class:`SdpaTarget`) is the H200 of
``targets/h200.json`` (the torch and cuDNN its recordings ran). Checked against the H200 recordings
(plain loops, the kernels the profiler saw; reference cases only): cuDNN ran for every fp16/bf16 call,
including HF's attention dropout 0.1 (so the 1/16 dropout check of the current source is newer than
2.11) and head_dim 256 (Gemma: cuDNN 9.19, so 2.11 still had the earlier cuDNN >= 9.10 rule). And against the
H200's dispatcher itself (``torch._fused_sdp_choice`` on 4,320 calls, ``sdpa_choice__h200.json``,
``benchmarks/gpu/record_sdpa_choice.py``): every call gets the same backend, a mask that requires grad (a learned
relative-position bias) among them, which mem-efficient takes (and returns its gradient; see :func:`run_sdpa`).

Nested tensors and ROCm are not modelled (fake mode sees dense CUDA-like tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from labkit.memory.trace.fake.targets import H200, SDPA_GATES

BACKENDS = ("cudnn", "flash", "efficient", "math")
_HALF = (torch.float16, torch.bfloat16)


def parse_version(v: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(v, tuple):
        return v
    parts = v.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _from_torch(gate: str) -> tuple[int, int]:
    """The torch version a gate of ``sdpa_gates.json`` starts with."""
    return parse_version(SDPA_GATES[gate]["torch"])


def _sm_range(gate: str, sm: tuple[int, int]) -> str:
    """"" when ``sm`` is inside the gate's GPU range, else why not ("needs sm80-sm121")."""
    g = SDPA_GATES[gate]
    lo, hi = tuple(g["sm_from"]), tuple(g["sm_to"])
    return "" if lo <= sm <= hi else f"needs sm{lo[0]}{lo[1]}-sm{hi[0]}{hi[1]}"


def _cudnn_name(v: int) -> str:
    return f"{v // 10000}.{v // 100 % 100}"


@dataclass(frozen=True)
class SdpaTarget:
    """What SDPA selection depends on besides the call: the GPU, the torch and cuDNN versions."""

    # defaults: the H200 of targets/h200.json (each fact with its source there)
    sm: tuple[int, int] = tuple(H200["sm"])                      # type: ignore[assignment]
    torch_version: tuple[int, int] = parse_version(H200["torch_version"])
    cudnn_version: int = H200["cudnn_version"]
    cudnn_frontend_d256: bool = H200["cudnn_frontend_d256"]

    @property
    def priority(self) -> tuple[str, ...]:
        g = SDPA_GATES["cudnn_first"]
        if (self.torch_version >= parse_version(g["torch"]) and self.sm[0] in g["sm_major"]
                and self.cudnn_version > g["cudnn_above"]):
            return ("cudnn", "flash", "efficient", "math")
        return ("flash", "efficient", "math", "cudnn")


@dataclass
class SdpaChoice:
    backend: str
    rejected: dict[str, str] = field(default_factory=dict)   # backend -> the first check that failed

    def describe(self) -> str:
        why = "; ".join(f"{b}: {r}" for b, r in self.rejected.items())
        return f"{self.backend}" + (f" ({why})" if why else "")


def _heads_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool, supports_gqa: bool) -> str:
    if not (q.size(0) == k.size(0) == v.size(0)):
        return "batch sizes differ"
    hq, hk, hv = q.size(-3), k.size(-3), v.size(-3)
    if enable_gqa and supports_gqa:
        if hk != hv:
            return "key and value head counts differ"
        if hq % hk:
            return f"{hq} query heads not a multiple of {hk} key/value heads"
        return ""
    if not (hq == hk == hv):
        return (f"{hq} query heads, {hk} key/value heads: unequal heads need enable_gqa and a backend "
                "supporting it")
    return ""


def _common_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  ignore_singleton: bool) -> str:
    if not (q.dim() == k.dim() == v.dim() == 4):
        return "query, key and value must be 4-D"
    if q.size(-2) == 0 or k.size(-2) == 0:
        return "zero sequence length"
    ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton:
        ok = ok or q.size(-1) == 1
    if mask is not None and mask.stride(-1) != 1:
        ok = False
    if not ok:
        return "last dimension stride is not 1"
    return ""


def _cudnn(q, k, v, mask, dropout_p, is_causal, enable_gqa, grad, t: SdpaTarget) -> str:
    if t.torch_version < _from_torch("cudnn_tried"):
        return "not tried before math in this torch version"
    r = _sm_range("cudnn_sm", t.sm)
    if r:
        return r
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _HALF):
        return f"dtype {q.dtype} (cuDNN needs fp16/bf16)"
    if mask is not None:
        if mask.requires_grad:
            return "attn_mask requires grad"
        if mask.size(-2) not in (q.size(2), 1) or mask.size(-1) not in (k.size(2), 1):
            return "attn_mask shape"
        if mask.dim() == 4 and not (mask.size(0) in (1, q.size(0)) and mask.size(1) in (1, q.size(1))):
            return "attn_mask shape"
        if mask.dim() not in (2, 4):
            return "attn_mask must be 2-D or 4-D"
    sixteenths = t.torch_version >= _from_torch("cudnn_dropout_sixteenths")
    if sixteenths and dropout_p * 16.0 != math.floor(dropout_p * 16.0):
        return "dropout not a multiple of 1/16"
    g = SDPA_GATES["cudnn_dropout_unsupported"]
    if dropout_p > 0.0 and g["cudnn_above"] < t.cudnn_version < g["cudnn_below"]:
        return f"dropout unsupported in cuDNN {_cudnn_name(g['cudnn_above'])}-{_cudnn_name(g['cudnn_below'] - 100)}"
    r = _common_dense(q, k, v, mask, True)
    if r:
        return r
    r = _heads_ok(q, k, v, True, t.torch_version >= _from_torch("cudnn_gqa"))  # no equal head counts needed
    if r:
        return r
    if q.size(0) > 65535 or q.size(1) > 65535:
        return "batch or heads > 65535"
    d_qk, d_v = q.size(3), v.size(3)
    sm90x = (t.sm[0] == 9 and t.sm[1] == 0) or t.sm[0] == 10
    limit = 128
    g = SDPA_GATES["cudnn_head_dim_256_sm90"]
    if t.torch_version >= parse_version(g["torch"]):
        frontend = t.cudnn_frontend_d256 or not g["needs_frontend_d256"]
        d256 = sm90x and t.cudnn_version > g["cudnn_above"] and frontend
    else:
        d256 = t.sm == tuple(g["before"]["sm"]) and t.cudnn_version >= g["before"]["cudnn_at_least"]
    if d256:
        limit = 256
    elif (sm90x and t.cudnn_version >= SDPA_GATES["cudnn_head_dim_192_128"]["cudnn_at_least"]
          and d_qk == 192 and d_v == 128):
        limit = 192
    if d_qk > limit or d_v > limit:
        return f"head_dim {max(d_qk, d_v)} > {limit}"
    if d_qk % 8 or d_v % 8:
        return "head_dim not a multiple of 8"
    if k.size(2) == 1:
        return "key/value sequence length 1"
    if dropout_p != 0.0 and q.size(2) == 1:
        return "query length 1 with dropout"
    if grad and limit == 256 and not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))):
        return "backward unsupported for these head dims"
    return ""


def _flash(q, k, v, mask, dropout_p, is_causal, enable_gqa, grad, t: SdpaTarget) -> str:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "query, key and value must be 4-D"
    if mask is not None:
        return "explicit attn_mask (flash takes is_causal only)"
    if not (q.size(-1) == k.size(-1) == v.size(-1) and q.size(-1) <= 256):
        return "head_dims differ or exceed 256"
    r = _sm_range("flash_sm", t.sm)
    if r:
        return r
    g = SDPA_GATES["flash_training_head_dim_sm"]
    if grad and any(tuple(lo) <= t.sm <= tuple(hi) for lo, hi in g["ranges"]):
        d = q.size(-1)
        if not (d <= g["head_dim_at_most"] or (dropout_p == 0.0 and d > g["without_dropout_above"])):
            return "training with this head_dim unsupported on this GPU"
    if is_causal and q.size(-2) != k.size(-2):
        return "is_causal with seq_q != seq_k"
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _HALF):
        return f"dtype {q.dtype} (flash needs fp16/bf16)"
    r = _heads_ok(q, k, v, enable_gqa, t.torch_version >= _from_torch("flash_gqa"))
    if r:
        return r
    return _common_dense(q, k, v, None, True)


def _efficient(q, k, v, mask, dropout_p, is_causal, enable_gqa, grad, t: SdpaTarget) -> str:
    r = _sm_range("efficient_sm", t.sm)
    if r:
        return r
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "query, key and value must be 4-D"
    half = q.dtype in _HALF
    align = 4 if t.sm[0] >= 8 else 1
    if t.sm[0] >= 8 or half:
        align = max(align, 128 // (16 if half else 32))
    dq, dv = q.size(-1), v.size(-1)
    if not (dq == k.size(-1) and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        return f"head_dim not a multiple of {align}"
    if t.sm[0] >= 8:
        for x in (q, k, v):
            if x.numel() and (x.storage_offset() * x.element_size()) % (align * x.element_size()):
                return "storage offset not aligned"
    r = _common_dense(q, k, v, mask, False)
    if r:
        return r
    r = _heads_ok(q, k, v, enable_gqa, t.torch_version >= _from_torch("efficient_gqa"))
    if r:
        return r
    allowed = (torch.float16, torch.float32, torch.bfloat16) if t.sm[0] >= 8 else (torch.float16, torch.float32)
    if not (q.dtype == k.dtype == v.dtype and q.dtype in allowed):
        return f"dtype {q.dtype}"
    return ""


_CHECKS = {"cudnn": _cudnn, "flash": _flash, "efficient": _efficient}


def select_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False, *,
                   grad: bool | None = None, target: SdpaTarget | None = None) -> SdpaChoice:
    """The backend ``select_sdp_backend`` picks for this call on ``target`` (default: the H200 of
    ``targets/h200.json``).

    ``grad``: whether autograd records the call (default: grad mode on and an input requires grad).
    """
    t = target or SdpaTarget()
    if grad is None:
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    rejected: dict[str, str] = {}
    for name in t.priority:
        if name == "math":
            return SdpaChoice("math", rejected)
        why = _CHECKS[name](query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, grad, t)
        if not why:
            return SdpaChoice(name, rejected)
        rejected[name] = why
    return SdpaChoice("math", rejected)


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``convert_boolean_attn_mask`` (attention.cpp): a boolean mask becomes ``where(mask, 0, -inf)`` in the
    query's dtype."""
    if mask.dtype == torch.bool:
        return torch.where(mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=dtype))
    return mask


def _efficient_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask`` (``aten/src/ATen/native/transformers/attention.cpp``, with ``aligned_tensor`` and
    ``pad_bias``): a mask whose strides are not all multiples of 8 elements (or whose last stride is not 1) is padded
    by ``8 - Sk % 8`` columns and sliced back, then expanded to (B, H, Sq, Sk) without a copy. So the kernel saves the
    mask in its own shape (padded once, never per head or batch where it broadcasts). The ops are autograd's, so a
    learned bias gets its gradient back through them as on the GPU."""
    aligned = all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1)) and mask.stride(-1) == 1
    if not aligned:
        sk = mask.size(-1)
        mask = torch.constant_pad_nd(mask, (0, 8 - sk % 8))[..., :sk]
    return mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
          is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """The math path op by op, as ``_scaled_dot_product_attention_math`` (attention.cpp) runs on a GPU:
    16-bit inputs upcast to float32; q and k each scaled by sqrt(scale); the causal mask as an additive
    (Sq, Sk) tensor; K/V heads repeated for GQA (``pre_process_group_query_attention_input``); the mask
    added to the scores in place; ``_safe_softmax``; dropout; the product with V. It returns
    ``(matmul(attn, v).to(dtype), attn.to(dtype))`` and its caller keeps the first: for 16-bit inputs the
    probabilities' copy exists while the product is formed (GCC evaluates the tuple's arguments right to
    left).

    Fake mode runs this rather than the C++ composite for two GPU choices: the mask is added in place
    there, where the C++ adds out of place when any tensor is subclass-like (``areAnyTensorSubclassLike``,
    true for fake tensors: one (B, H, Sq, Sk) block the GPU never allocates); and ``at::dropout`` takes the
    fused ``native_dropout`` on CUDA (a boolean mask kept), where the CPU keeps a noise tensor of the
    scores' dtype.
    """
    # the C++ function's locals (upcast copies, scaled query, expanded K/V) live until it returns
    out_dtype = q.dtype
    q_acc, k_acc, v_acc = ((x.float() if x.dtype in _HALF else x) for x in (q, k, v))
    s = scale if scale is not None else 1.0 / math.sqrt(q_acc.size(-1))
    f = math.sqrt(abs(s))
    query = q_acc * (f if s >= 0 else -f)
    if is_causal:
        mask = _additive_mask(torch.ones(query.size(-2), k_acc.size(-2), dtype=torch.bool).tril(), query.dtype)
    k_exp, v_exp = k_acc, v_acc
    if enable_gqa and not (query.size(-3) == k_acc.size(-3) == v_acc.size(-3)):
        k_exp = k_acc.repeat_interleave(query.size(-3) // k_acc.size(-3), dim=-3)
        v_exp = v_acc.repeat_interleave(query.size(-3) // v_acc.size(-3), dim=-3)
    attn = torch.matmul(query, k_exp.transpose(-2, -1) * f)
    if mask is not None:
        attn.add_(mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.ops.aten.native_dropout(attn, dropout_p, True)[0]
    probs = attn.to(out_dtype)  # noqa: F841 - the tuple's second element, dropped by the caller
    return torch.matmul(attn, v_exp).to(out_dtype)


def run_sdpa(choice: SdpaChoice, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
             dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """Run the call on CPU (fake) tensors so that it allocates what ``choice`` allocates on the GPU.

    ``math`` runs the math implementation op by op as the GPU does (:func:`_math`: scores, softmax and,
    with dropout, its mask are real tensors kept for backward). The fused backends
    run the CPU flash kernel, which saves the output and a float32 logsumexp like the GPU kernels (the
    emulator then gives its logsumexp the GPU kernel's size); their dropout is regenerated in backward
    from a seed, so no dropout mask exists: the CPU kernel runs without it.
    """
    mask = _additive_mask(attn_mask, q.dtype) if attn_mask is not None else None
    if choice.backend == "math":
        return _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    if mask is not None and choice.backend == "efficient":
        mask = _efficient_mask(mask, q, k)
        if mask.requires_grad and torch.is_grad_enabled():
            # a learned bias (relative positions): the CUDA kernel also returns the bias's gradient, of the padded
            # shape (attention_backward.cu, ``grad_bias``), which the CPU flash kernel cannot take a mask for. The
            # mem-efficient op itself runs: its meta kernels have the GPU's shapes (logsumexp padded to 32 rows).
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, True, 0.0, is_causal, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)[0]
