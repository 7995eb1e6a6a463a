"""The storage tracker of a faked program: GPU tensors only, each allocation with its file:line.

:class:`GpuTracker` is :class:`labkit.memory.trace.storage.StorageTracker` (the same events, rounding
and emulator hooks as ``measure_step``) with the placement rules of :mod:`labkit.memory.script.tensor_placement`
at the dispatch level: an op whose outputs land on the host runs untracked and unemulated (a CPU matmul
takes no cuBLAS workspace), a ``device=cuda`` that reaches the dispatcher (from C++ or a checkpoint's
recomputation) is made ``cpu`` and tracked. Each GPU allocation remembers the innermost frame of the
user's own code that led to it (:class:`Sites`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import weakref
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
from torch.utils.weak import WeakIdKeyDictionary
from torch.utils._pytree import tree_leaves

import labkit
from labkit.memory.script.tensor_placement import Placement, is_cuda_device
from labkit.memory.trace.fake.constants import UniquePlan, every_element, masked_select_everything
from labkit.memory.trace.fake.fake_cuda import SCALAR_READS, as_read_by
from labkit.memory.trace.storage import DEVICE_QUERY, StorageTracker, device_of

_CPU = torch.device("cpu")
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_NONZERO = torch.ops.aten.nonzero.default
_TO_COPY = torch.ops.aten._to_copy.default
_BINCOUNT = torch.ops.aten.bincount.default
_INDEXING = frozenset({torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
                       torch.ops.aten._index_put_impl_.default})
# boolean ops one side can decide: the absorbing value (True for OR, False for AND)
_ABSORBING = {torch.ops.aten.bitwise_or.Tensor: True, torch.ops.aten.logical_or.default: True,
              torch.ops.aten.bitwise_or.Scalar: True, torch.ops.aten.bitwise_and.Tensor: False,
              torch.ops.aten.logical_and.default: False, torch.ops.aten.bitwise_and.Scalar: False}
# ATen's out-of-place floating random factories (native_functions.yaml; not the in-place samplers that initialise
# weights): a comparison of a small draw with a number is made from its values (:meth:`GpuTracker._remember_values`)
_FLOAT_DRAWS = frozenset({torch.ops.aten.rand.default, torch.ops.aten.rand.generator, torch.ops.aten.rand_like.default,
                          torch.ops.aten.randn.default, torch.ops.aten.randn.generator,
                          torch.ops.aten.randn_like.default})
# the comparisons of a tensor with a number that read a float draw's values
_DRAW_TESTS = frozenset({torch.ops.aten.lt.Scalar, torch.ops.aten.le.Scalar, torch.ops.aten.gt.Scalar,
                         torch.ops.aten.ge.Scalar})
_MASKED_SELECT = torch.ops.aten.masked_select.default
_UNIQUE = frozenset({torch.ops.aten._unique2.default, torch.ops.aten.unique_consecutive.default})
_DATA_DEPENDENT = frozenset({torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default,
                             torch.ops.aten.unique_consecutive.default, torch.ops.aten.masked_select.default,
                             torch.ops.aten.bincount.default})
#: Host tensors up to this many elements are real (values known), larger ones fake (no memory)
REAL_HOST_NUMEL = 1 << 16


def _library_roots() -> tuple[str, ...]:
    """Folders whose frames are not the user's: the standard library, site-packages, labkit itself."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.abspath(p))
    return tuple(sorted(roots, key=len, reverse=True))


