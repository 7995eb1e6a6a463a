"""``F.rms_norm`` (``nn.RMSNorm``) as a CUDA build runs it: one fused kernel from torch 2.9.

``rms_norm`` is a composite op. On a CUDA build it calls ``_fused_rms_norm``, whose CUDA kernel writes the output
and a float32 ``rstd`` per row, and whose derivative saves only the input, ``rstd`` and the weight
(aten/src/ATen/native/layer_norm.cpp ``rms_norm_symint``; tools/autograd/derivatives.yaml ``_fused_rms_norm``).
A CPU build has no such kernel: ``_fused_rms_norm`` decomposes into ``rms_norm_composite`` (``x * rsqrt(mean(x²) +
eps)``, then ``* weight``), whose multiplications save the normalised input too, one more tensor of the input's size
in float32 per norm. Fake mode runs on a CPU build, so it makes the CUDA kernel's allocations itself
(:class:`_FusedRmsNorm`). A user's Llama with ``nn.RMSNorm`` over a float32 residual stream (data/scripts/users/
complex_rope_lm.py) kept two such tensors per layer: +7.3% peak before this rule.

``rms_norm_symint`` keeps the composite where the fused kernel does not apply, and so does fake mode: a channels-last
or complex input, or a weight whose dtype differs from the input's (torch warns, "Can not dispatch to fused
implementation"). The fused path exists from torch 2.9 (``targets/torch_gates.json`` ``fused_rms_norm``); for an
older target torch the composite runs, as it did there.

The kernel (``_fused_rms_norm_cuda``, aten/src/ATen/native/cuda/layer_norm_kernel.cu) reads a contiguous copy of a
non-contiguous input (``expect_contiguous``, freed on return), writes a contiguous output of the input's dtype and
``rstd`` of the accumulation type (float32 for half, bfloat16 and float32 inputs); its backward writes the input's
gradient (contiguous) and the weight's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from labkit.memory.trace.fake.sdpa import parse_version
from labkit.memory.trace.fake.targets import TORCH_GATES

_PARAMS = ("input", "normalized_shape", "weight", "eps")


def fused_applies(x: torch.Tensor, weight: torch.Tensor | None, target_torch: str) -> bool:
    """Whether a CUDA build of ``target_torch`` runs ``rms_norm(x, ..., weight)`` as the fused kernel."""
    if parse_version(target_torch) < parse_version(TORCH_GATES["fused_rms_norm"]["torch"]):
        return False
    if x.is_complex() or not x.is_floating_point():
        return False
    if _channels_last(x):
        return False
    return weight is None or weight.dtype == x.dtype


def _channels_last(x: torch.Tensor) -> bool:
    """ATen's ``suggest_memory_format() == ChannelsLast(3d)``, from Python: laid out channels-last and not also plain
    contiguous (a tensor both ways, e.g. one channel, suggests the plain format)."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and x.is_contiguous(memory_format=fmt) and not x.is_contiguous()


def run_rms_norm(args: tuple, kwargs: dict, target_torch: str) -> Any:
    """``F.rms_norm(input, normalized_shape, weight=None, eps=None)`` with the fused kernel's allocations, or
    ``NotImplemented`` where the composite runs on the GPU too."""
    p = dict(zip(_PARAMS, args))
    p.update(kwargs)
    x, weight = p["input"], p.get("weight")
    if not isinstance(x, torch.Tensor) or not fused_applies(x, weight, target_torch):
        return NotImplemented
    shape = tuple(p["normalized_shape"]) if isinstance(p["normalized_shape"], Sequence) else (p["normalized_shape"],)
    if tuple(x.shape[x.dim() - len(shape):]) != shape:
        return NotImplemented                  # the composite raises torch's own error for a wrong shape
    if weight is None:
        return _FusedRmsNorm.apply(x, len(shape))
    return _FusedRmsNorm.apply(x, len(shape), weight)


class _FusedRmsNorm(torch.autograd.Function):
    """The fused kernel's memory on fake tensors (shapes and lifetimes; no values)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dims: int, weight: torch.Tensor | None = None) -> torch.Tensor:
        xc = x.contiguous()                     # expect_contiguous: a copy only for a non-contiguous input
        out = torch.empty_like(xc, memory_format=torch.contiguous_format)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        rstd = x.new_empty((*x.shape[:x.dim() - dims], *([1] * dims)), dtype=acc)
        del xc
        ctx.save_for_backward(x, rstd, *([weight] if weight is not None else []))
        ctx.has_weight = weight is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        saved = ctx.saved_tensors
        x = saved[0]
        gx = torch.empty_like(x, memory_format=torch.contiguous_format) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.has_weight and ctx.needs_input_grad[2]:
            gw = torch.empty_like(saved[2])
        return (gx, None, gw) if ctx.has_weight else (gx, None)


__all__ = ["fused_applies", "run_rms_norm"]
