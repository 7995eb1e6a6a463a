"""``fake_gpu()``: run any code as it would run on the target GPU, and measure what it allocates.

    with labkit.memory.fake_gpu() as gpu:          # in a notebook cell, or around your own code
        model = MyModel().cuda()
        ...train...
    print(gpu.report())

Inside, every tensor is a CPU fake tensor (no memory is used), ``torch.cuda`` answers as the target
(:mod:`.cuda_api`), GPU placement follows :mod:`.tensor_placement`, and what the GPU would allocate is what
``measure_step``'s fake mode allocates: the same tracker, kernel rules (:class:`CudaEmulator`: SDPA kernels,
cuBLAS and cuDNN workspaces, reductions, embedding backward, dropout masks) and caching-allocator
simulator, fed as the program runs (:mod:`.live_allocator`). CUDA autocast follows the program's own
``torch.autocast("cuda")`` regions (the emulated casts apply while ``torch.is_autocast_enabled("cuda")``).

Phases: ``setup`` until the first forward, ``forward`` (a top-level module called with gradients on),
``eval`` (called without), ``loss`` (between a forward and the next backward), ``backward``
(``torch.autograd.backward``/``grad``), ``optimizer`` (``Optimizer.step``), ``other``. Each
``Optimizer.step`` ends an optimizer step (:class:`labkit.memory.script.live_allocator.StepMark`); ``max_steps`` stops
the program after that many.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.util
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.function import BackwardCFunction
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

from labkit.core.errors import LabkitError
from labkit.memory.script.cuda_api import GpuFacts, cuda_answers
from labkit.memory.script.frameworks import framework_adapters
from labkit.memory.script.live_allocator import LiveAllocator
from labkit.memory.script.script_report import build_report
from labkit.memory.script.tensor_placement import DeviceMode, local_tensor, reported_devices
from labkit.memory.script.tracker import GpuTracker, Sites, resized_storages
from labkit.memory.trace.fake.fake_cuda import (CudaAutocast, CudaEmulator, CudaTarget, _AutocastState,
                                           data_dependent_choices)
from labkit.memory.trace.fake.addresses import FakeAddresses, fake_data_pointers
from labkit.memory.trace.fake.fake_runtime import (CudaFunctionRules, checkpoint_autocast, fake_deepcopy,
                                                   fake_module_conversion, no_hub_kernels, recorded_init)
from labkit.memory.trace.storage import Roles

# transformers (3-4 s of CPU to import its masking_utils here) is imported where a script uses it.


#: What fake mode assumes of a script's batches where transformers asks whether the attention mask masks
#: anything and the mask's values are unknown (made on the GPU from unknown values, or too large to be real on
#: the host): nothing (a training batch of equal-length or packed-by-row sequences); a padded batch keeps an
#: explicit mask on the GPU. A mask copied from the host, or made on the GPU from known values or integers drawn
#: there, is read from its values (GpuTracker.host_values). Said in the report's notes.
_UNPADDED = {"attention_mask": torch.ones(1)}


class _ThenCall(importlib.abc.Loader):
    """A module's own loader, then ``callback(module)`` once its code has run."""

    def __init__(self, loader: Any, callback: Any) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str) -> Any:      # get_source, get_resource_reader, ... are the loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` as the other finders do and has ``callback`` run right after its import."""

    def __init__(self, name: str, callback: Any) -> None:
        self.name, self.callback, self.busy = name, callback, False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.callback)
        return spec


@contextlib.contextmanager
def _after_import(name: str, callback: Any) -> Iterator[None]:
    """``callback(module)`` now if module ``name`` is imported, else as soon as the program imports it."""
    if name in sys.modules:
        callback(sys.modules[name])
        yield
        return
    finder = _AfterImport(name, callback)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class StopScript(BaseException):
    """Raised after the last optimizer step asked for (``max_steps``): ends the program there. A
    ``BaseException``, so that a training framework's ``except Exception`` does not swallow it."""


