"""``measure_step``: run training steps under the storage tracker and report, per phase and
category, current and peak bytes, on a real GPU (``cuda``), on the CPU (``cpu``), or in fake mode
(``fake-cuda``: fake tensors, no memory used, predicting what a CUDA GPU would allocate).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from labkit.core.errors import LabkitError
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


def _fake_copy(model: nn.Module, fake: Any) -> nn.Module:
    """A structural copy of ``model`` whose parameters and buffers are fake (no real memory is copied).
    Call it before entering ``fake`` (converting real tensors inside the mode is refused)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(fake.from_tensor(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = fake.from_tensor(b)
    return copy.deepcopy(model, memo)


def _build_model(model: nn.Module | Callable[[], nn.Module], device: str) -> nn.Module:
    if isinstance(model, nn.Module):
        if device == "fake-cuda":
            return model   # already a fake copy (see _fake_copy)
        return model.to(device)
    if not callable(model):
        raise LabkitError(f"model must be an nn.Module or a zero-argument callable, got {type(model).__name__}")
    # fake mode: the active FakeTensorMode makes every tensor the factory creates a fake CPU tensor
    with torch.device("cpu" if device == "fake-cuda" else device):
        m = model()
    if not isinstance(m, nn.Module):
        raise LabkitError(f"the model factory returned {type(m).__name__}, not an nn.Module")
    return m


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
    from labkit.workloads import LOOPS, StepPolicy, TrainStep, move_batch

    if loop not in LOOPS:
        raise LabkitError(f"loop {loop!r} is not one of {', '.join(LOOPS)}")
    if device not in DEVICES:
        raise LabkitError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if steps < 1:
        raise LabkitError(f"steps must be >= 1, got {steps}")
    if moe_routing is not None:
        from labkit.core.vocab import MoeRouting

        moe_routing = MoeRouting.parse(moe_routing, what="moe_routing")
        if device != "fake-cuda":
            raise LabkitError(f"moe_routing applies to device 'fake-cuda' (on {device!r} the batch's real routing "
                              "decides); leave it out")
    if allocator_state is not None and device != "fake-cuda":
        raise LabkitError(f"allocator_state applies to device 'fake-cuda' (on {device!r} the real allocator's own "
                          "state decides); leave it out")
    if reserved_placements and device != "fake-cuda":
        raise LabkitError(f"reserved_placements applies to device 'fake-cuda' (on {device!r} the driver places the "
                          "segments); leave it out")
    if reserved_placements < 0:
        raise LabkitError(f"reserved_placements must be 0 or more, got {reserved_placements}")
    policy = StepPolicy(precision=precision, optimizer=optimizer, recompute=recompute, checkpointing=checkpointing)
    is_cuda = device == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise LabkitError("device 'cuda' asked for but torch sees no CUDA GPU here; use device='fake-cuda'")

    stack = contextlib.ExitStack()
    emulator = None
    autocast = None
    fused: bool | None = None
    if device == "fake-cuda":
        from torch._subclasses.fake_tensor import FakeTensorMode

        from labkit.memory.trace.fake_cuda import CudaEmulator, CudaTarget

        from labkit.memory.trace.fake_cuda import data_dependent_choices

        from labkit.memory.trace.fake_runtime import fake_run

        emulator = CudaEmulator(target or CudaTarget(), policy, moe_routing)
        fake = FakeTensorMode(allow_non_fake_inputs=False)
        emulator.assumptions = stack.enter_context(data_dependent_choices(batch))
        if isinstance(model, nn.Module):
            model = _fake_copy(model, fake)
        stack.enter_context(fake)
        stack.enter_context(fake_run(emulator))
        if policy.autocast_dtype is not None:
            autocast = emulator.autocast_factory(policy.autocast_dtype)
        tracker = StorageTracker(device_type="meta", rounding=rounding or 512, emulator=emulator, op_log=op_log,
                                 observers=observers)  # fake storages are meta
        to_device: Callable[[torch.Tensor], torch.Tensor] = fake.from_tensor
        device_type = "cpu"
    elif is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        tracker = StorageTracker(device_type="cuda", rounding=rounding or 512, op_log=op_log, cuda_op_stats=op_log,
                                 observers=observers)
        to_device = lambda t: t.to("cuda", non_blocking=False)  # noqa: E731
        device_type = "cuda"
    else:
        tracker = StorageTracker(device_type="cpu", rounding=rounding or 1, op_log=op_log, observers=observers)
        to_device = lambda t: t  # noqa: E731
        device_type = "cpu"
        fused = None  # fused AdamW has a CPU kernel too

    watch = Stopwatch(torch.cuda.synchronize if (is_cuda and timing) else None)
    roles = Roles()
    phases: list[PhaseStats] = []
    step_no = 0
    cuda_base = torch.cuda.memory_allocated() if is_cuda else 0

    @contextlib.contextmanager
    def on_phase(name: str) -> Iterator[None]:
        idx = tracker.begin_phase(name)
        start = tracker.current
        if is_cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = watch.now() if timing else None
        yield
        t1 = watch.now() if timing else None
        if name in ("backward", "optimizer"):
            roles.add(tracker, "gradients", [p.grad for p in step.model.parameters() if p.grad is not None])
        if name == "optimizer":
            roles.add(tracker, "optimizer_state", [v for st in step.optimizer.state.values() for v in st.values()])
            if step.scaler is not None:
                roles.add(tracker, "optimizer_state", [getattr(step.scaler, "_scale", None),
                                                       getattr(step.scaler, "_growth_tracker", None)])
        phases.append(PhaseStats(
            step=step_no, phase=name, start_bytes=start, end_bytes=tracker.current,
            peak_bytes=tracker.phase_peaks[idx], storage_peak_bytes=tracker.phase_peaks[idx], peak_by_category={},
            time_s=(t1 - t0) if timing else None,
            cuda_peak_allocated=(torch.cuda.max_memory_allocated() - cuda_base) if is_cuda else None,
            cuda_end_allocated=(torch.cuda.memory_allocated() - cuda_base) if is_cuda else None,
        ))
        phases[-1]._index = idx  # type: ignore[attr-defined]

    built: list[nn.Module] = []
    with _refusals(device, tracker, built, model), stack:
        with tracker:
            with on_phase("init"):
                if emulator is not None:
                    emulator.start(tracker, roles)
                m = _build_model(model, device)
                built.append(m)
                dev_batch = move_batch(batch, to_device)
                if device == "fake-cuda" or (isinstance(model, nn.Module) and device != "cpu"):
                    tracker.track(list(m.parameters()) + list(m.buffers()))
                tracker.track(_tensors(dev_batch))
            roles.add(tracker, "parameters", list(m.parameters()) + list(m.buffers()))
            roles.add(tracker, "inputs", _tensors(dev_batch))
            init_bytes = tracker.current
            if is_cuda:
                init_cuda = torch.cuda.memory_allocated() - cuda_base
            step = TrainStep(m, dev_batch, policy=policy, device_type=device_type if device != "fake-cuda" else "cpu",
                             loss_fn=loss_fn, autocast=autocast, fused=fused, call=call,
                             grad_scaler=emulator.grad_scaler() if (emulator and policy.precision == "amp-fp16") else None,
                             loop=loop)
            roles.add(tracker, "parameters", list(step.model.parameters()) + list(step.model.buffers()))
            if emulator is not None:
                emulator.attach(step, tracker, roles)
            t_steps = []
            for s in range(1, steps + 1):
                step_no = s
                t0 = watch.now() if timing else None
                step.run(on_phase)
                if timing:
                    t_steps.append(watch.now() - t0)
        num_params = sum(p.numel() for p in step.model.parameters())

    # categories at each phase peak (event replay)
    by_step: dict[int, list[int]] = {}
    for p in phases:
        by_step.setdefault(p.step, []).append(p._index)  # type: ignore[attr-defined]
    for p in phases:
        idx = p._index  # type: ignore[attr-defined]
        acts = tuple(i for i in by_step[p.step] if tracker.phases[i] in ("forward", "loss"))
        p.peak_by_category = categorise(tracker, roles, tracker.phase_peak_event[idx], acts)
    reserved = None
    reserved_range: tuple[int, int] | None = None
    reserved_by_conf: dict[str, dict[str, int]] = {}
    if device == "fake-cuda" and emulator is not None and emulator.target.simulate_allocator:
        from labkit.memory.trace.reserved import MEASURED_THROUGH_STEP, replay_tracker

        step_starts = [tracker.phase_start_event[min(by_step[s])] for s in sorted(by_step) if s >= 1]
        seeded: dict[str, Any] = {}
        if allocator_state is not None:
            # a warm process's cuBLAS workspaces are blocks of the state, where it holds that much
            from labkit.allocator import live_bytes

            ws = frozenset(emulator._roles.workspace) if emulator.target.warm_process and emulator._roles else frozenset()
            if live_bytes(allocator_state) < len(ws) * emulator.target.cublas_workspace_bytes:
                ws = frozenset()
            seeded = {"state": allocator_state, "in_state": ws}
        rp = replay_tracker(tracker, step_starts=step_starts, through_step=MEASURED_THROUGH_STEP, **seeded)
        for p in phases:
            p.peak_bytes = rp.phase_peak_allocated[p._index]  # type: ignore[attr-defined]
        reserved = rp.reserved_end
        if reserved_placements:
            from labkit.allocator import ShuffledVA

            spread = [reserved] + [replay_tracker(tracker, step_starts=step_starts, through_step=MEASURED_THROUGH_STEP,
                                                  address_space=ShuffledVA(seed), **seeded).reserved_end
                                   for seed in range(reserved_placements)]
            reserved_range = (min(spread), max(spread))
        if alloc_confs:
            from labkit.allocator import parse_alloc_conf

            for conf in alloc_confs:
                r = replay_tracker(tracker, parse_alloc_conf(conf), step_starts=step_starts,
                                   through_step=MEASURED_THROUGH_STEP, **seeded)
                reserved_by_conf[conf] = {"reserved_peak": r.reserved_peak, "segments": r.segments,
                                          "peak_allocated": max(r.phase_peak_allocated, default=0)}
    elif is_cuda:
        for p in phases:
            p.peak_bytes = p.cuda_peak_allocated or 0
    last = [p for p in phases if p.step == steps]
    top = max(last, key=lambda p: p.peak_bytes)
    top_storage = max(last, key=lambda p: p.storage_peak_bytes)
    cuda_info = None
    if is_cuda:
        st = torch.cuda.memory_stats()
        cuda_info = {
            "steady_peak_allocated": max(p.cuda_peak_allocated or 0 for p in last),
            "steady_phase_peaks": {p.phase: p.cuda_peak_allocated for p in last},
            "init_allocated": init_cuda,
            "base_allocated": cuda_base,
            "reserved_peak": int(st.get("reserved_bytes.all.peak", 0)),
            "reserved_current": int(st.get("reserved_bytes.all.current", 0)),
            "num_alloc_retries": int(st.get("num_alloc_retries", 0)),
            "num_ooms": int(st.get("num_ooms", 0)),
        }
        reserved = cuda_info["reserved_peak"]
    for p in phases:
        if hasattr(p, "_index"):
            del p._index  # type: ignore[attr-defined]
    rep = MeasureReport(
        device=device, policy={"precision": policy.precision, "optimizer": policy.optimizer.name,
                               "optimizer_impl": policy.optimizer.impl, "recompute": str(policy.recompute)},
        steps=steps, peak_bytes=top.peak_bytes, peak_phase=top.phase, by_phase=last,
        by_category=top_storage.peak_by_category, init_bytes=init_bytes,
        storage_peak_bytes=top_storage.storage_peak_bytes, reserved_bytes=reserved, all_phases=phases, cuda=cuda_info,
        emulation=emulator.describe() if emulator is not None else None, num_params=num_params,
        step_time_s=(sorted(t_steps)[len(t_steps) // 2] if timing and t_steps else None),
    )
    rep.reserved_by_conf = reserved_by_conf
    rep.reserved_range = reserved_range
    rep.policy["loop"] = loop
    if op_log:
        rep.op_log = tracker.op_log  # type: ignore[attr-defined]
    return rep


__all__ = ["CATEGORIES", "DEVICES", "MeasureReport", "PhaseStats", "measure_step"]
