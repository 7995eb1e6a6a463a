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
from torch.utils._pytree import tree_leaves

from labkit.core.errors import LabkitError
from labkit.memory.trace.backends import DEVICES, Backend, FakeCuda, make_backend
from labkit.memory.trace.refusals import FakeModeUnsupported, refusals
from labkit.memory.trace.storage import CATEGORIES, Roles, StorageTracker, Stopwatch, categorise
from labkit.workloads import StepPolicy, TrainStep, move_batch


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
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


@dataclass(frozen=True)
class Probes:
    """What the tracer records beside the memory figures (all off by default)."""

    op_log: bool = False
    """Keep one record per op (``MeasureReport.op_log``; on a GPU with the allocator's view: slow)."""
    timing: bool = False
    """Time each phase and step (``PhaseStats.time_s``, ``MeasureReport.step_time_s``; synchronised on a GPU)."""
    rounding: int | None = None
    """Bytes each storage is rounded up to; default the target's allocator rounding (512) on GPUs, 1 on the CPU."""
    observers: tuple = ()
    """Callables ``(func, args, kwargs, out, phase)`` the tracker calls after every op (e.g.
    :class:`labkit.advise.roofline.Roofline`, which prices each op on the target GPU)."""


def measure_step(model: nn.Module | Callable[[], nn.Module], batch: Any, policy: StepPolicy | None = None, *,
                 device: str = "fake-cuda", steps: int = 2, loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 call: Callable[[nn.Module, Any], Any] | None = None, fake: FakeCuda | None = None,
                 probes: Probes | None = None) -> MeasureReport:
    """Run ``steps`` training steps of ``model`` on ``batch`` and report per-phase, per-category memory.

    ``model``: an ``nn.Module`` or a zero-argument callable returning one (in fake mode its tensors are fake, so
    no real memory is used). ``batch``: a tensor or dict of tensors on the CPU, moved to the device (faked in
    fake mode). ``policy``: how the step runs (:class:`~labkit.workloads.StepPolicy`: precision, optimizer,
    recompute and the user's ``loop``, ``plain`` or ``keep-output``; default fp32, foreach AdamW, no recompute,
    plain). ``device``: ``fake-cuda`` (fake tensors predicting a CUDA GPU), ``cuda`` (a real GPU) or ``cpu``.
    ``loss_fn(output, batch)`` defaults to ``output.loss``; ``call(model, batch)`` to ``model(**batch)``.
    ``fake``: fake mode's options (:class:`~labkit.memory.trace.backends.FakeCuda`: the target GPU, MoE
    routing, a starting allocator state, other segment placements, other ``PYTORCH_ALLOC_CONF`` values).
    ``probes``: what is recorded beside the memory (:class:`Probes`).

    In fake mode, a step fake tensors cannot run raises :class:`FakeModeUnsupported`: one line naming the op,
    the module and the phase, and what to use instead.

    Ground truth is a plain loop without labkit (``benchmarks/gpu/record_plain.py``,
    ``data/measurements/measure/plain__*.json``), and that is what fake mode predicts. Attaching the tracer
    (``device="cuda"``) does not change the peak: on the H200 (torch 2.11, transformers 5.17) HF GPT-2 large,
    batch 4 x 1024, amp-bf16, fused AdamW peaks at 29.39 GB in a plain loop, 29.31 GB under ``measure_step``,
    29.38 GB under a do-nothing ``TorchDispatchMode``. What does change it is the loop: keeping the output
    object through backward adds its bf16 logits (+0.40 GB, 29.80 GB), hence ``StepPolicy(loop=...)``.
    """
    policy = policy if policy is not None else StepPolicy()
    if not isinstance(policy, StepPolicy):
        raise LabkitError(f"policy must be a StepPolicy, got {type(policy).__name__}")
    if steps < 1:
        raise LabkitError(f"steps must be >= 1, got {steps}")
    backend = make_backend(device, policy, fake)
    run = _run_steps(backend, model, batch, policy, steps, loss_fn, call, probes or Probes())
    return _report(backend, run, policy, steps)


@dataclass
class _Run:
    """The traced run, before the back-end turns it into figures."""

    tracker: StorageTracker
    roles: Roles
    phases: list[PhaseStats]
    index: dict[int, int]              # id(PhaseStats) -> the tracker's phase index
    init_bytes: int
    num_params: int
    step_times: list[float]


