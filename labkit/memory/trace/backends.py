"""Where ``measure_step``'s step runs: one back-end per device, each owning what differs between them.

* :class:`FakeCudaBackend` (``fake-cuda``): fake tensors, the GPU's kernel rules (:class:`CudaEmulator`) and,
  after the run, the allocator simulator's replay of the allocation stream (peaks per phase, reserved, other
  ``PYTORCH_ALLOC_CONF`` values, other segment placements). The runtime a user's whole script runs on
  (:mod:`labkit.memory.script`) is built from the same pieces.
* :class:`CudaBackend` (``cuda``): a real GPU; the allocator's own statistics per phase.
* :class:`CpuBackend` (``cpu``): real CPU tensors; storages only.

A back-end makes the tracker, moves the model and batch, and turns the traced run into per-phase peaks
(:meth:`Backend.finish`); :func:`labkit.memory.trace.step.measure_step` is the loop around it.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.allocator import ShuffledVA, live_bytes, parse_alloc_conf
from labkit.core.errors import LabkitError
from labkit.core.spec import DEVICES
from labkit.core.vocab import MoeRouting
from labkit.memory.trace.fake.constants import KNOWN_NUMEL_LIMIT
from labkit.memory.trace.fake.fake_cuda import CudaEmulator, CudaTarget, data_dependent_choices
from labkit.memory.trace.fake.fake_runtime import fake_run
from labkit.memory.trace.reserved import MEASURED_THROUGH_STEP, replay_tracker
from labkit.memory.trace.storage import StorageTracker


@dataclass(frozen=True)
class FakeCuda:
    """Fake mode's options (``device="fake-cuda"`` only: on a real device the hardware decides each)."""

    target: Any = None
    """The GPU's choices, a :class:`~labkit.memory.trace.fake.fake_cuda.CudaTarget`; default an H200 in a fresh
    process (``RunSpec.process``; ``CudaTarget(warm_process=True)`` for one that ran matmuls before)."""
    moe_routing: Any = None
    """How a mixture-of-experts model's tokens are assumed to be routed where its shapes depend on it (an eager
    per-expert loop): ``balanced`` (the default) or each expert's share of the tokens x top-k rows
    (``"0.4,0.3,0.2,0.1"``, a sequence, or a :class:`~labkit.core.vocab.MoeRouting`); the report's
    ``emulation["moe_routing"]`` says which was assumed and which modules used it (:mod:`labkit.memory.trace.fake.moe`)."""
    allocator_state: Any = None
    """The segments the process already holds when the step starts (as ``torch.cuda.memory_snapshot()`` lists
    them): reserved memory is replayed from there (:mod:`labkit.allocator.sim.state`), a warm process's cuBLAS
    workspaces taken to be in it. Without it the replay starts from an empty cache (plus the workspaces in a warm
    process)."""
    reserved_placements: int = 0
    """Also replay under that many other orders of the segments' addresses (:class:`labkit.allocator.ShuffledVA`):
    the report's ``reserved_range``. Best fit breaks ties between equal free blocks by address and the driver's
    placement depends on the process's past, so one loop can reserve one of several figures (on the H200 a Llama
    checkpointing step: 21.58 or 23.63 GB)."""
    alloc_confs: tuple[str, ...] = ()
    """Also replay the allocation stream under each of these ``PYTORCH_ALLOC_CONF`` values: the report's
    ``reserved_by_conf``."""

    def __post_init__(self) -> None:
        if not isinstance(self.reserved_placements, int) or self.reserved_placements < 0:
            raise LabkitError(f"reserved_placements must be 0 or more, got {self.reserved_placements!r}")
        if isinstance(self.alloc_confs, str):
            raise LabkitError(f"alloc_confs must be a sequence of PYTORCH_ALLOC_CONF values, got the string "
                              f"{self.alloc_confs!r}; write ({self.alloc_confs!r},)")
        object.__setattr__(self, "alloc_confs", tuple(self.alloc_confs))
        if self.moe_routing is not None:
            object.__setattr__(self, "moe_routing", MoeRouting.parse(self.moe_routing, what="moe_routing"))


@dataclass
class Finished:
    """What a back-end adds to the report after the run."""

    reserved: int | None = None
    reserved_range: tuple[int, int] | None = None
    reserved_by_conf: dict[str, dict[str, int]] = field(default_factory=dict)
    cuda: dict[str, Any] | None = None


