"""``measure_step``: run training steps under the storage tracker and report, per phase and
category, current and peak bytes, on a real GPU (``cuda``), on the CPU (``cpu``), or in fake mode
(``fake-cuda``: fake tensors, no memory used, predicting what a CUDA GPU would allocate).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from labkit.core.errors import LabkitError
from labkit.memory.trace.backends import make_backend
from labkit.memory.trace.storage import CATEGORIES, Roles, StorageTracker, Stopwatch, categorise

DEVICES = ("fake-cuda", "cuda", "cpu")


class FakeModeUnsupported(LabkitError):
    """Fake mode could not run the step: one line naming the op, the module and the phase, the
    cause's first line, and what to use instead. ``op``, ``module``, ``phase`` and ``cause`` hold them."""

    def __init__(self, op: str | None, module: str | None, phase: str, cause: BaseException) -> None:
        self.op, self.module, self.phase = op, module, phase
        first = (str(cause).strip().splitlines() or [""])[0]
        self.cause = f"{type(cause).__name__}: {first[:240]}"
        what = f"op {op}" if op else "this step"
        where = f" in module {module}" if module else ""
        super().__init__(f"fake mode cannot run {what}{where} during {phase} ({self.cause}); run the step on a "
                         "device instead (--device cpu, or cuda on a GPU) or size it with the analytical "
                         "estimator (labkit estimate)")


def _module_names(model: Any) -> dict[int, str]:
    if not isinstance(model, nn.Module):
        return {}
    return {id(m): (f"{name} ({type(m).__name__})" if name else type(m).__name__) for name, m in model.named_modules()}


@contextlib.contextmanager
def _refusals(device: str, tracker: StorageTracker, built: list[nn.Module], model: Any) -> Iterator[None]:
    """In fake mode, turn a failure inside the step into :class:`FakeModeUnsupported` (a
    :class:`LabkitError` stays as it is; on a real device nothing is caught)."""
    import logging

    quiet = logging.getLogger("torch._subclasses.fake_tensor")   # logs a traceback before raising
    level = quiet.level
    if device == "fake-cuda":
        quiet.setLevel(logging.CRITICAL)
    try:
        yield
    except LabkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - fake mode's limits become one clear refusal
        if device != "fake-cuda":
            raise
        op, module = _locate(exc, _module_names(built[-1] if built else model))
        raise FakeModeUnsupported(op, module, tracker.phases[-1], exc) from exc
    finally:
        quiet.setLevel(level)


def _locate(exc: BaseException, names: dict[int, str]) -> tuple[str | None, str | None]:
    """The failing ATen op and the innermost module running when ``exc`` was raised: the op from
    the exception (``.func`` of fake-tensor errors) or the innermost ``__torch_dispatch__`` frame;
    the module from the innermost frame of a module's ``forward`` (or ``_apply``), else of any
    module method (its construction), else a module a ``torch.utils.checkpoint`` frame recomputes."""
    import traceback

    func = getattr(exc, "func", None)
    module = fallback = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        loc = frame.f_locals
        self = loc.get("self")
        if isinstance(self, nn.Module):
            name = names.get(id(self), type(self).__name__)
            if frame.f_code.co_name in ("forward", "_apply", "_call_impl"):
                module = name
            else:
                fallback = name
        elif frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            found = _recomputed_module(list(loc.values()), names)
            fallback = found or fallback
        if frame.f_code.co_name == "__torch_dispatch__" and not hasattr(exc, "func"):
            func = loc.get("func", func)
    return (str(func) if func is not None else None), module or fallback


