"""Values fake mode can know: tensors a program computes from Python numbers alone.

Fake tensors carry no data, so an integer read (``.item()``, ``.tolist()``, ``int(t)``) of one refuses:
the value could decide what follows. But a tensor made by ``torch.arange``, ``torch.linspace`` or
``torch.full`` from Python numbers, and whatever is computed from such tensors only, has a value that
depends on no input: the program computes it the same way on any device. PyTorch's ``FakeTensorMode``
already keeps such values (a fake tensor's ``constant``) for ``torch.tensor(...)`` and for one-element
results (``CONSTANT_NUMEL_LIMIT = 1`` and the ``all_constant`` path of ``FakeTensorMode._dispatch_impl``,
torch/_subclasses/fake_tensor.py); :func:`known_value` extends the rule to factories and ``torch.tensor`` of
Python numbers and to small results (up to :data:`KNOWN_NUMEL_LIMIT` elements) computed from known values only.

Fake mode applies the factory part while the model is built (the ``init`` phase: a constructor's arithmetic on
such values decides the model's shapes) and the rest in every phase (``pack_padded_sequence``'s batch sizes,
read back by ``nn.LSTM``). Example: torchvision's RegNet computes its stage widths at construction
(``BlockParams.from_init_params``, torchvision/models/regnet.py: ``torch.arange(depth) * w_a + w_0``,
``torch.round``, ``torch.log``, then ``.int().tolist()``); that read is now answered with the value the
GPU run computes.

Host values are known too: ``torch.tensor`` of host data (a NumPy array, a list) in every phase, and the small
integer and boolean tensors of the batch ``measure_step`` is given (``backends.FakeCudaBackend.to_device``): a GPU
run computes with the same values. Example: Wav2Vec2ForCTC flattens its padded labels with
``labels.masked_select(labels >= 0)`` and masks time steps with a mask drawn by NumPy (SpecAugment); with those
values known, the selection's size, the mask's indices (:func:`known_mask_indexing`) and the CTC loss's shapes
(``fake_cuda.ctc_loss_outputs``) are the GPU run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

aten = torch.ops.aten
# factories whose arguments are Python numbers only (shapes, ranges, fill values)
FACTORIES = frozenset({aten.arange.default, aten.arange.start, aten.arange.start_step, aten.linspace.default,
                       aten.logspace.default, aten.scalar_tensor.default, aten.full.default})
LIFTS = frozenset({aten.lift_fresh.default, aten.lift_fresh_copy.default})
# results up to this many elements are computed for real (the widths of a network's stages, a short table):
# the computation costs nothing, while a large one would spend real memory on the CPU
KNOWN_NUMEL_LIMIT = 4096


def _fake_mode() -> Any:
    for m in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(m, FakeTensorMode):
            return m
    return None


def known_value(func: Any, args: tuple, kwargs: dict, *, factories: bool = True) -> Any:
    """``func``'s result as fake tensors that know their value (``constant``), where every input is a
    Python number or such a tensor and the result is small; else ``NotImplemented``. ``factories``: also
    tensors made from Python numbers alone (fake mode's ``init`` phase: a constructor's arithmetic)."""
    if not isinstance(func, torch._ops.OpOverload):
        return NotImplemented
    for a in args:      # the common case, an op on data, leaves at once
        if isinstance(a, FakeTensor) and a.constant is None:
            return NotImplemented
    if not factories and func not in LIFTS and not any(isinstance(a, FakeTensor) for a in args):
        return NotImplemented
    flat, spec = tree_flatten((args, kwargs))
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    if tensors:
        # a real tensor here is a Python number the dispatcher wrapped (``x * 2.5``: a 0-dim CPU tensor)
        if not all(t.constant is not None if isinstance(t, FakeTensor) else t.device.type == "cpu" for t in tensors):
            return NotImplemented
        fakes = [t for t in tensors if isinstance(t, FakeTensor)]
        if not fakes and func not in LIFTS:     # torch.tensor([...]) of Python numbers arrives as a lift
            return NotImplemented
        if (torch.Tag.nondeterministic_seeded in func.tags or func._schema.is_mutable
                or any(t.numel() > KNOWN_NUMEL_LIMIT for t in tensors)):
            return NotImplemented
        mode = fakes[0].fake_mode if fakes else _fake_mode()
        if mode is None:
            return NotImplemented
    else:
        if func not in FACTORIES or not factories:
            return NotImplemented
        mode = _fake_mode()
        if mode is None:
            return NotImplemented
        fake = func(*args, **kwargs)           # the fake result first: its size says whether to compute it
        if fake.numel() > KNOWN_NUMEL_LIMIT or fake.device.type != "cpu":
            return fake
    real = tree_unflatten([a.constant if isinstance(a, FakeTensor) else a for a in flat], spec)
    if func.is_view:
        # a view must stay a view of its input for autograd: fake mode makes it, and it learns the view's value.
        # FakeTensorMode itself, given a view of constants whose result is too large for its own constants
        # (``may_turn_const``: one element), forgets the constants aliasing it, the input's among them
        # (``invalidate_constant_aliases``, torch/_subclasses/fake_tensor.py): the view is made with the inputs'
        # values hidden, so that the input keeps its own (``labels[:, 0]`` does not make ``labels`` unknown)
        held = [(t, t.constant) for t in tensors if isinstance(t, FakeTensor)]
        for t, _ in held:
            t.constant = None
        try:
            fake = func(*args, **kwargs)
        finally:
            for t, value in held:
                t.constant = value
        with _disable_current_modes(), no_dispatch():
            value = func(*real[0], **real[1])
        pairs = zip(tree_flatten(fake)[0], tree_flatten(value)[0])
        for f, v in pairs:
            if isinstance(f, FakeTensor) and isinstance(v, torch.Tensor) and v.numel() <= KNOWN_NUMEL_LIMIT:
                f.constant = v
        return fake
    with _disable_current_modes(), no_dispatch():    # real compute, outside the fake mode
        out = func(*real[0], **real[1])
    if func is aten._local_scalar_dense.default:
        return out                             # the number itself (``.item()``, each element of ``.tolist()``)
    if any(t.numel() > KNOWN_NUMEL_LIMIT for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
        return NotImplemented                  # small inputs, a large result (an expand): fake mode makes it
    with _disable_current_modes(), no_dispatch():
        out = tree_map_only(torch.Tensor, lambda t: t.clone(), out)
    with _disable_current_modes():             # as FakeTensorMode makes its constants: outside every mode
        return tree_map_only(torch.Tensor,
                             lambda t: mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=True), out)


# advanced indexing ops whose indices may be boolean masks
MASK_INDEXED = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                          aten._index_put_impl_.default})


def known_mask_indexing(func: Any, args: tuple, kwargs: dict) -> tuple[Any, int]:
    """``func`` (indexing, :data:`MASK_INDEXED`) with each boolean mask of known value among its indices replaced
    by the long indices of its true elements, as ATen does before indexing (``expandTensors`` in
    aten/src/ATen/native/IndexingUtils.h: a byte or bool index becomes ``index.nonzero()``, one long index per
    dimension), so that the result's shape is known; and the bytes of that ``nonzero`` result, which lives only
    inside the op. ``(NotImplemented, 0)`` where no index is a known mask.
    Example: Wav2Vec2's SpecAugment, ``hidden_states[mask_time_indices] = masked_spec_embed``, with a mask made on
    the host (``torch.tensor`` of a NumPy array); its backward indexes the gradient with the mask."""
    if func not in MASK_INDEXED or len(args) < 2:
        return NotImplemented, 0
    indices = args[1]
    if not any(isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8) and i.constant is not None
               for i in indices):
        return NotImplemented, 0
    mode = next(i.fake_mode for i in indices if isinstance(i, FakeTensor))
    new: list[Any] = []
    nbytes = 0
    for i in indices:
        if isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8) and i.constant is not None:
            with _disable_current_modes(), no_dispatch():
                nz = i.constant.nonzero()
            nbytes += nz.numel() * nz.element_size()
            with _disable_current_modes():
                new += [mode.fake_tensor_converter.from_real_tensor(mode, c.clone(), make_constant=True)
                        for c in nz.unbind(1)]
        else:
            new.append(i)
    return func(args[0], new, *args[2:], **kwargs), nbytes


def every_element(where: str, ops: str = "torch.nonzero, x[mask]") -> str:
    """The assumption said where a mask of unknown values is taken to select every element (fake mode and script
    mode say it alike)."""
    return (f"a mask of unknown values ({where}) selects every element ({ops}): fake tensors have no values, so what "
            "it selects is the largest it can be")


def masked_select_everything(x: Any, mask: Any) -> tuple[int, int]:
    """``torch.masked_select(x, mask)`` selecting every element: the elements of its output, and the bytes of the
    mask's ``nonzero`` indices (int64, one per element and dimension) inside the op. CUDA's kernel indexes the
    broadcast input with the broadcast mask (aten/src/ATen/native/cuda/IndexKernel.cpp
    ``masked_select_out_cuda_impl``: ``index_out``)."""
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    n = math.prod(shape)
    return n, n * max(len(shape), 1) * 8


def unknown_mask_indexing(func: Any, args: tuple, kwargs: dict) -> tuple[Any, int]:
    """``func`` (indexing, :data:`MASK_INDEXED`, ``nonzero`` or ``masked_select``) on a boolean mask of unknown values,
    sized as if the mask selected every element: the largest the result can be (a fake tensor has no values to
    count). As in :func:`known_mask_indexing`, ATen turns the mask into the long indices of its true elements
    (``nonzero``: here one index per element and dimension), which live only inside an indexing op
    (:func:`masked_select_everything`); their bytes are returned with the result. ``(NotImplemented, 0)`` where there
    is no such mask (a mask with known values is :func:`known_mask_indexing`'s)."""
    def unknown(i: Any) -> bool:
        return isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8) and i.constant is None

    if func is aten.nonzero.default and unknown(args[0]):
        return args[0].new_empty((args[0].numel(), args[0].dim()), dtype=torch.long), 0
    if func is aten.masked_select.default and unknown(args[1]):
        n, nbytes = masked_select_everything(args[0], args[1])
        return args[0].new_empty((n,)), nbytes
    if func not in MASK_INDEXED or len(args) < 2 or not any(unknown(i) for i in args[1]):
        return NotImplemented, 0
    new: list[Any] = []
    nbytes = 0
    for i in args[1]:
        if unknown(i):
            new += [i.new_empty((i.numel(),), dtype=torch.long) for _ in range(i.dim())]
            nbytes += i.numel() * i.dim() * 8
        else:
            new.append(i)
    return func(args[0], new, *args[2:], **kwargs), nbytes