class Sites:
    """Where allocations come from: the innermost frame of the user's code (not torch's, not a
    library's) and the innermost frame outside torch (e.g. a transformers model file)."""

    def __init__(self, user_roots: tuple[str, ...] = ()) -> None:
        self.library = _library_roots()
        self.user_roots = tuple(os.path.abspath(r) for r in user_roots)

        # torch's frames and labkit's own (the fake GPU's machinery) are never the place to look
        self.internal_roots = (os.path.dirname(os.path.abspath(torch.__file__)),
                               os.path.dirname(os.path.abspath(labkit.__file__)))
        self._cache: dict[str, int] = {}        # filename -> 0 torch, 1 library, 2 user
        self.names: list[tuple[str, str]] = []   # site id -> (user frame, library frame)
        self._ids: dict[tuple[str, str], int] = {}

    def _kind(self, filename: str) -> int:
        k = self._cache.get(filename)
        if k is None:
            path = os.path.abspath(filename)
            if path.startswith(self.internal_roots) or filename.startswith("<"):
                k = 0
            elif any(path.startswith(r) for r in self.user_roots):
                k = 2
            elif any(path.startswith(r) for r in self.library):
                k = 1
            else:
                k = 2
            self._cache[filename] = k
        return k

    def here(self) -> int:
        """The site id of the current Python stack."""
        f = sys._getframe(2)
        user = lib = ""
        while f is not None:
            k = self._kind(f.f_code.co_filename)
            if k == 2:
                user = f"{f.f_code.co_filename}:{f.f_lineno}"
                break
            if k == 1 and not lib:
                lib = f"{f.f_code.co_filename}:{f.f_lineno}"
            f = f.f_back
        key = (user, lib)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.names)
            self.names.append(key)
        return sid


