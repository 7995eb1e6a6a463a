"""Composite ops under CUDA autocast: what the GPU runs when autocast has no rule for the op itself.

CUDA autocast (``ATen/autocast_mode.cpp``, ``TORCH_LIBRARY_IMPL(aten, Autocast, m)``) registers casts
for the ops in ``autocast_mode.h``'s lists and a fallthrough for every other op. A composite op that
is on no list (``CompositeImplicitAutograd``) therefore runs its C++ decomposition, and each sub-op it
calls meets autocast on its own. On the CPU the decomposition runs in C++ too, out of reach of a
Python-level emulation (:class:`labkit.memory.trace.fake.fake_cuda.CudaAutocast`), so fake mode runs the
same decomposition in Python, under the emulated autocast.

``cross_entropy`` is such an op on CUDA (CPU autocast, by contrast, lists ``cross_entropy_loss`` as
float32). ``cross_entropy_loss_symint`` (``ATen/native/LossNLL.cpp``) computes
``at::log_softmax(self, class_dim, self.scalar_type())``: the dtype is given explicitly, and autocast's
``fp32_set_opt_dtype`` policy keeps an explicit dtype (``set_opt_dtype``), so on bfloat16 logits the
log-probabilities are bfloat16 (kept by ``log_softmax``'s backward). ``nll_loss_nd`` then calls
``nll_loss`` (float32 list), which casts them to a float32 copy that ``nll_loss_forward`` keeps for
its backward. In backward the float32 gradient of that copy is cast down to bfloat16 before
``log_softmax``'s backward: the logits' gradient never exists in float32 next to float32
log-probabilities, as it would if the whole loss were cast to float32. Models that upcast their
logits first (transformers' causal-LM loss calls ``logits.float()``) are unaffected.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn import _reduction

LOW_PRECISION = (torch.float16, torch.bfloat16)

_CE_PARAMS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
              "label_smoothing")


def decomposes_under_cuda_autocast(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether CUDA autocast would run this Python-level call as its composite decomposition in a
    lower precision (its first tensor argument is float16 or bfloat16)."""
    if name not in _COMPOSITES:
        return False
    x = args[0] if args else kwargs.get("input")
    return isinstance(x, torch.Tensor) and x.dtype in LOW_PRECISION


def composite_under_cuda_autocast(name: str) -> Callable[..., Any]:
    """The Python decomposition of op ``name`` (one for which :func:`decomposes_under_cuda_autocast`)."""
    return _COMPOSITES[name]


def cross_entropy(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.cross_entropy`` as ``cross_entropy_loss_symint`` decomposes it (``LossNLL.cpp``): run it
    under the emulated CUDA autocast so that each sub-op meets autocast's lists as on the GPU."""
    p: dict[str, Any] = {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None,
                         "reduction": "mean", "label_smoothing": 0.0}
    p.update(zip(_CE_PARAMS, args))
    p.update(kwargs)
    x, target, weight = p["input"], p["target"], p["weight"]
    reduction = p["reduction"]
    if p["size_average"] is not None or p["reduce"] is not None:
        reduction = _reduction.legacy_get_string(p["size_average"], p["reduce"])
    smoothing = float(p["label_smoothing"])
    class_dim = 0 if x.dim() == 1 else 1
    logp = torch.log_softmax(x, class_dim, dtype=x.dtype)   # explicit dtype: autocast keeps it
    if x.shape == target.shape:                             # class probabilities
        return _prob_target(logp, target, weight, reduction, smoothing, class_dim)
    nll = F.nll_loss(logp, target, weight, ignore_index=p["ignore_index"], reduction=reduction)
    if smoothing <= 0.0:
        return nll
    return _label_smoothing(logp, nll, target, weight, reduction, p["ignore_index"], smoothing, class_dim)


def _class_view(weight: torch.Tensor, dim: int, class_dim: int) -> torch.Tensor:
    shape = [1] * dim
    shape[class_dim] = weight.size(0)
    return weight.view(shape)


def _prob_target(logp: torch.Tensor, target: torch.Tensor, weight: Any, reduction: str, smoothing: float,
                 class_dim: int) -> torch.Tensor:
    """``cross_entropy_loss_prob_target``."""
    n_classes = logp.size(class_dim)
    if smoothing > 0.0:
        target = target * (1 - smoothing) + smoothing / n_classes
    prod = logp * target
    if weight is not None:
        prod = prod * (_class_view(weight, logp.dim(), class_dim) if logp.dim() > 1 else weight)
    if reduction == "none":
        return -prod.sum(class_dim)
    total = -prod.sum()
    return total / (logp.numel() // n_classes) if reduction == "mean" else total


def _label_smoothing(logp: torch.Tensor, nll: torch.Tensor, target: torch.Tensor, weight: Any, reduction: str,
                     ignore_index: int, smoothing: float, class_dim: int) -> torch.Tensor:
    """``cross_entropy_loss_label_smoothing`` (the branch it takes for tensor subclasses, which fake
    tensors are: no data-dependent ``masked_select``)."""
    n_classes = logp.size(class_dim)
    if weight is not None:
        smooth = -(logp * _class_view(weight, logp.dim(), class_dim)).sum(class_dim)
    else:
        smooth = -logp.sum(class_dim)
    ignore = target == ignore_index
    smooth.masked_fill_(ignore, 0.0)
    if reduction == "mean":
        if weight is not None:
            denom = weight.gather(0, target.masked_fill(ignore, 0).flatten()).masked_fill(ignore.flatten(), 0).sum()
        else:
            denom = (~ignore).sum()
        ret = smooth.sum() / denom
    elif reduction == "sum":
        ret = smooth.sum()
    else:
        ret = smooth
    return (1 - smoothing) * nll + ret * (smoothing / n_classes)


_COMPOSITES: dict[str, Callable[..., Any]] = {"cross_entropy": cross_entropy}