_UNIQUE_ARGS = {aten._unique2.default: ("sorted", "return_inverse", "return_counts"),
                aten.unique_consecutive.default: ("return_inverse", "return_counts", "dim")}


@dataclass(frozen=True)
class UniquePlan:
    """What CUDA's ``torch.unique`` (``aten._unique2``) or ``unique_consecutive`` without ``dim`` allocates, whatever
    the values (aten/src/ATen/native/cuda/UniqueCub.cu, ``UniqueCub`` and ``compute_unique``): the values' output
    and the counts at the input's length (``length``), then ``resize_``d to the number found, which keeps the
    storage; the inverse indices (int64) at the input's shape when asked for. Inside the op (``inside``, bytes):
    a sorted copy of the input (not for ``unique_consecutive``) and, for the inverse, an ``arange``, the sorted
    indices and their running sum (int64; ``unique_consecutive``: one int32 array), and the length found (one
    int64); CUB's own temporary storage in the sort is not counted. A boolean input (not consecutive) has at most
    two values and no sort (``UniqueCub<bool>``: outputs of two, one int32 count inside)."""

    consecutive: bool
    length: int             # the values' and counts' storage, elements; the most values it can find
    inverse: bool
    counts: bool
    inside: tuple[int, ...]
    boolean: bool = False   # a boolean input's (not consecutive): two values at most, outputs of two

    @staticmethod
    def of(func: Any, args: tuple, kwargs: dict) -> "UniquePlan | None":
        """The plan of ``func(*args, **kwargs)``; None for another op or with a ``dim``."""
        names = _UNIQUE_ARGS.get(func)
        if names is None:
            return None
        opts = dict(zip(names, args[1:]), **kwargs)
        if opts.get("dim") is not None:
            return None
        x, consecutive = args[0], func is aten.unique_consecutive.default
        inverse, counts, n = bool(opts.get("return_inverse")), bool(opts.get("return_counts")), x.numel()
        if x.dtype == torch.bool and not consecutive:
            return UniquePlan(False, min(n, 2), inverse, counts, (4,), boolean=True)
        if consecutive:
            return UniquePlan(True, n, inverse, counts, (4 * n if inverse else 0, 8))
        return UniquePlan(False, n, inverse, counts, (n * x.element_size(), *((8 * n,) * 3 if inverse else ()), 8))

    def note(self, where: str) -> str:
        """The assumption said where the values are unknown: every value distinct."""
        name = "unique_consecutive" if self.consecutive else "unique"
        return (f"torch.{name} of unknown values ({where}) finds every value distinct, {self.length} of them: the "
                "largest it can be" + ("" if self.boolean else " (its output's memory on the GPU is the input's length "
                                                                "whatever the values)"))


def unknown_unique(func: Any, args: tuple, kwargs: dict) -> tuple[Any, UniquePlan | None]:
    """``torch.unique``/``unique_consecutive`` (no ``dim``) of a fake tensor of unknown values, its outputs sized as
    :class:`UniquePlan` says (every value distinct); ``(NotImplemented, None)`` for another op, a ``dim``, or
    known values."""
    plan = UniquePlan.of(func, args, kwargs)
    x = args[0] if args else None
    if plan is None or not isinstance(x, FakeTensor) or x.constant is not None:
        return NotImplemented, None
    return (x.new_empty((plan.length,)), x.new_empty(x.shape if plan.inverse else (0,), dtype=torch.long),
            x.new_empty((plan.length if plan.counts else 0,), dtype=torch.long)), plan


__all__ = ["FACTORIES", "KNOWN_NUMEL_LIMIT", "UniquePlan", "every_element", "known_mask_indexing", "known_value",
           "masked_select_everything", "unknown_mask_indexing", "unknown_unique"]
