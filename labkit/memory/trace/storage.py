"""Storage-level allocation tracking with a ``TorchDispatchMode``.

Every ATen op's output storages are registered (size rounded as the target allocator would);
a weak reference per storage reports the free. The tracker keeps the running total, a per-phase
peak and an event log from which :func:`categorise` rebuilds the by-category breakdown at any
moment (parameters, gradients, optimizer state, activations, temporaries, inputs, workspace).

It works on real CUDA tensors, on CPU tensors and on fake tensors (``FakeTensorMode``); an
*emulator* (``labkit.memory.trace.fake.fake_cuda``) can add what a GPU kernel allocates that the CPU
kernel does not (attention logsumexp sizes, backward workspaces, cuBLAS workspaces).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from labkit.core.vocab import Category

# ``tensor.device`` of a tensor subclass whose device is its own (a FakeTensor: ``dispatch_device=True`` in
# torch/_subclasses/fake_tensor.py) reaches every dispatch mode as this op. It allocates nothing and reads no value,
# yet it was over half of what a fake step dispatched (autograd and the optimizer ask a tensor's device often):
# the trackers answer it at once (device_of).
DEVICE_QUERY = torch.ops.prim.device.default


def device_of(args: tuple, kwargs: dict | None) -> torch.device:
    """``prim.device``'s answer: a FakeTensor's own device, as ``FakeTensor.__torch_dispatch__`` gives it outside a
    kernel invocation (torch/_subclasses/fake_tensor.py, the ``prim.device.default`` case), else the op itself."""
    t = args[0] if len(args) == 1 and not kwargs else None
    if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
        return t.fake_device
    return DEVICE_QUERY(*args, **(kwargs or {}))


# The tracer's subset of the lab's memory categories (labkit.core.vocab): what it can tell apart
# from the storages it sees.
CATEGORIES: tuple[Category, ...] = ("parameters", "gradients", "optimizer_state", "activations", "temporaries",
                                    "inputs", "workspace")


def round_up(nbytes: int, rounding: int) -> int:
    """Bytes the caching allocator hands out for a request (0 stays 0: no block is allocated)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // rounding) * rounding


def storages_of(t: Any) -> list[torch.UntypedStorage]:
    if not isinstance(t, torch.Tensor):
        return []
    try:
        return [t.untyped_storage()]
    except (NotImplementedError, RuntimeError):  # sparse, nested or functional wrappers
        return []


@dataclass
class OpRecord:
    """One op in the op log (CUDA diagnostics): tracked bytes and the allocator's view."""

    index: int
    name: str
    phase: str
    tracked_bytes: int
    out_bytes: int
    cuda_allocated: int | None = None
    cuda_peak_in_op: int | None = None
    cuda_before: int | None = None
    shapes: str = ""