class ScriptAutocast(CudaAutocast):
    """CUDA autocast's rules, applied while the program's own ``torch.autocast("cuda")`` region is on.

    ``torch.autocast("cuda", ...)`` keeps its state in a CPU-only build too (``torch.is_autocast_enabled
    ("cuda")``, ``torch.get_autocast_dtype("cuda")``); it only never meets a CUDA tensor. This mode reads that
    state for every call, so nested regions, ``enabled=False`` inside (a rotary embedding kept in float32) and
    ``torch.utils.checkpoint``'s recomputation under the forward's recorded state all cast as on the GPU. The
    weight cache follows ``torch.is_autocast_cache_enabled()`` and is cleared when the outermost region exits
    (``torch.clear_autocast_cache``)."""

    def __init__(self, state: _AutocastState) -> None:
        super().__init__(torch.bfloat16, state)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not torch.is_autocast_enabled("cuda"):
            return func(*args, **(kwargs or {}))
        self.dtype = torch.get_autocast_dtype("cuda")
        return super().__torch_function__(func, types, args, kwargs)


class ScriptEmulator(CudaEmulator):
    """The kernel rules of :class:`CudaEmulator`, with autocast taken from the program (see above)."""

    autocast_class = ScriptAutocast

    def __init__(self, target: CudaTarget, recompute_modes: Any) -> None:
        super().__init__(target, None)
        self._recompute_modes = recompute_modes

    def scalar_read(self, x: torch.Tensor) -> Any:
        """A value read from a fake tensor (``.item()``, ``.tolist()``, ``if t:``): as ``measure_step`` answers
        it, but an integer read is answered 0 too (an accuracy count in an evaluation loop), with the line."""
        out = self._scalar_read(x)
        return 0 if out is NotImplemented else out

    def _scalar_read(self, x: torch.Tensor) -> Any:
        if not x.is_floating_point() and x.dtype != torch.bool and getattr(x, "constant", None) is None \
                and self.routing.scalar(x) is None:
            self.assume(f"an integer .item() ({self.modules.where()}) read as 0: the fake GPU has no values; if it "
                        "decides a size, the figures are for that size")
            return 0
        return super()._scalar_read(x)

    def autocast_factory(self, dtype: torch.dtype) -> Any:
        state, modes = self.autocast_state, self._recompute_modes

        @contextlib.contextmanager
        def region() -> Iterator[None]:
            with contextlib.ExitStack() as stack:
                for m in modes():
                    stack.enter_context(m)
                stack.enter_context(ScriptAutocast(state))
                yield

        return region


def _wraps_optimizer(opt: Any) -> bool:
    """A wrapper around another optimizer (accelerate's ``AcceleratedOptimizer``, Lightning's, ZeRO's
    ``ZeroRedundancyOptimizer``): its step is counted where the optimizer it wraps steps (and not when it skips
    it: an accumulation step, a ``GradScaler`` overflow)."""
    return any(isinstance(getattr(opt, a, None), torch.optim.Optimizer) for a in ("optimizer", "optim"))