class Backend:
    """The device-specific half of a measured step (see the module docstring)."""

    device = ""
    device_type = "cpu"          # what TrainStep's autocast and the batch use
    emulator: Any = None
    autocast: Any = None

    def tracker(self, rounding: int | None, op_log: bool, observers: tuple) -> StorageTracker:
        raise NotImplementedError

    def enter(self, stack: contextlib.ExitStack, model: Any, batch: Any) -> Any:
        """Enter the device's contexts; returns the model as the step builds it."""
        return model

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def build(self, model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
        if isinstance(model, nn.Module):
            return model.to(self.device_type)
        return _call_factory(model, self.device_type)

    def tracks_model(self, model: Any) -> bool:
        """Whether the model's parameters are new storages this run allocated (registered with the tracker)."""
        return isinstance(model, nn.Module)

    def grad_scaler(self, policy: Any) -> Any:
        return None

    def start(self, tracker: StorageTracker, roles: Any) -> None:
        """The run begins (before the model is built)."""

    def attach(self, step: Any, tracker: StorageTracker, roles: Any) -> None:
        """The training step is built (before its first phase)."""

    def describe(self) -> dict[str, Any] | None:
        """What the back-end emulated, for the report (None on a real device)."""
        return None

    def phase_start(self) -> None:
        pass

    def after_init(self) -> None:
        pass

    def phase_stats(self) -> tuple[int | None, int | None]:
        return None, None

    def finish(self, tracker: StorageTracker, phases: list[Any], index: dict[int, int],
               by_step: dict[int, list[int]]) -> Finished:
        return Finished()


def _call_factory(model: Callable[[], nn.Module], device: str) -> nn.Module:
    if not callable(model):
        raise LabkitError(f"model must be an nn.Module or a zero-argument callable, got {type(model).__name__}")
    with torch.device(device):
        m = model()
    if not isinstance(m, nn.Module):
        raise LabkitError(f"the model factory returned {type(m).__name__}, not an nn.Module")
    return m


class CpuBackend(Backend):
    device = "cpu"

    def tracker(self, rounding: int | None, op_log: bool, observers: tuple) -> StorageTracker:
        return StorageTracker(device_type="cpu", rounding=rounding or 1, op_log=op_log, observers=observers)

    def tracks_model(self, model: Any) -> bool:
        return False                          # built in place on the CPU: the same storages


class CudaBackend(Backend):
    device = "cuda"
    device_type = "cuda"

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise LabkitError("device 'cuda' asked for but torch sees no CUDA GPU here; use device='fake-cuda'")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        self.init_allocated = 0

    def tracker(self, rounding: int | None, op_log: bool, observers: tuple) -> StorageTracker:
        return StorageTracker(device_type="cuda", rounding=rounding or 512, op_log=op_log, cuda_op_stats=op_log,
                              observers=observers)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to("cuda", non_blocking=False)

    def phase_start(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def after_init(self) -> None:
        self.init_allocated = torch.cuda.memory_allocated() - self.base

    def phase_stats(self) -> tuple[int | None, int | None]:
        return torch.cuda.max_memory_allocated() - self.base, torch.cuda.memory_allocated() - self.base

    def finish(self, tracker: StorageTracker, phases: list[Any], index: dict[int, int],
               by_step: dict[int, list[int]]) -> Finished:
        for p in phases:
            p.peak_bytes = p.cuda_peak_allocated or 0
        last = [p for p in phases if p.step == max(by_step)]
        st = torch.cuda.memory_stats()
        info = {"steady_peak_allocated": max(p.cuda_peak_allocated or 0 for p in last),
                "steady_phase_peaks": {p.phase: p.cuda_peak_allocated for p in last},
                "init_allocated": self.init_allocated, "base_allocated": self.base,
                "reserved_peak": int(st.get("reserved_bytes.all.peak", 0)),
                "reserved_current": int(st.get("reserved_bytes.all.current", 0)),
                "num_alloc_retries": int(st.get("num_alloc_retries", 0)), "num_ooms": int(st.get("num_ooms", 0))}
        return Finished(reserved=info["reserved_peak"], cuda=info)


class FakeCudaBackend(Backend):
    """Fake tensors with the target GPU's rules (``target``: a :class:`CudaTarget`, default an H200 in a fresh
    process), then the allocator replay (``allocator_state``, ``reserved_placements``, ``alloc_confs``)."""

    device = "fake-cuda"

    def __init__(self, policy: Any, options: FakeCuda) -> None:
        self.emulator = CudaEmulator(options.target or CudaTarget(), policy, options.moe_routing)
        self.fake = FakeTensorMode(allow_non_fake_inputs=False)
        self.allocator_state = options.allocator_state
        self.reserved_placements = options.reserved_placements
        self.alloc_confs = options.alloc_confs
        if policy.autocast_dtype is not None:
            self.autocast = self.emulator.autocast_factory(policy.autocast_dtype)

    def tracker(self, rounding: int | None, op_log: bool, observers: tuple) -> StorageTracker:
        return StorageTracker(device_type="meta", rounding=rounding or self.emulator.target.allocator_rounding,
                              emulator=self.emulator, op_log=op_log, observers=observers)   # fake storages are meta

    def enter(self, stack: contextlib.ExitStack, model: Any, batch: Any) -> Any:
        self.emulator.assumptions = stack.enter_context(data_dependent_choices(batch))
        if isinstance(model, nn.Module):
            model = _fake_copy(model, self.fake)
        stack.enter_context(self.fake)
        stack.enter_context(fake_run(self.emulator))
        return model

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """The batch's tensor as a fake one; a small integer or boolean one (labels, lengths, masks: up to
        ``KNOWN_NUMEL_LIMIT`` elements) keeps its values, which the GPU run computes with too, so that an op whose
        output's shape depends on them (``labels.masked_select(labels >= 0)`` before a CTC loss) has it
        (``constants.known_value`` carries them through the ops computed from them)."""
        if t.is_floating_point() or t.is_complex() or t.numel() > KNOWN_NUMEL_LIMIT:
            return self.fake.from_tensor(t)
        return self.fake.fake_tensor_converter.from_real_tensor(self.fake, t, make_constant=True)

    def build(self, model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
        if isinstance(model, nn.Module):
            return model                       # already a fake copy
        return _call_factory(model, "cpu")     # the active FakeTensorMode makes every tensor a fake CPU tensor

    def tracks_model(self, model: Any) -> bool:
        return True

    def grad_scaler(self, policy: Any) -> Any:
        return self.emulator.grad_scaler() if policy.precision == "amp-fp16" else None

    def start(self, tracker: StorageTracker, roles: Any) -> None:
        self.emulator.start(tracker, roles)

    def attach(self, step: Any, tracker: StorageTracker, roles: Any) -> None:
        self.emulator.attach(step, tracker, roles)

    def describe(self) -> dict[str, Any] | None:
        return self.emulator.describe()

    def finish(self, tracker: StorageTracker, phases: list[Any], index: dict[int, int],
               by_step: dict[int, list[int]]) -> Finished:
        if not self.emulator.target.simulate_allocator:
            return Finished()
        step_starts = [tracker.phase_start_event[min(by_step[s])] for s in sorted(by_step) if s >= 1]
        seeded = self._seeded()

        def replay(config: Any = None, **kw: Any) -> Any:
            return replay_tracker(tracker, config, step_starts=step_starts, through_step=MEASURED_THROUGH_STEP,
                                  **seeded, **kw)

        rp = replay()
        for p in phases:
            p.peak_bytes = rp.phase_peak_allocated[index[id(p)]]
        out = Finished(reserved=rp.reserved_end)
        if self.reserved_placements:
            spread = [rp.reserved_end] + [replay(address_space=ShuffledVA(seed)).reserved_end
                                          for seed in range(self.reserved_placements)]
            out.reserved_range = (min(spread), max(spread))
        for conf in self.alloc_confs:
            r = replay(parse_alloc_conf(conf))
            out.reserved_by_conf[conf] = {"reserved_peak": r.reserved_peak, "segments": r.segments,
                                              "peak_allocated": max(r.phase_peak_allocated, default=0)}
        return out

    def _seeded(self) -> dict[str, Any]:
        """The replay's starting state: the segments a process already holds, where given; a warm process's
        cuBLAS workspaces are blocks of that state where it holds that much."""
        if self.allocator_state is None:
            return {}
        em = self.emulator
        ws = frozenset(em._roles.workspace) if em.target.warm_process and em._roles else frozenset()
        if live_bytes(self.allocator_state) < len(ws) * em.target.cublas_workspace_bytes:
            ws = frozenset()
        return {"state": self.allocator_state, "in_state": ws}


def _fake_copy(model: nn.Module, fake: Any) -> nn.Module:
    """A structural copy of ``model`` whose parameters and buffers are fake (no real memory is copied).
    Call it before entering ``fake`` (converting real tensors inside the mode is refused)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(fake.from_tensor(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = fake.from_tensor(b)
    return copy.deepcopy(model, memo)


_REAL_DEVICE_DECIDES = {"target": "the device itself runs", "moe_routing": "the batch's real routing decides",
                        "allocator_state": "the real allocator's own state decides",
                        "reserved_placements": "the driver places the segments",
                        "alloc_confs": "the process's own PYTORCH_ALLOC_CONF decides"}


def make_backend(device: str, policy: Any, fake: FakeCuda | None = None) -> Backend:
    """The back-end of ``device``; ``fake`` (fake mode's options) is refused on a real device, where the hardware
    decides what it would assume."""
    if device not in DEVICES:
        raise LabkitError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if fake is not None and not isinstance(fake, FakeCuda):
        raise LabkitError(f"fake must be a FakeCuda (fake mode's options), got {type(fake).__name__}")
    if device == "fake-cuda":
        return FakeCudaBackend(policy, fake or FakeCuda())
    for f in fields(FakeCuda):
        if fake is not None and getattr(fake, f.name) != f.default:
            raise LabkitError(f"{f.name} applies to device 'fake-cuda' (on {device!r} {_REAL_DEVICE_DECIDES[f.name]}); "
                              "leave it out")
    return CudaBackend() if device == "cuda" else CpuBackend()