def _recomputed_module(objs: list[Any], names: dict[int, str], depth: int = 4) -> str | None:
    """The module behind a checkpointed function: through bound methods, partials, closures and
    torch.utils.checkpoint's own frame objects, a few levels deep."""
    import functools

    for obj in objs:
        if isinstance(obj, nn.Module):
            return names.get(id(obj), type(obj).__name__)
        if depth == 0:
            continue
        inner: list[Any] = []
        if hasattr(obj, "__self__") and callable(obj):
            inner.append(obj.__self__)
        if isinstance(obj, functools.partial):
            inner += [obj.func, *obj.args]
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                inner.append(cell.cell_contents)
        if type(obj).__module__ == "torch.utils.checkpoint" and hasattr(obj, "__dict__"):
            inner += list(vars(obj).values())
        found = _recomputed_module(inner, names, depth - 1) if inner else None
        if found:
            return found
    return None


@dataclass
class PhaseStats:
    """One phase of one step.

    ``peak_bytes`` is the allocator's view of the phase's peak: ``torch.cuda.max_memory_allocated``
    on a GPU, the allocator simulator's replay of the fake run in fake mode (both count whole
    allocator blocks and non-tensor allocations such as cuBLAS workspaces), the storages on the
    CPU. ``start/end/storage_peak_bytes`` and ``peak_by_category`` count live tensor storages
    (rounded to 512 B on CUDA targets), by category at the storage peak.
    """

    step: int
    phase: str
    start_bytes: int
    end_bytes: int
    peak_bytes: int
    storage_peak_bytes: int
    peak_by_category: dict[str, int]
    time_s: float | None = None
    cuda_peak_allocated: int | None = None   # torch.cuda.max_memory_allocated within the phase
    cuda_end_allocated: int | None = None


@dataclass
class MeasureReport:
    """What ``measure_step`` found.

    ``peak_bytes``: the highest total allocated (everything live, as the allocator counts it) during
    the last, steady-state step; ``storage_peak_bytes``: the same for tensor storages only;
    ``reserved_bytes``: what the caching allocator holds from the device at the end (measured on a
    GPU, simulated in fake mode, None on the CPU); in fake mode after step 4, the steady last step
    replayed as often as needed (:mod:`labkit.memory.trace.reserved`: what a plain loop's steps 2-4 read).
    """

    device: str
    policy: dict[str, Any]
    steps: int
    peak_bytes: int
    peak_phase: str
    by_phase: list[PhaseStats]            # the last (steady-state) step
    by_category: dict[str, int]           # tensor storages at the steady-state storage peak
    init_bytes: int                       # after the model and batch are on the device
    storage_peak_bytes: int = 0
    reserved_bytes: int | None = None
    all_phases: list[PhaseStats] = field(default_factory=list)
    cuda: dict[str, Any] | None = None     # allocator cross-check on a real GPU
    emulation: dict[str, Any] | None = None
    num_params: int = 0
    step_time_s: float | None = None
    notes: list[str] = field(default_factory=list)
    reserved_by_conf: dict[str, dict[str, int]] = field(default_factory=dict)
    reserved_range: tuple[int, int] | None = None   # fake mode, reserved_placements: lowest and highest

    @property
    def phase_peaks(self) -> dict[str, int]:
        return {p.phase: p.peak_bytes for p in self.by_phase}