@contextlib.contextmanager
def custom_backward_modes(modes: Callable[[], list[TorchFunctionMode]]) -> Iterator[None]:
    """A custom ``autograd.Function``'s backward run under the program's function modes again (``modes()``: the GPU
    rules, :class:`ScriptAutocast`, the device placement; each one not already active). Torch function modes are not
    active while autograd runs a backward, so the autocast region ``torch.amp.custom_bwd`` opens there (the forward's
    autocast state, torch/amp/autocast_mode.py ``custom_bwd``) would compute in float32 where the GPU casts to bf16:
    a script's custom Function predicted 4.1% high (users' ``custom_function_mlp``). Autograd calls
    ``BackwardCFunction.apply`` for every custom Function's backward (torch/autograd/function.py)."""
    original = BackwardCFunction.apply

    def apply(self: Any, *args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for mode in modes():
                if not any(type(m) is type(mode) for m in _get_current_function_mode_stack()):
                    stack.enter_context(mode)
            return original(self, *args)

    BackwardCFunction.apply = apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        BackwardCFunction.apply = original  # type: ignore[method-assign]


class DeviceThread:
    """The CUDA autograd engine's device thread, for the backward passes that build a graph (``create_graph=True``:
    a gradient penalty's ``torch.autograd.grad``, a double backward).

    On a GPU every backward runs on the engine's thread for that device, and the nodes a ``create_graph`` backward
    creates take their sequence numbers from that thread's counter (``at::sequence_number`` is thread-local:
    aten/src/ATen/SequenceNumber.cpp), which counts only the nodes made there, so they number below every forward
    node of the program. The engine takes ready nodes by sequence number, highest first (torch/csrc/autograd/engine.h
    ``CompareNodeTaskTime``), so a later backward through them reaches them last. On the fake GPU the engine runs
    on the calling thread, and the same nodes would number above every forward node and be reached first: WGAN-GP's
    loss kept the real batch's critic graph alive through the penalty's double backward, 14.9% above the H200's
    peak (users2 ``wgan_gp``). Such a backward runs here on one thread of its own, kept for the run as the GPU's is,
    under the program's dispatch and function modes and grad mode; one inside a ``torch.func`` transform (whose
    state is the calling thread's) or already on that thread runs where it is called."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None

    def wanted(self) -> bool:
        return threading.get_ident() != self._ident and torch._C._functorch.peek_interpreter_stack() is None

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="labkit-cuda-autograd")
        dispatch_modes, function_modes = _get_current_dispatch_mode_stack(), _get_current_function_mode_stack()
        grad = torch.is_grad_enabled()

        def work() -> Any:
            self._ident = threading.get_ident()
            for mode in function_modes:
                torch._C._push_on_torch_function_stack(mode)
            for mode in dispatch_modes:
                _push_mode(mode)
            try:
                with torch.set_grad_enabled(grad):
                    return fn(*args, **kwargs)
            finally:
                for _ in dispatch_modes:
                    _pop_mode()
                for _ in function_modes:
                    torch._C._pop_torch_function_stack()

        return self._pool.submit(work).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


@contextlib.contextmanager
def _autocast_cache(state: _AutocastState) -> Iterator[None]:
    original = torch.clear_autocast_cache

    def clear() -> None:
        state.cache.clear()
        original()

    torch.clear_autocast_cache = clear                        # type: ignore[assignment]
    try:
        yield
    finally:
        torch.clear_autocast_cache = original                 # type: ignore[assignment]


@contextlib.contextmanager
def _quiet_fake_tensor_warnings() -> Iterator[None]:
    """PyTorch's C++ code that reads a fake storage's data pointer (Python reads answer from
    :mod:`labkit.memory.trace.fake.addresses`) warns that the pointer of a fake tensor was read: a warning about
    the fake tensor, not about the program, not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        yield


@dataclass
class FakeGPU:
    """One faked run (see the module docstring). Use :func:`fake_gpu`."""

    target: CudaTarget = field(default_factory=lambda: CudaTarget(warm_process=False))
    facts: GpuFacts = field(default_factory=GpuFacts)
    max_steps: int | None = None
    user_roots: tuple[str, ...] = ()
    what: str = "code run under labkit.memory.fake_gpu()"
    notes: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float | None = None
    stopped_after: int | None = None
    phase: str = "setup"
    local_rank: int = 0
    communicators: int | None = None     # process groups of more than one rank (set by ranks.fake_launch)
    # DDP bucket rebuilds (set by ranks.fake_launch): (the tracker's event index after it, bytes of the old buckets
    # NCCL may still stash from there on)
    ddp_rebuilds: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.emulator = ScriptEmulator(self.target, self._recompute_modes)
        self.tracker = GpuTracker(emulator=self.emulator, sites=Sites(self.user_roots),
                                  rounding=self.target.allocator_rounding)
        self.placement = self.tracker.placement
        self.live = LiveAllocator(self.tracker, device_bytes=self.facts.usable_bytes)
        self.tracker.on_alloc = self.live.sync
        self.roles = Roles()
        self.emulator.attach(None, self.tracker, self.roles)
        # data pointers: a GPU storage's simulated block address, a host one's from a counter (addresses.py)
        self.addresses = FakeAddresses(lambda st: self.live.address(self.tracker.sid_of_storage(st)))
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self._stack: contextlib.ExitStack | None = None
        self._depth = 0                      # top-level module calls running
        self._after_forward = False
        self.tracker.phases[0] = "setup"

    # -- notes and phases -----------------------------------------------------------------------
    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _set_phase(self, name: str) -> None:
        if name != self.phase:
            self.live.sync()
            self.phase = name
            self.tracker.begin_phase(name)

    def _role(self, role: str, tensors: list[Any]) -> None:
        self.roles.add(self.tracker, role, [local_tensor(t) for t in tensors if t is not None])

    def _recompute_modes(self) -> list[Any]:
        return [DeviceMode(self.placement)]

    @contextlib.contextmanager
    def _phase_hooks(self) -> Iterator[None]:
        def pre(mod: nn.Module, args: Any) -> None:
            if self.phase == "backward":
                return
            self._depth += 1
            if self._depth == 1:
                self._role("parameters", list(mod.parameters()) + list(mod.buffers()))
                self._set_phase("forward" if torch.is_grad_enabled() else "eval")

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            if self.phase == "backward" or self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._set_phase("loss" if self.phase == "forward" else "other")

        def opt_pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if _wraps_optimizer(opt):
                return
            params = [p for g in opt.param_groups for p in g["params"]]
            self._role("parameters", params)
            self._role("gradients", [p.grad for p in params if p.grad is not None])
            self._set_phase("optimizer")

        def opt_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if _wraps_optimizer(opt):
                return
            self._role("optimizer_state", [v for st in opt.state.values() for v in st.values()
                                           if isinstance(v, torch.Tensor)])
            self._set_phase("other")
            self.live.mark_step()
            if self.max_steps is not None and len(self.live.steps) >= self.max_steps:
                self.stopped_after = len(self.live.steps)
                raise StopScript()

        original_backward, original_grad = torch.autograd.backward, torch.autograd.grad
        device_thread = DeviceThread()

        def in_backward(fn: Any, create_graph_at: int) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                prev = self.phase
                self._depth = 0
                self._set_phase("backward")
                try:
                    create_graph = k.get("create_graph", a[create_graph_at] if len(a) > create_graph_at else False)
                    if create_graph and device_thread.wanted():
                        return device_thread.run(fn, a, k)
                    return fn(*a, **k)
                finally:
                    self._set_phase("other" if prev in ("loss", "forward") else prev)
            return run

        hooks = [register_module_forward_pre_hook(pre), register_module_forward_hook(post),
                 register_optimizer_step_pre_hook(opt_pre), register_optimizer_step_post_hook(opt_post)]
        # create_graph's place among the positional arguments: torch.autograd.backward(tensors, grad_tensors,
        # retain_graph, create_graph, ...), torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph,
        # create_graph, ...) (Tensor.backward passes it by position)
        torch.autograd.backward = in_backward(original_backward, 3)       # type: ignore[assignment]
        torch.autograd.grad = in_backward(original_grad, 4)               # type: ignore[assignment]
        try:
            yield
        finally:
            device_thread.close()
            for h in hooks:
                h.remove()
            torch.autograd.backward = original_backward                   # type: ignore[assignment]
            torch.autograd.grad = original_grad                           # type: ignore[assignment]

    # -- entering and leaving ----------------------------------------------------------------------
    def __enter__(self) -> "FakeGPU":
        if self._stack is not None:
            raise LabkitError("this fake GPU is already running; make a new one with labkit.memory.fake_gpu()")
        self.started = time.perf_counter()
        st = self._stack = contextlib.ExitStack()
        try:
            st.enter_context(_quiet_fake_tensor_warnings())
            # transformers' mask checks, answered as measure_step answers them for a batch without padding,
            # unless the mask's values were read on the host: once the program imports transformers'
            # masking_utils (right after its code runs, before a model can call it), or now if it did. A
            # script that never imports transformers does not pay for its import (3-4 s of CPU).
            self._hf_choices: list[str] = []

            def answer_masks(_module: Any) -> None:
                self._hf_choices = st.enter_context(data_dependent_choices(_UNPADDED,
                                                                           host_values=self.tracker.host_values))

            st.enter_context(_after_import("transformers.masking_utils", answer_masks))
            st.enter_context(self.fake)
            st.enter_context(self.emulator.modules.active())
            st.enter_context(fake_module_conversion())
            st.enter_context(fake_deepcopy())
            st.enter_context(fake_data_pointers(self.addresses))
            st.enter_context(checkpoint_autocast(self.emulator))
            st.enter_context(recorded_init(self.emulator.target.torch_version))
            st.enter_context(no_hub_kernels())
            st.enter_context(custom_backward_modes(lambda: (
                [CudaFunctionRules(self.emulator)] if self.target.emulate_kernels else [])
                + [ScriptAutocast(self.emulator.autocast_state), DeviceMode(self.placement)]))
            st.enter_context(_autocast_cache(self.emulator.autocast_state))
            st.enter_context(cuda_answers(self.facts, self.live, self.note, self.local_rank))
            st.enter_context(framework_adapters(self))
            st.enter_context(reported_devices(self.placement, self.local_rank))
            st.enter_context(resized_storages(self.tracker))
            st.enter_context(self._phase_hooks())
            if self.target.emulate_kernels:
                st.enter_context(CudaFunctionRules(self.emulator))
            st.enter_context(ScriptAutocast(self.emulator.autocast_state))
            st.enter_context(DeviceMode(self.placement))
            st.enter_context(self.tracker)
        except BaseException:
            st.close()
            self._stack = None
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        assert self._stack is not None
        try:
            self._stack.close()
        finally:
            self._stack = None
            self.ended = time.perf_counter()
        try:
            self.live.sync()
        except torch.OutOfMemoryError:
            pass
        return exc_type is StopScript

    def report(self, *, what: str | None = None, outcome: str | None = None) -> Any:
        return build_report(self, what=what or self.what, outcome=outcome)


def fake_gpu(*, max_steps: int | None = None, target: CudaTarget | None = None, facts: GpuFacts | None = None,
             user_roots: tuple[str, ...] = (), launch: Any = None, rank: int = 0) -> FakeGPU:
    """A context manager that runs the code inside it on a fake GPU (see the module docstring); its
    ``report()`` is a :class:`labkit.memory.script.script_report.ScriptReport`. ``max_steps``: stop after that many
    ``Optimizer.step`` calls. ``target``: the GPU's kernel choices (default: an H200 in a fresh process)."""
    if max_steps is not None and max_steps < 1:
        raise LabkitError(f"max_steps must be >= 1, got {max_steps}")
    facts = facts or GpuFacts()
    local_rank = 0
    if launch is not None:
        facts = dataclasses.replace(facts, device_count=launch.nproc_per_node)
        local_rank = rank % launch.nproc_per_node
    return FakeGPU(target=target or CudaTarget(warm_process=False), facts=facts, max_steps=max_steps,
                   user_roots=tuple(user_roots), local_rank=local_rank)


__all__ = ["FakeGPU", "ScriptAutocast", "StopScript", "fake_gpu"]