def _run_steps(backend: Backend, model: Any, batch: Any, policy: StepPolicy, steps: int, loss_fn: Any, call: Any,
               probes: Probes) -> _Run:
    """The loop: build the model and batch on the back-end's device, then ``steps`` training steps, each phase
    measured by the tracker (and, on a GPU, by the allocator's own peak)."""
    tracker = backend.tracker(probes.rounding, probes.op_log, probes.observers)
    timing = probes.timing
    watch = Stopwatch(torch.cuda.synchronize if (backend.device == "cuda" and timing) else None)
    roles, phases, index, times = Roles(), [], {}, []
    current = {"step": 0}
    train: TrainStep | None = None

    @contextlib.contextmanager
    def on_phase(name: str) -> Iterator[None]:
        idx = tracker.begin_phase(name)
        start = tracker.current
        backend.phase_start()
        t0 = watch.now() if timing else None
        yield
        t1 = watch.now() if timing else None
        if name in ("backward", "optimizer"):
            roles.add(tracker, "gradients", [p.grad for p in train.model.parameters() if p.grad is not None])
        if name == "optimizer":
            roles.add(tracker, "optimizer_state", [v for st in train.optimizer.state.values() for v in st.values()])
            if train.scaler is not None:
                roles.add(tracker, "optimizer_state", [getattr(train.scaler, "_scale", None),
                                                       getattr(train.scaler, "_growth_tracker", None)])
        peak, end = backend.phase_stats()
        phases.append(PhaseStats(step=current["step"], phase=name, start_bytes=start, end_bytes=tracker.current,
                                 peak_bytes=tracker.phase_peaks[idx], storage_peak_bytes=tracker.phase_peaks[idx],
                                 peak_by_category={}, time_s=(t1 - t0) if timing else None,
                                 cuda_peak_allocated=peak, cuda_end_allocated=end))
        index[id(phases[-1])] = idx

    built: list[nn.Module] = []
    with refusals(backend.device, tracker, built, model), contextlib.ExitStack() as stack:
        model = backend.enter(stack, model, batch)
        with tracker:
            with on_phase("init"):
                backend.start(tracker, roles)
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
            train = TrainStep(m, dev_batch, policy=policy, device_type=backend.device_type, loss_fn=loss_fn,
                              autocast=backend.autocast, call=call, grad_scaler=backend.grad_scaler(policy))
            roles.add(tracker, "parameters", list(train.model.parameters()) + list(train.model.buffers()))
            backend.attach(train, tracker, roles)
            for s in range(1, steps + 1):
                current["step"] = s
                t0 = watch.now() if timing else None
                train.run(on_phase)
                if timing:
                    times.append(watch.now() - t0)
            tracker.end_run()   # what dies later (the model, as this function returns) is no event of the run
        num_params = sum(p.numel() for p in train.model.parameters())
    return _Run(tracker, roles, phases, index, init_bytes, num_params, times)


def _report(backend: Backend, run: _Run, policy: StepPolicy, steps: int) -> MeasureReport:
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
    rep = MeasureReport(
        device=backend.device, policy={"precision": policy.precision, "optimizer": policy.optimizer.name,
                                       "optimizer_impl": policy.optimizer.impl, "recompute": str(policy.recompute),
                                       "loop": policy.loop},
        steps=steps, peak_bytes=top.peak_bytes, peak_phase=top.phase, by_phase=last,
        by_category=top_storage.peak_by_category, init_bytes=run.init_bytes,
        storage_peak_bytes=top_storage.storage_peak_bytes, reserved_bytes=done.reserved, all_phases=phases,
        cuda=done.cuda, emulation=backend.describe(), num_params=run.num_params,
        step_time_s=(sorted(run.step_times)[len(run.step_times) // 2] if run.step_times else None),
        reserved_by_conf=done.reserved_by_conf, reserved_range=done.reserved_range)
    if tracker.op_log_enabled:
        rep.op_log = tracker.op_log  # type: ignore[attr-defined]
    return rep


__all__ = ["CATEGORIES", "DEVICES", "FakeCuda", "FakeModeUnsupported", "MeasureReport", "PhaseStats", "Probes",
           "measure_step"]