def _tensors(obj: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def measure_step(model: nn.Module | Callable[[], nn.Module], batch: Any, *,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 optimizer: Any = "adamw", precision: str = "fp32", recompute: Any = "none",
                 device: str = "fake-cuda", steps: int = 2,
                 call: Callable[[nn.Module, Any], Any] | None = None,
                 target: Any = None, op_log: bool = False, timing: bool = False,
                 rounding: int | None = None, alloc_confs: tuple[str, ...] = (),
                 observers: tuple = (), checkpointing: str | None = None,
                 loop: str = "plain", moe_routing: Any = None, allocator_state: Any = None,
                 reserved_placements: int = 0) -> MeasureReport:
    """Run ``steps`` training steps and report per-phase, per-category memory.

    ``model``: an ``nn.Module`` or a zero-argument callable returning one (built on the meta device
    and materialised as fake tensors in fake mode, so no real memory is used). ``batch``: a tensor
    or dict of tensors on the CPU, moved to the target device (faked in fake mode). ``loss_fn(output,
    batch)`` defaults to ``output.loss``. ``target`` (fake mode): a
    :class:`labkit.memory.trace.fake_cuda.CudaTarget` describing the GPU's choices (default: H200,
    torch 2.11). ``op_log`` keeps one record per op (on CUDA with the allocator's view: slow).
    ``rounding``: bytes each storage is rounded up to (default 512 for cuda and fake-cuda, 1 for cpu).
    ``precision``, ``recompute`` (a :class:`~labkit.core.vocab.Recompute` or ``none|selective|full|every-K``)
    and ``optimizer`` (a name, implementation ``foreach``, or an :class:`~labkit.core.vocab.OptimizerSpec`)
    speak :mod:`labkit.core.vocab`; ``checkpointing`` is the deprecated name of ``recompute``.
    ``alloc_confs`` (fake mode): also replay the run's allocation stream under each of these
    ``PYTORCH_ALLOC_CONF`` values; the report's ``reserved_by_conf`` holds what each predicts.
    ``observers``: callables ``(func, args, kwargs, out, phase)`` the tracker calls after every op
    (e.g. :class:`labkit.advise.roofline.Roofline`, which prices each op on the target GPU).
    ``loop``: ``plain`` (default; ``loss = model(**batch).loss``: the output object, logits included,
    is freed before backward) or ``keep-output`` (the output stays alive through backward and the
    optimizer step), the two loops users write (:data:`labkit.workloads.harness.LOOPS`).
    ``moe_routing`` (fake mode): how a mixture-of-experts model's tokens are assumed to be routed where
    its shapes depend on it (an eager per-expert loop): ``balanced`` (the default) or each expert's share
    of the tokens x top-k rows (``"0.4,0.3,0.2,0.1"``, a sequence, or a
    :class:`~labkit.core.vocab.MoeRouting`); the report's ``emulation["moe_routing"]`` and assumptions say
    which was assumed and which modules used it (see :mod:`labkit.memory.trace.moe`). On ``cpu`` and
    ``cuda`` the batch's real routing decides, so it is refused there.
    ``allocator_state`` (fake mode): the segments the process already holds when the step starts (a list
    as ``torch.cuda.memory_snapshot()`` returns it); the reserved figure is replayed from there
    (:mod:`labkit.allocator.state`), and a warm process's cuBLAS workspaces are taken to be in it. Reserved
    memory is path-dependent: without it the replay starts from an empty cache plus the workspaces.
    ``reserved_placements`` (fake mode): also replay under that many other orders of the segments' addresses
    (:class:`labkit.allocator.ShuffledVA`); the report's ``reserved_range`` is the lowest and
    highest reserved figure, the point one among them. Best fit breaks ties between equal-size free blocks by
    address, and where the driver puts a segment depends on what the process did before, so the same loop
    can reserve one of several figures (on the H200 a Llama checkpointing step: 21.58 or 23.63 GB).

    In fake mode, a step that fake tensors cannot run (an op without a fake kernel, a data-dependent
    value, a kernel-specific check) raises :class:`FakeModeUnsupported`: one line naming the op, the
    module and the phase, and what to use instead.

    Ground truth is a plain loop without labkit (``benchmarks/gpu/record_plain.py``,
    ``data/measurements/measure/plain__*.json``), and that is what fake mode predicts. Attaching the
    tracer (``device="cuda"``) does not change the peak: on the H200 (torch 2.11, transformers 5.17)
    HF GPT-2 large, batch 4 x 1024, amp-bf16, fused AdamW peaks at 29.39 GB in a plain loop, 29.31 GB
    under ``measure_step(device="cuda")``, 29.38 GB under a do-nothing ``TorchDispatchMode``, with
    foreach AdamW or in labkit's untraced ``TrainStep``. What does change it is the loop: keeping the
    output object through backward adds its bf16 logits (+0.40 GB, 29.80 GB), hence ``loop=``.
    """
    from labkit.workloads import StepPolicy

    policy = StepPolicy(precision=precision, optimizer=optimizer, recompute=recompute, checkpointing=checkpointing)
    moe_routing = _check_options(device, loop, steps, moe_routing, allocator_state, reserved_placements)
    backend = make_backend(device, policy, target=target, moe_routing=moe_routing, allocator_state=allocator_state,
                           reserved_placements=reserved_placements, alloc_confs=alloc_confs)
    run = _run_steps(backend, model, batch, policy, steps=steps, loss_fn=loss_fn, call=call, loop=loop,
                     rounding=rounding, op_log=op_log, timing=timing, observers=observers)
    return _report(backend, run, policy, steps=steps, loop=loop, op_log=op_log)


def _check_options(device: str, loop: str, steps: int, moe_routing: Any, allocator_state: Any,
                   reserved_placements: int) -> Any:
    """Refuse what does not apply (one line each); returns the parsed MoE routing."""
    from labkit.workloads import LOOPS

    if loop not in LOOPS:
        raise LabkitError(f"loop {loop!r} is not one of {', '.join(LOOPS)}")
    if device not in DEVICES:
        raise LabkitError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if steps < 1:
        raise LabkitError(f"steps must be >= 1, got {steps}")
    if reserved_placements < 0:
        raise LabkitError(f"reserved_placements must be 0 or more, got {reserved_placements}")
    fake_only = {"moe_routing": (moe_routing is not None, "the batch's real routing decides"),
                 "allocator_state": (allocator_state is not None, "the real allocator's own state decides"),
                 "reserved_placements": (bool(reserved_placements), "the driver places the segments")}
    for name, (given, why) in fake_only.items():
        if given and device != "fake-cuda":
            raise LabkitError(f"{name} applies to device 'fake-cuda' (on {device!r} {why}); leave it out")
    if moe_routing is not None:
        from labkit.core.vocab import MoeRouting

        moe_routing = MoeRouting.parse(moe_routing, what="moe_routing")
    return moe_routing


@dataclass
class _Run:
    tracker: StorageTracker
    roles: Roles
    phases: list[PhaseStats]
    index: dict[int, int]              # id(PhaseStats) -> tracker phase index
    init_bytes: int
    num_params: int
    step_times: list[float]
    finished: Any = None


def _run_steps(backend: Any, model: Any, batch: Any, policy: Any, *, steps: int, loss_fn: Any, call: Any,
               loop: str, rounding: int | None, op_log: bool, timing: bool, observers: tuple) -> _Run:
    """The loop: build the model and batch on the back-end's device, then ``steps`` training steps, each phase
    measured by the tracker (and, on a GPU, the allocator's own peak)."""
    from labkit.workloads import TrainStep, move_batch

    tracker = backend.tracker(rounding, op_log, observers)
    watch = Stopwatch(torch.cuda.synchronize if (backend.device == "cuda" and timing) else None)
    roles, phases, index = Roles(), [], {}
    state = {"step": 0, "train": None}

    @contextlib.contextmanager
    def on_phase(name: str) -> Iterator[None]:
        idx = tracker.begin_phase(name)
        start = tracker.current
        backend.phase_start()
        t0 = watch.now() if timing else None
        yield
        t1 = watch.now() if timing else None
        step = state["train"]
        if name in ("backward", "optimizer"):
            roles.add(tracker, "gradients", [p.grad for p in step.model.parameters() if p.grad is not None])
        if name == "optimizer":
            roles.add(tracker, "optimizer_state", [v for st in step.optimizer.state.values() for v in st.values()])
            if step.scaler is not None:
                roles.add(tracker, "optimizer_state", [getattr(step.scaler, "_scale", None),
                                                       getattr(step.scaler, "_growth_tracker", None)])
        peak, end = backend.phase_stats()
        phases.append(PhaseStats(step=state["step"], phase=name, start_bytes=start, end_bytes=tracker.current,
                                 peak_bytes=tracker.phase_peaks[idx], storage_peak_bytes=tracker.phase_peaks[idx],
                                 peak_by_category={}, time_s=(t1 - t0) if timing else None,
                                 cuda_peak_allocated=peak, cuda_end_allocated=end))
        index[id(phases[-1])] = idx

    built: list[nn.Module] = []
    stack = contextlib.ExitStack()
    times: list[float] = []
    with _refusals(backend.device, tracker, built, model), stack:
        model = backend.enter(stack, model, batch)
        with tracker:
            with on_phase("init"):
                if backend.emulator is not None:
                    backend.emulator.start(tracker, roles)
                m = backend.build(model)
                built.append(m)
                dev_batch = move_batch(batch, backend.to_device)
                if backend.tracks_model(model):
                    tracker.track(list(m.parameters()) + list(m.buffers()))
                tracker.track(_tensors(dev_batch))
            roles.add(tracker, "parameters", list(m.parameters()) + list(m.buffers()))
            roles.add(tracker, "inputs", _tensors(dev_batch))
            init_bytes = tracker.current
            backend.after_init()
            step = state["train"] = TrainStep(m, dev_batch, policy=policy, device_type=backend.device_type,
                                              loss_fn=loss_fn, autocast=backend.autocast, call=call,
                                              grad_scaler=backend.grad_scaler(policy), loop=loop)
            roles.add(tracker, "parameters", list(step.model.parameters()) + list(step.model.buffers()))
            if backend.emulator is not None:
                backend.emulator.attach(step, tracker, roles)
            for s in range(1, steps + 1):
                state["step"] = s
                t0 = watch.now() if timing else None
                step.run(on_phase)
                if timing:
                    times.append(watch.now() - t0)
        num_params = sum(p.numel() for p in step.model.parameters())
    return _Run(tracker, roles, phases, index, init_bytes, num_params, times)


def _report(backend: Any, run: _Run, policy: Any, *, steps: int, loop: str, op_log: bool) -> MeasureReport:
    """Categories at each phase's peak (an event replay), the back-end's allocator figures, the report."""
    tracker, phases = run.tracker, run.phases
    by_step: dict[int, list[int]] = {}
    for p in phases:
        by_step.setdefault(p.step, []).append(run.index[id(p)])
    for p in phases:
        acts = tuple(i for i in by_step[p.step] if tracker.phases[i] in ("forward", "loss"))
        p.peak_by_category = categorise(tracker, run.roles, tracker.phase_peak_event[run.index[id(p)]], acts)
    done = backend.finish(tracker, phases, run.index, by_step)
    last = [p for p in phases if p.step == steps]
    top = max(last, key=lambda p: p.peak_bytes)
    top_storage = max(last, key=lambda p: p.storage_peak_bytes)
    em = backend.emulator
    rep = MeasureReport(
        device=backend.device, policy={"precision": policy.precision, "optimizer": policy.optimizer.name,
                                       "optimizer_impl": policy.optimizer.impl, "recompute": str(policy.recompute),
                                       "loop": loop},
        steps=steps, peak_bytes=top.peak_bytes, peak_phase=top.phase, by_phase=last,
        by_category=top_storage.peak_by_category, init_bytes=run.init_bytes,
        storage_peak_bytes=top_storage.storage_peak_bytes, reserved_bytes=done.reserved, all_phases=phases,
        cuda=done.cuda, emulation=em.describe() if em is not None else None, num_params=run.num_params,
        step_time_s=(sorted(run.step_times)[len(run.step_times) // 2] if run.step_times else None),
        reserved_by_conf=done.reserved_by_conf, reserved_range=done.reserved_range)
    if op_log:
        rep.op_log = tracker.op_log  # type: ignore[attr-defined]
    return rep


__all__ = ["CATEGORIES", "DEVICES", "MeasureReport", "PhaseStats", "measure_step"]
