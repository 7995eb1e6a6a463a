"""Gradient accumulation in the autograd engine: in place for real tensors, out of place for fake ones.

When two gradients reach the same input of a backward node (a tensor used twice in the forward: tied
input and output embeddings, a residual branch), the engine sums them in the node's input buffer
(``torch/csrc/autograd/input_buffer.cpp``, ``accumulate``). With grad mode off (backward without
``create_graph``) it adds the new gradient *into* the old one, ``old_var.add_(var)``, when
``can_accumulate_inplace(old_var)`` holds: a dense, non-overlapping tensor of which the buffer holds
the last reference, and not a tensor subclass. Otherwise it allocates ``old_var + var``.

Fake tensors are tensor subclasses, and ``at::isTensorSubclassLike`` (``ATen/TensorSubclassLikeUtils.h``)
also answers true for every tensor while any dispatch mode is active, so under fake mode (and under any
tracer, ``measure_step(device="cuda")`` included) every such sum allocates a new tensor next to both
addends, which a plain loop on the GPU does not. Under amp-bf16 with tied input and output embeddings
(Gemma, BERT) that is one extra (vocab x hidden) float32 gradient at the end of backward: Gemma 2's
(256000 x 2304) made the simulated reserved memory 7.9% high. Fake mode sums in place where a plain
run would (:func:`engine_accumulation`); with ``CudaTarget.plain()`` it keeps the traced CPU run's
out-of-place sums, which it is compared against.

A gradient that arrives as a view is not summed in place on the GPU either: a view made in backward
keeps its base alive (its autograd view metadata), so the storage has two users. That is the case of
an fp32 tied output projection, whose weight gradient reaches the buffer through ``t()``; under
autocast it reaches it through the float32 cast (``ToCopyBackward``), a tensor of its own.

The engine's sum reaches the dispatcher as ``aten.add.Tensor(old_var, var)`` with grad mode off during
backward, two tensors of one shape, dtype and device and no ``alpha``; a user's ``a + b`` inside a custom
``backward`` looks the same and is summed in place too (a possible undercount of one tensor, where ``a``
stays in use). "The last reference" is assumed: an engine gradient is held by the buffer alone unless
the same tensor arrives twice (``x + x``: summed out of place, as on the GPU), a hook keeps it, or it is
retained (``retain_grad``), which fake mode does not see.
"""

from __future__ import annotations

from typing import Any

import torch


def engine_accumulation(func: Any, args: tuple, kwargs: dict, phase: str) -> Any:
    """The in-place sum for an autograd-engine gradient accumulation that a real tensor would get
    (see the module docstring), else ``NotImplemented``."""
    if func is not torch.ops.aten.add.Tensor or phase != "backward" or torch.is_grad_enabled():
        return NotImplemented
    if len(args) != 2 or kwargs.get("alpha", 1) != 1 or set(kwargs) - {"alpha"}:
        return NotImplemented
    old, new = args
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or old is new:
        return NotImplemented
    if (old.shape != new.shape or old.dtype != new.dtype or old.device != new.device or old.requires_grad
            or old.is_sparse or new.is_sparse or not _non_overlapping_and_dense(old) or old._is_view()):
        return NotImplemented
    return old.add_(new)


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    try:
        from torch._prims_common import is_non_overlapping_and_dense_or_false
    except ImportError:   # another torch: contiguity is the common case of that layout
        return t.is_contiguous()
    return bool(is_non_overlapping_and_dense_or_false(t))