class StorageTracker(TorchDispatchMode):
    """Tracks live storages of ``device_type`` seen as op outputs; see the module docstring."""

    def __init__(self, *, device_type: str | None = None, rounding: int = 512,
                 emulator: Any = None, op_log: bool = False, cuda_op_stats: bool = False,
                 observers: tuple = ()) -> None:
        super().__init__()
        self.device_type = device_type
        self.rounding = rounding
        self.emulator = emulator
        self._ids: dict[int, tuple[weakref.ref, int]] = {}   # id(storage obj) -> (ref, storage id)
        self.sizes: dict[int, int] = {}
        self.alloc_index: dict[int, int] = {}   # storage id -> index of its allocation event
        self._ties: list[Any] = []
        self.live: set[int] = set()
        self.events: list[tuple[int, int, int]] = []  # (storage id, +/- bytes, phase index)
        self.phases: list[str] = []
        self.phase_peaks: list[int] = []
        self.phase_peak_event: list[int] = []
        self.phase_start_event: list[int] = []
        self.current = 0
        self._next_id = 0
        self.op_log_enabled = op_log
        self.observers = tuple(observers)  # callables (func, args, kwargs, out, phase) after every op
        self.cuda_op_stats = cuda_op_stats
        self.op_log: list[OpRecord] = []
        self.op_count = 0
        self.ended = False
        self.begin_phase("untracked")

    # -- phases ------------------------------------------------------------------------------
    def begin_phase(self, name: str) -> int:
        self.phases.append(name)
        self.phase_peaks.append(self.current)
        self.phase_peak_event.append(len(self.events))
        self.phase_start_event.append(len(self.events))
        return len(self.phases) - 1

    @property
    def phase_index(self) -> int:
        return len(self.phases) - 1

    # -- registration ------------------------------------------------------------------------
    def _bump(self) -> None:
        i = self.phase_index
        if self.current > self.phase_peaks[i]:
            self.phase_peaks[i] = self.current
            self.phase_peak_event[i] = len(self.events)

    def end_run(self) -> None:
        """The traced run ends here: storages that die later (the model and optimizer going out of scope after
        the last step) are not events of it, so an allocator replay of the last step never frees them."""
        self.ended = True

    def _freed(self, sid: int, key: int) -> None:
        self._ids.pop(key, None)
        if sid in self.live and not self.ended:
            self.live.discard(sid)
            n = self.sizes[sid]
            self.current -= n
            self.events.append((sid, -n, self.phase_index))

    def _track_storage(self, st: Any, nbytes: int | None = None) -> int:
        key = id(st)
        known = self._ids.get(key)
        if known is not None and known[0]() is st:
            return 0
        if self.device_type is not None and st.device.type != self.device_type:
            return 0
        sid = self._next_id
        self._next_id += 1
        try:
            raw = st.nbytes() if nbytes is None else nbytes
        except Exception:  # noqa: BLE001 - storages without a size
            return 0
        r = self.rounding
        n = -(-raw // r) * r if raw > 0 else 0
        try:
            ref = weakref.ref(st, lambda _r, sid=sid, key=key: self._freed(sid, key))
        except TypeError:
            return 0
        self._ids[key] = (ref, sid)
        self.sizes[sid] = n
        self.live.add(sid)
        self.current += n
        self.alloc_index[sid] = len(self.events)
        self.events.append((sid, n, len(self.phases) - 1))
        self._bump()
        return n

    def track(self, t: Any, *, nbytes: int | None = None) -> int:
        """Register the storages of ``t`` (a tensor or a pytree of them); returns the bytes added."""
        if isinstance(t, torch.Tensor):
            leaves = [t]
        elif isinstance(t, (tuple, list)) and all(isinstance(x, torch.Tensor) or x is None for x in t):
            leaves = t
        else:
            leaves = tree_leaves(t)
        added = 0
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                try:
                    st = leaf.untyped_storage()
                except (NotImplementedError, RuntimeError):  # sparse, nested or functional wrappers
                    continue
                added += self._track_storage(st, nbytes)
        return added

    def storage_id(self, t: torch.Tensor) -> int | None:
        for st in storages_of(t):
            known = self._ids.get(id(st))
            if known is not None and known[0]() is st:
                return known[1]
        return None

    def resize(self, t: torch.Tensor, nbytes: int) -> None:
        """Account the storage of ``t`` as ``nbytes`` (what the target kernel would allocate)."""
        sid = self.storage_id(t)
        if sid is None or sid not in self.live:
            return
        n = round_up(nbytes, self.rounding)
        delta = n - self.sizes[sid]
        if delta:
            # rewrite the allocation itself (the target allocates this size in the first place)
            i = self.alloc_index[sid]
            self.events[i] = (sid, n, self.events[i][2])
            self.sizes[sid] = n
            self.current += delta
            self._bump()

    def transient(self, nbytes: int) -> None:
        """An allocation that lives only inside the current op (a kernel's workspace)."""
        self.transient_group([nbytes])

    def transient_group(self, sizes: list[int]) -> None:
        """Several allocations live together inside the current op, then all freed."""
        sids = []
        for nbytes in sizes:
            n = round_up(nbytes, self.rounding)
            if n <= 0:
                continue
            sid = self._next_id
            self._next_id += 1
            self.sizes[sid] = n
            self.current += n
            self.events.append((sid, n, self.phase_index))
            self._bump()
            sids.append(sid)
        for sid in sids:
            n = self.sizes[sid]
            self.current -= n
            self.events.append((sid, -n, self.phase_index))

    def tie(self, t: torch.Tensor, nbytes: int) -> None:
        """An extra allocation that lives exactly as long as the storage of ``t`` (e.g. a kernel's
        small side outputs saved together with its main output)."""
        sts = storages_of(t)
        if not sts:
            return
        n = round_up(nbytes, self.rounding)
        sid = self._next_id
        self._next_id += 1
        self.sizes[sid] = n
        self.live.add(sid)
        self.current += n
        self.alloc_index[sid] = len(self.events)
        self.events.append((sid, n, self.phase_index))
        self._bump()
        self._ties.append(weakref.finalize(sts[0], self._freed, sid, -sid - 1))

    def hold(self, nbytes: int) -> int:
        """A lasting allocation that is not a tensor storage (e.g. a cuBLAS workspace)."""
        sid = self._next_id
        self._next_id += 1
        n = round_up(nbytes, self.rounding)
        self.sizes[sid] = n
        self.live.add(sid)
        self.current += n
        self.events.append((sid, n, self.phase_index))
        self._bump()
        return sid

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is DEVICE_QUERY:
            return device_of(args, kwargs)
        if self.emulator is None and not self.op_log_enabled and not self.observers:
            # fast path (the overhead on a real GPU step): views share their input's storage
            out = func(*args, **(kwargs or {}))
            self.op_count += 1
            if not getattr(func, "is_view", False):
                self.track(out)
            return out
        kwargs = kwargs or {}
        stats = self.cuda_op_stats
        cuda_before = None
        if stats:
            torch.cuda.reset_peak_memory_stats()
            cuda_before = torch.cuda.memory_allocated()
        out: Any = NotImplemented
        if self.emulator is not None:
            args, kwargs = self.emulator.before(func, args, kwargs, self)
            out = self.emulator.replace(func, args, kwargs, self)
        if out is NotImplemented:
            out = func(*args, **kwargs)
        before = self.current
        self.track(out)
        if self.emulator is not None:
            self.emulator.after(func, args, kwargs, out, self)
        self.op_count += 1
        for observe in self.observers:
            observe(func, args, kwargs, out, self.phases[-1])
        if self.op_log_enabled:
            rec = OpRecord(self.op_count, str(func), self.phases[-1], self.current, self.current - before,
                           shapes=_shapes(args, out))
            if stats:
                st = torch.cuda.memory_stats()
                rec.cuda_allocated = int(st.get("allocated_bytes.all.current", 0))
                rec.cuda_peak_in_op = int(st.get("allocated_bytes.all.peak", 0))
                rec.cuda_before = cuda_before
            self.op_log.append(rec)
        return out


def _shapes(args: Any, out: Any) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        return ""

    ins = ",".join(s for s in (fmt(a) for a in tree_leaves(args)) if s)
    outs = ",".join(s for s in (fmt(a) for a in tree_leaves(out)) if s)
    return f"{ins} -> {outs}"


@dataclass
class Roles:
    """Storage ids by role, collected at phase boundaries."""

    parameters: set[int] = field(default_factory=set)
    gradients: set[int] = field(default_factory=set)
    optimizer_state: set[int] = field(default_factory=set)
    inputs: set[int] = field(default_factory=set)
    workspace: set[int] = field(default_factory=set)

    def add(self, tracker: StorageTracker, role: str, tensors: Iterable[Any]) -> None:
        target = getattr(self, role)
        for t in tensors:
            for leaf in tree_leaves(t):
                if isinstance(leaf, torch.Tensor):
                    sid = tracker.storage_id(leaf)
                    if sid is not None:
                        target.add(sid)


def categorise(tracker: StorageTracker, roles: Roles, upto_event: int,
               activation_phases: tuple[int, ...]) -> dict[str, int]:
    """Bytes per category live just after event ``upto_event`` (exclusive end index).

    Storages allocated during ``activation_phases`` (forward and loss of a step) that are not
    parameters, gradients or optimizer state count as activations; others as temporaries.
    """
    live: dict[int, int] = {}
    born: dict[int, int] = {}
    for sid, delta, ph in tracker.events[:upto_event]:
        if sid not in born:
            born[sid] = ph
        live[sid] = live.get(sid, 0) + delta
    out = {c: 0 for c in CATEGORIES}
    acts = set(activation_phases)
    for sid, n in live.items():
        if n <= 0:
            continue
        if sid in roles.parameters:
            c = "parameters"
        elif sid in roles.gradients:
            c = "gradients"
        elif sid in roles.optimizer_state:
            c = "optimizer_state"
        elif sid in roles.inputs:
            c = "inputs"
        elif sid in roles.workspace:
            c = "workspace"
        elif born[sid] in acts:
            c = "activations"
        else:
            c = "temporaries"
        out[c] += n
    return out


class Stopwatch:
    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync

    def now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()