class GpuTracker(StorageTracker):
    """See the module docstring. ``placement`` is filled in by :class:`Placement` (it needs the tracker)."""

    def __init__(self, *, emulator: Any, sites: Sites, rounding: int = 512) -> None:
        super().__init__(device_type="meta", rounding=rounding, emulator=emulator)
        self.placement = Placement(self)
        self.sites = sites
        self.site_of: dict[int, int] = {}       # storage id -> site id

        self._emptied: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # GPU storages resized to 0
        self.on_alloc: Any = None               # called after each tracked op (the live allocator)
        self._host: WeakIdKeyDictionary = WeakIdKeyDictionary()   # GPU tensor -> the values it carries (host)
        self._carried: set[int] = set()          # storage ids of GPU tensors that carry values
        self._poisoned: set[int] = set()         # ... whose values were overwritten with unknown ones
        self._drawn: set[int] = set()            # ... whose values come from random draws (made on the host)
        self._float_draws: WeakIdKeyDictionary = WeakIdKeyDictionary()   # GPU float draw -> its host values
        with unset_fake_temporarily():           # the host's stand-in for the GPU's random stream
            self._draws = torch.Generator().manual_seed(0).get_state()

    def _known(self, x: Any) -> Any:
        """The real values of op argument ``x``: itself when it is not a tensor or a real host tensor, the values
        a GPU tensor carries (:meth:`_remember_values`), else :data:`_UNKNOWN`."""
        if not isinstance(x, torch.Tensor) or not is_fake(x):
            return x
        v = self._host.get(x)
        if v is None or self.storage_id(x) in self._poisoned:
            return _UNKNOWN
        return v

    def _remember_values(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Integer and boolean GPU tensors of up to :data:`REAL_HOST_NUMEL` elements carry their values, kept on
        the host for the data-dependent questions fake mode later answers from them (:meth:`host_values`): one
        copied from a real host tensor, or made by a GPU op from values that are all known (real host tensors,
        Python numbers, GPU tensors that carry values), the op run again on those values on the host. A random
        op (ATen's ``nondeterministic_seeded`` tag: ``randint``, ``randperm``, ...) draws on the host: the same
        distribution, not the GPU's numbers (said in the notes). An op that writes into a tensor from unknown
        values makes its storage's carried values unknown (every view of it included).

        A floating draw of :data:`_FLOAT_DRAWS` keeps its values (drawn on the host) for one use only: a comparison
        of it with a number (:data:`_DRAW_TESTS`), whose boolean then carries values. A masked LM's ``torch.rand(
        ids.shape) < 0.15`` so selects about 15% of its tokens, as on the GPU, not every one. A one-element draw does
        not (a coin flip such as Hugging Face's LayerDrop: fake mode takes the branch of most memory and says the
        peak is random there, :mod:`labkit.memory.trace.fake.healthy_values`), nor does any other use of a draw
        (``randn`` stands in for data: its ``argmax``, say, stays unknown as a model's output is)."""
        mutable = _mutable(func)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if func in _FLOAT_DRAWS and isinstance(out, torch.Tensor) and 1 < out.numel() <= REAL_HOST_NUMEL:
            real = self._run_on_values(func, args, kwargs)
            if real is not None:
                self._float_draws[out] = real
                sid = self.storage_id(out)
                if sid is not None:
                    self._drawn.add(sid)
            return
        small = bool(outs) and all(isinstance(o, torch.Tensor) and not o.is_floating_point() and not o.is_complex()
                                   and o.numel() <= REAL_HOST_NUMEL for o in outs)
        if not small and not mutable:
            return
        real = None
        if small and not getattr(func, "__name__", "").startswith(("empty", "new_empty")):  # empty: no values
            real = self._run_on_values(func, args, kwargs)
            if real is None and func in _ABSORBING and isinstance(out, torch.Tensor):
                real = self._absorbed(func, args, out)
        if real is None:
            if mutable:
                self._forget(args, kwargs)
            return
        drawn = torch.Tag.nondeterministic_seeded in func.tags or any(
            self.storage_id(x) in self._drawn for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor))
        reals = real if isinstance(real, (tuple, list)) else (real,)
        for o, r in zip(outs, reals):
            if isinstance(r, torch.Tensor) and r.shape == o.shape:
                self._carry(o, r, drawn)

    def _carry(self, out: torch.Tensor, values: torch.Tensor, drawn: bool) -> None:
        """GPU tensor ``out`` carries ``values`` (a host tensor of its shape); ``drawn``: made from random draws."""
        self._host[out] = values
        sid = self.storage_id(out)
        if sid is not None:
            self._carried.add(sid)
            if drawn:
                self._drawn.add(sid)

    def _absorbed(self, func: Any, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        """A boolean OR with a known all-true side is all true, an AND (boolean or integer) with a known all-zero
        side all zero, whatever the other side holds: generation's stopping check (transformers' ``generate``:
        ``unfinished_sequences & ~stopping_criteria(...)``, whose ``StoppingCriteriaList`` ORs the length limit
        with the EOS check, the sampled tokens unknown here) then ends at the length limit as on the GPU. None when
        neither side decides."""
        absorbing = _ABSORBING[func]
        if absorbing and out.dtype != torch.bool:
            return None
        for a in args[:2]:
            v = self._known(a)
            with unset_fake_temporarily():
                if isinstance(v, torch.Tensor) and not is_fake(v):
                    decides = bool((v.bool() == absorbing).all())
                else:
                    decides = isinstance(v, (bool, int)) and bool(v) == absorbing and (absorbing or v == 0)
                if decides:
                    return torch.full(tuple(out.shape), int(absorbing), dtype=out.dtype)
        return None

    def _run_on_values(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func`` run on the host on its arguments' known values; None if one is unknown or the host fails."""
        def known(a: Any) -> Any:
            if isinstance(a, (list, tuple)):
                items = [self._known(x) for x in a]
                return _UNKNOWN if any(x is _UNKNOWN for x in items) else type(a)(items)
            return self._known(a)

        if func in _DRAW_TESTS and args and isinstance(args[0], torch.Tensor) and args[0] in self._float_draws:
            args = (self._float_draws[args[0]], *args[1:])
        rargs = [known(a) for a in args]
        rkw = {k: known(v) for k, v in kwargs.items()}
        if any(a is _UNKNOWN for a in rargs) or any(v is _UNKNOWN for v in rkw.values()):
            return None
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        with unset_fake_temporarily():
            if seeded:                                  # a stream of its own: the program's host draws are its own
                saved = torch.get_rng_state()
                torch.set_rng_state(self._draws)
            try:
                return func(*rargs, **rkw)
            except Exception:  # noqa: BLE001 - the host cannot run it as the GPU does: its values stay unknown
                return None
            finally:
                if seeded:
                    self._draws = torch.get_rng_state()
                    torch.set_rng_state(saved)

    def _forget(self, args: tuple, kwargs: dict) -> None:
        """An op wrote into its arguments from values not known here: their storages carry no values any more."""
        if self._carried:
            for leaf in tree_leaves((args, kwargs)):
                sid = self.storage_id(leaf) if isinstance(leaf, torch.Tensor) else None
                if sid in self._carried:
                    self._poisoned.add(sid)

    def host_values(self, t: Any,
                    use: str = "transformers' padding or packing check was answered") -> torch.Tensor | None:
        """The values GPU tensor ``t`` carries (an attention mask, position ids: :meth:`_remember_values`), as a
        real host tensor; None when they are unknown (made on the GPU from unknown values, or from a host tensor
        too large to be real: :data:`REAL_HOST_NUMEL`)."""
        v = self._known(t)
        if v is _UNKNOWN or v is t:
            return None
        if self.storage_id(t) in self._drawn and self.emulator is not None:
            self.emulator.assume("values drawn at random on the fake GPU (tensors of up to 65,536 elements) are drawn on "
                                 f"the host, the same distribution and not the GPU's numbers; {use} from values made "
                                 "from them")
        return v

    def _track_storage(self, st: Any, nbytes: int | None = None) -> int:
        before = self._next_id
        n = super()._track_storage(st, nbytes)
        if self._next_id != before:
            self.site_of[before] = self.sites.here()
        return n

    def sid_of_storage(self, st: Any) -> int | None:
        """The tracker's id of GPU storage ``st``, or None when the fake GPU did not allocate it."""
        known = self._ids.get(id(st))
        return known[1] if known is not None and known[0]() is st else None

    def storage_resized(self, st: Any, nbytes: int) -> None:
        """``UntypedStorage.resize_`` on a GPU storage (FSDP2 frees an unsharded parameter's memory with
        ``resize_(0)`` and allocates it again with ``resize_(n)``, the tensor kept): a free, then a new block.
        Storage resizes are not dispatched ops, so :func:`resized_storages` reports them here."""
        key = id(st)
        known = self._ids.get(key)
        if known is not None and known[0]() is st:
            sid = known[1]
            if sid in self.live:
                self.live.discard(sid)
                n = self.sizes[sid]
                self.current -= n
                self.events.append((sid, -n, self.phase_index))
            self._ids.pop(key, None)
            self._emptied[key] = st
        elif key in self._emptied and self._emptied[key] is not st:
            self._emptied.pop(key, None)
        if nbytes > 0 and (key in self._emptied):
            self._emptied.pop(key, None)
            self._track_storage(st, nbytes)
        if self.on_alloc is not None:
            self.on_alloc()

    def _gpu_op(self, func: Any, args: tuple, kwargs: dict) -> bool:
        d = self.placement.directed
        if d is not None:
            return d == "gpu"
        if is_cuda_device(kwargs.get("device")):
            return True
        # an ATen op's arguments are tensors, lists of tensors (``Tensor[]``, ``Tensor?[]``) and non-tensors
        ids = self._ids
        for group in (args, kwargs.values()):
            for a in group:
                for t in (a,) if isinstance(a, torch.Tensor) else a if isinstance(a, (list, tuple)) else ():
                    if isinstance(t, torch.Tensor):
                        try:
                            st = t.untyped_storage()
                        except (NotImplementedError, RuntimeError):  # sparse, nested or functional wrappers
                            continue
                        known = ids.get(id(st))
                        if known is not None and known[0]() is st:
                            return True
        return False

    supports_higher_order_operators = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is DEVICE_QUERY:               # ``tensor.device``: nothing to track (storage.DEVICE_QUERY)
            return device_of(args, kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            # e.g. DTensor's run_dtensor_rng_op: its body's ops run on the modes below; none allocates here
            return func(*args, **(kwargs or {}))
        if any(t not in _PLAIN_TYPES and getattr(t, "__name__", "") != "FakeTensor" for t in types):
            # a tensor subclass (DTensor, ...) dispatches itself; its ops on its inner tensors come back here
            return NotImplemented
        kwargs = dict(kwargs or {})
        if func is _TO_COPY and kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu":
            values = self.host_values(args[0], "a host copy of them (.cpu()) holds them")
            if values is not None:       # small host tensors are real (REAL_HOST_NUMEL): a copy of carried values too
                with unset_fake_temporarily():
                    return values.to(dtype=kwargs.get("dtype") or values.dtype, copy=True)
        gpu = self._gpu_op(func, args, kwargs)
        if is_cuda_device(kwargs.get("device")):
            kwargs["device"] = _CPU
        if func in SCALAR_READS:           # a GPU tensor, or a host copy of one (.cpu()), that carries its values
            values = self.host_values(args[0], "a value read from them (.item(), .tolist(), if t:) was answered")
            if values is not None:
                with unset_fake_temporarily():
                    return as_read_by(func, values.item())
        if gpu and func is _NONZERO:
            return self._nonzero(types, args[0])
        if gpu and func in _DATA_DEPENDENT:
            known = self._data_dependent(func, types, args, kwargs)
            if known is not None:
                return known
        if gpu and func in _INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                             for i in args[1]):
            args = (args[0], self._mask_indices(types, args[1]), *args[2:])
        p = self.placement
        p.internal += 1
        try:
            if not gpu:
                return self._host_op(func, args, kwargs)
            out = _TRACK(self, func, types, args, kwargs)
        finally:
            p.internal -= 1
        self._remember_values(func, args, kwargs, out)
        if self.on_alloc is not None:
            self.on_alloc()
        return out

    def _nonzero(self, types: Any, x: torch.Tensor) -> Any:
        """``torch.nonzero`` of a GPU tensor (a boolean mask's indexing ``x[mask]``, ``mask.nonzero()``): its output
        holds one row of indices per nonzero element (aten/src/ATen/native/cuda/Nonzero.cu counts them, then sizes
        the output to the count), a size fake tensors do not have. Counted from the values the mask carries
        (:meth:`_remember_values`); where they are unknown, every element is taken as nonzero, the largest output,
        said in the notes."""
        values = self.host_values(x, "a mask's selection (torch.nonzero, x[mask]) was counted")
        if values is not None:
            with unset_fake_temporarily():
                real = torch.nonzero(values)
            return self._new_gpu(types, x, real, drawn=self.storage_id(x) in self._drawn)
        routed = self._routed_nonzero(x)
        if routed is not None:
            return self._new_gpu(types, x, routed)
        self.emulator.assume(every_element(self.emulator.modules.where()))
        return self._new_gpu(types, x, torch.empty(x.numel(), x.dim(), dtype=torch.long, device="meta"))

    def _routed_nonzero(self, x: torch.Tensor) -> torch.Tensor | None:
        """A mixture-of-experts dispatch's ``nonzero`` (the experts hit, or one expert's rows: ``torch.where(ids ==
        e)`` on a ``topk``'s indices), answered from the assumed routing as ``measure_step`` answers it
        (:class:`labkit.memory.trace.fake.moe.RoutingOracle`): a host tensor of the output's shape, carrying the
        expert ids where the oracle knows them, else on the meta device. None when ``x`` is no routing mask."""
        routing = getattr(self.emulator, "routing", None)
        out = routing.replace(torch.ops.aten.nonzero.default, (x,), {}) if routing is not None else NotImplemented
        if out is NotImplemented:
            return None
        known = routing.values.get(out)
        with unset_fake_temporarily():
            if known is not None and out.numel() == len(known):
                return torch.tensor(known, dtype=out.dtype).view(out.shape)
            return torch.empty(out.shape, dtype=out.dtype, device="meta")

    def _data_dependent(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """An op whose output sizes follow from its input's values (``torch.unique``, ``masked_select``), on GPU
        tensors that carry their values: run on those values on the host, each output allocated on the GPU at its
        real size and carrying its values; None where a value is unknown (fake mode then refuses the op)."""
        real = self._run_on_values(func, args, kwargs)
        drawn = real is not None and any(self.storage_id(x) in self._drawn
                                         for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor))
        if drawn:
            self.host_values(args[0], f"the sizes of {func.__name__.split('.')[0]} were taken")
        if func in _UNIQUE:
            out = self._unique(func, types, args, kwargs, real, drawn)
            if out is not None:
                return out
        if real is None and func is _MASKED_SELECT:
            return self._masked_select_everything(types, args)
        if real is None:
            return self._bincount_by_minlength(types, args, kwargs) if func is _BINCOUNT else None
        if isinstance(real, (tuple, list)):
            return tuple(self._new_gpu(types, args[0], r, drawn=drawn) for r in real)
        return self._new_gpu(types, args[0], real, drawn=drawn)

    def _unique(self, func: Any, types: Any, args: tuple, kwargs: dict, real: Any, drawn: bool) -> Any:
        """``torch.unique`` or ``torch.unique_consecutive`` without ``dim`` as the GPU allocates it
        (:class:`~labkit.memory.trace.fake.constants.UniquePlan`): the values and counts are views of storage of the
        input's length. The number found is ``real``'s (the op run on carried values; ``drawn``: those come from
        random draws) or, where the values are unknown, every value distinct: the largest (said in the notes). None
        with a ``dim``."""
        plan = UniquePlan.of(func, args, kwargs)
        if plan is None:
            return None
        x = args[0]
        if real is None:
            found = plan.length
            self.emulator.assume(plan.note(self.emulator.modules.where()))
        else:
            found = real[0].numel()
        long = torch.long
        made = [self._new_gpu(types, x, torch.empty(plan.length, dtype=x.dtype, device="meta")),
                self._new_gpu(types, x, torch.empty(x.shape if plan.inverse else (0,), dtype=long, device="meta")),
                self._new_gpu(types, x, torch.empty(plan.length if plan.counts else 0, dtype=long, device="meta"))]
        for i in (0, 2):
            if made[i].numel() != found:
                made[i] = _TRACK(self, torch.ops.aten.slice.Tensor, types, (made[i], 0, 0, found), {})
        self.transient_group(list(plan.inside))
        if real is not None:
            for o, r in zip(made, real):
                if r.shape == o.shape and r.numel() <= REAL_HOST_NUMEL:
                    self._carry(o, r, drawn)
        return tuple(made)

    def _masked_select_everything(self, types: Any, args: tuple) -> Any:
        """``torch.masked_select(x, mask)`` with a mask of unknown values: every element selected, as ``x[mask]`` is
        (:meth:`_nonzero`), the mask's indices inside the op (:func:`masked_select_everything`)."""
        n, nbytes = masked_select_everything(args[0], args[1])
        self.emulator.assume(every_element(self.emulator.modules.where(), "torch.masked_select"))
        out = self._new_gpu(types, args[0], torch.empty(n, dtype=args[0].dtype, device="meta"))
        self.transient_group([nbytes])
        return out

    def _bincount_by_minlength(self, types: Any, args: tuple, kwargs: dict) -> Any:
        """``torch.bincount(x, weights, minlength)`` of unknown values: its length is ``max(x) + 1`` or
        ``minlength``, whichever is larger; with a ``minlength`` (the number of classes, as a confusion matrix or a
        class count gives it) the values are taken below it. None without one (fake mode then refuses the op).
        The output's dtype: int64, or the weights' (float32 weights give float32, others float64: SummaryOps.cu)."""
        weights = args[1] if len(args) > 1 else kwargs.get("weights")
        minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
        if not minlength:
            return None
        self.emulator.assume(f"torch.bincount of unknown values ({self.emulator.modules.where()}) is {minlength} long "
                             "(its minlength): the values are taken below it")
        dtype = torch.long if weights is None else torch.float32 if weights.dtype == torch.float32 else torch.float64
        return self._new_gpu(types, args[0], torch.empty(minlength, dtype=dtype, device="meta"))

    def _new_gpu(self, types: Any, like: torch.Tensor, real: torch.Tensor, drawn: bool = False) -> Any:
        """A new GPU tensor, tracked, of ``real``'s shape and dtype, carrying ``real``'s values (a host tensor;
        none when it is on the meta device or larger than :data:`REAL_HOST_NUMEL`)."""
        p = self.placement
        p.internal += 1
        try:
            out = _TRACK(self, torch.ops.aten.new_empty.default, types, (like, list(real.shape)), {"dtype": real.dtype})
        finally:
            p.internal -= 1
        if real.device.type != "meta" and real.numel() <= REAL_HOST_NUMEL:
            self._carry(out, real, drawn)
        if self.on_alloc is not None:
            self.on_alloc()
        return out

    def _mask_indices(self, types: Any, indices: list) -> list:
        """Advanced indexing with a boolean mask (``x[mask]``, ``x[mask] = values``): as the GPU's ``index`` and
        ``index_put_`` do (aten/src/ATen/native/IndexingUtils.h ``expandTensors``), each mask becomes the columns
        of its ``nonzero()`` (:meth:`_nonzero`, allocated on the GPU), one long index per dimension it covers."""
        out: list = []
        for i in indices:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                nz = self._nonzero(types, i)
                real = self._host.get(nz)
                for j in range(i.dim()):
                    col = torch.ops.aten.select.int(nz, 1, j)
                    if real is not None:
                        with unset_fake_temporarily():
                            self._host[col] = real[:, j].clone()
                    out.append(col)
            else:
                out.append(i)
        return out

    def _host_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op whose outputs stay on the host. Small host tensors are real (:data:`REAL_HOST_NUMEL`): the
        program's own bookkeeping (a device mesh's rank map, index lists, a count read with ``.tolist()``)
        then has its values, as on the GPU machine; large ones (a model built on the CPU before ``.cuda()``,
        a dataset) stay fake and cost no memory. A value read from a fake host tensor is a placeholder
        (:meth:`CudaEmulator._scalar_read`)."""
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if any(is_fake(x) for x in leaves):
            if func in SCALAR_READS:
                return as_read_by(func, self.emulator.scalar_read(args[0]))
            return func(*args, **kwargs)
        if leaves:
            # an op writing into real tensors stays real whatever their sizes together (a real tensor cannot
            # turn fake in place: spectral_norm's registration runs ``weight.set_(weight)`` on a real weight)
            if sum(x.numel() for x in leaves) <= REAL_HOST_NUMEL or _mutable(func):
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)            # a factory: its size first, on fake tensors
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        if outs and sum(x.numel() for x in outs) <= REAL_HOST_NUMEL:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return out


_MUTABLE: dict[Any, bool] = {}    # op overload -> whether it writes into an argument (its schema)


def _mutable(func: Any) -> bool:
    """Whether the op overload writes into an argument (its schema), remembered."""
    mutable = _MUTABLE.get(func)
    if mutable is None:
        mutable = _MUTABLE[func] = bool(func._schema.is_mutable)
    return mutable


_UNKNOWN = object()


# StorageTracker's dispatch without the dynamo-disable wrapper TorchDispatchMode puts on every subclass's
# __torch_dispatch__ (torch/utils/_python_dispatch.py): it runs inside GpuTracker's, already wrapped
_TRACK = getattr(StorageTracker.__torch_dispatch__, "__wrapped__", StorageTracker.__torch_dispatch__)


@contextlib.contextmanager
def resized_storages(tracker: GpuTracker) -> Iterator[None]:
    """Report ``torch.UntypedStorage.resize_`` calls to ``tracker`` (see :meth:`GpuTracker.storage_resized`)."""
    original = torch.UntypedStorage.resize_

    def resize_(self: Any, size: int) -> Any:
        out = original(self, size)
        tracker.storage_resized(self, int(size))
        return out

    torch.UntypedStorage.resize_ = resize_                       # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original                  # type: ignore[method-assign]
