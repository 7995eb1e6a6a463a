"""``torch.cuda`` as the target GPU answers it, for a faked program.

Availability, device count, names and properties come from the target (:class:`GpuFacts`); the memory
statistics from the live allocator (:mod:`labkit.memory.script.live_allocator`), so a script's own
``print(torch.cuda.max_memory_allocated())`` prints the prediction. Streams and events exist and do
nothing (one stream: the program's work is already in order); an event's ``elapsed_time`` is 0.0 (no
time is predicted here). Random-number state is a host tensor.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator

import torch
import torch.backends.cudnn as cudnn
import torch.cuda as tc
import torch.cuda.memory as tcm
import torch.cuda.nvtx as nvtx
import torch.cuda.random as tcr

from labkit.core.errors import LabkitError
from labkit.memory.estimate.buffers import CUDA_CONTEXT_BYTES
from labkit.memory.trace.fake.fake_cuda import H200


@dataclass(frozen=True)
class GpuFacts:
    """What ``torch.cuda`` reports about the target GPU.

    ``total_memory``: ``cudaDeviceProp::totalGlobalMem``, what ``get_device_properties().total_memory``
    reports, recorded on the lab's H200 (``data/measurements/script/scripts.json``, ``total_memory``; its OOM
    messages say "a total capacity of 139.80 GiB"). ``context_bytes``: what the CUDA context and libraries hold outside
    PyTorch's allocator: the figure the estimator uses, measured on the H200
    (:data:`labkit.memory.estimate.buffers.CUDA_CONTEXT_BYTES`, one home for the fact). ``mem_get_info``
    subtracts it, and the simulated device serves at most ``total_memory - context_bytes``.
    """

    name: str = H200["name"]                   # the target's facts file (labkit/memory/trace/fake/targets/h200.json)
    total_memory: int = 150_109_880_320      # get_device_properties(0).total_memory on the H200
    major: int = H200["sm"][0]
    minor: int = H200["sm"][1]
    multi_processor_count: int = H200["sm_count"]
    context_bytes: int = CUDA_CONTEXT_BYTES
    device_count: int = 1

    @property
    def usable_bytes(self) -> int:
        return self.total_memory - self.context_bytes

    def properties(self) -> Any:
        return SimpleNamespace(name=self.name, total_memory=self.total_memory, major=self.major, minor=self.minor,
                               multi_processor_count=self.multi_processor_count, is_integrated=False,
                               is_multi_gpu_board=False, L2_cache_size=60 * (1 << 20),
                               max_threads_per_multi_processor=2048, warp_size=32, gcnArchName="",
                               uuid="00000000-0000-0000-0000-000000000000 (fake)")


class FakeStream:
    """A CUDA stream that does nothing (the faked program runs in order on the host)."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> "FakeEvent":
        ev = event or FakeEvent()
        return ev

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> "FakeStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream)

    def __hash__(self) -> int:
        return 0


class FakeEvent:
    """A CUDA event: records nothing; ``elapsed_time`` is 0.0 ms (the fake GPU predicts no time)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class _GraphRefused:
    """The base of the fake GPU's ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``, whose construction is refused."""


class _DeviceContext:
    """``torch.cuda.device(i)``: selects nothing (one GPU per process)."""

    def __init__(self, device: Any) -> None:
        self.idx = device

    def __enter__(self) -> "_DeviceContext":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _summary(live: Any) -> str:
    st = live.stats()
    gib = 1 << 30
    return ("labkit fake GPU (predicted): "
            f"allocated {st['allocated_bytes.all.current'] / gib:.2f} GiB (peak {st['allocated_bytes.all.peak'] / gib:.2f}), "
            f"reserved {st['reserved_bytes.all.current'] / gib:.2f} GiB (peak {st['reserved_bytes.all.peak'] / gib:.2f}), "
            f"{st['segment.all.current']} segments")


def _generator_type(note: Any) -> type:
    """``torch.Generator`` as a CUDA build answers ``torch.Generator(device="cuda")`` (a CPU build refuses it): a host
    generator stands in, its ``device`` the GPU's (timm's ``ModelEmaV3`` keeps one for stochastic rounding). Every
    other generator is torch's own, and ``isinstance`` answers for torch's generators as before."""
    base = torch.Generator

    class Meta(type(base)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return issubclass(sub, base)

    class Generator(base, metaclass=Meta):  # type: ignore[misc, valid-type]
        def __new__(cls, device: Any = "cpu") -> Any:
            if torch.device(device).type != "cuda":
                return base(device)
            note("torch.Generator(device='cuda'): a host generator stands in on the fake GPU (its own seed and "
                 "state; draws with it are the host's, the same shapes)")
            return base.__new__(cls, device="cpu")

        def __init__(self, device: Any = "cpu") -> None:
            dev = torch.device(device)
            self._fake_device = torch.device("cuda", 0 if dev.index is None else dev.index)

        @property
        def device(self) -> torch.device:
            return self._fake_device

    return Generator


@contextlib.contextmanager
def cuda_answers(facts: GpuFacts, live: Any, note: Any, local_rank: int = 0) -> Iterator[None]:
    """Patch ``torch.cuda`` (and the few ``torch.backends`` queries that need a GPU) for the duration.
    ``note(text)`` records an assumption (e.g. a memory-history call that records nothing here)."""
    current = [local_rank]

    def device_count() -> int:
        return facts.device_count

    def set_device(d: Any) -> None:
        idx = d.index if isinstance(d, torch.device) else (int(d) if d is not None else 0)
        current[0] = 0 if idx is None else idx

    def memory_allocated(device: Any = None) -> int:
        live.sync()
        return live.allocated

    def max_memory_allocated(device: Any = None) -> int:
        live.sync()
        return live.peak

    def memory_reserved(device: Any = None) -> int:
        live.sync()
        return live.reserved

    def max_memory_reserved(device: Any = None) -> int:
        live.sync()
        return live.reserved_peak

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        live.sync()
        return facts.usable_bytes - live.reserved, facts.total_memory

    def record_history(*a: Any, **k: Any) -> None:
        note("torch.cuda.memory._record_memory_history: nothing is recorded on the fake GPU (use labkit watch "
             "-- python SCRIPT on a GPU for a real snapshot)")

    def dump_snapshot(*a: Any, **k: Any) -> None:
        note("torch.cuda.memory._dump_snapshot: no snapshot file is written on the fake GPU")

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        # CUDACachingAllocator.cpp recordStream: the block's free waits for an event on that stream, which the
        # next allocation finds complete once the stream's work is done; the fake GPU's streams run in order, so
        # the block is free when the program frees it
        if not isinstance(stream, FakeStream):
            original_record_stream(self, stream)

    def scatter(tensor: torch.Tensor, devices: Any, chunk_sizes: Any = None, dim: int = 0, streams: Any = None) -> Any:
        # torch/csrc/cuda/comm.cpp scatter (nn.DataParallel's input split; a CUDA build's torch._C._scatter): the
        # chunks, narrowed or tensor.chunk(len(devices)), each .contiguous().to(its device, non_blocking=True)
        chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(len(devices), dim)
        return tuple(c.contiguous().to(torch.device("cuda", int(d)), non_blocking=True)
                     for c, d in zip(chunks, devices))

    def cuda_graph(*a: Any, **k: Any) -> Any:
        frame = sys._getframe(1)                  # the caller (a class is made by type.__call__, in C)
        script = os.path.relpath(frame.f_code.co_filename)
        raise LabkitError(f"CUDA graph capture (torch.cuda.CUDAGraph, torch.cuda.graph, make_graphed_callables) at "
                          f"{script}:{frame.f_lineno} is not modelled by the fake GPU (a captured graph keeps its "
                          f"blocks in a private memory pool); predict the step without the capture, or on a GPU run "
                          f"`labkit watch -- python {script}`")

    # classes, as the names are types in annotations (``torch.cuda.CUDAGraph | None`` in transformers)
    graph_types = {name: type(name, (_GraphRefused,), {"__init__": cuda_graph}) for name in ("CUDAGraph", "graph")}

    def rng_state(device: Any = None) -> torch.Tensor:
        return torch.zeros(16, dtype=torch.uint8, device="cpu")

    def none(*a: Any, **k: Any) -> None:
        return None

    names: dict[str, Any] = {
        "is_available": lambda: True, "device_count": device_count, "current_device": lambda: current[0],
        "set_device": set_device, "device": _DeviceContext, "is_initialized": lambda: True, "init": none,
        "_lazy_init": none, "_is_compiled": lambda: True, "_device_count_nvml": device_count,
        "get_device_name": lambda device=None: facts.name,
        "get_device_capability": lambda device=None: (facts.major, facts.minor),
        "get_device_properties": lambda device=None: facts.properties(),
        "get_arch_list": lambda: [f"sm_{facts.major}{facts.minor}"],
        "is_bf16_supported": lambda including_emulation=True: facts.major >= 8,
        "synchronize": lambda device=None: live.sync(),
        "memory_allocated": memory_allocated, "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved, "max_memory_reserved": max_memory_reserved,
        "memory_cached": memory_reserved, "max_memory_cached": max_memory_reserved,
        "reset_peak_memory_stats": lambda device=None: live.reset_peaks(),
        "reset_max_memory_allocated": lambda device=None: live.reset_peaks(),
        "reset_max_memory_cached": lambda device=None: live.reset_peaks(),
        "reset_accumulated_memory_stats": none,
        "memory_stats": lambda device=None: live.stats(),
        "memory_summary": lambda device=None, abbreviated=False: _summary(live),
        "mem_get_info": mem_get_info, "empty_cache": lambda: live.empty_cache(),
        "memory_snapshot": lambda *a, **k: live.sim.segments(),
        "set_per_process_memory_fraction": lambda fraction, device=None: note(
            f"torch.cuda.set_per_process_memory_fraction({fraction}) is not applied on the fake GPU"),
        "Stream": FakeStream, "Event": FakeEvent, "current_stream": lambda device=None: FakeStream(),
        "default_stream": lambda device=None: FakeStream(), "stream": lambda s=None: contextlib.nullcontext(),
        "manual_seed": none, "manual_seed_all": none, "seed": none, "seed_all": none,
        "initial_seed": lambda: 0, "get_rng_state": rng_state, "set_rng_state": none,
        "get_rng_state_all": lambda: [rng_state()], "set_rng_state_all": none,
        "utilization": lambda device=None: 0, "ipc_collect": none,
        "is_current_stream_capturing": lambda: False,
        **graph_types, "make_graphed_callables": cuda_graph,
    }
    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr, _MISSING)))
        setattr(obj, attr, value)

    for attr, value in names.items():
        patch(tc, attr, value)

    for attr in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "reset_peak_memory_stats", "memory_stats", "mem_get_info", "empty_cache", "memory_snapshot"):
        if hasattr(tcm, attr):
            patch(tcm, attr, names[attr])
    patch(torch, "Generator", _generator_type(note))
    patch(tcm, "_record_memory_history", record_history)
    patch(tcm, "_dump_snapshot", dump_snapshot)

    for attr in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "seed", "seed_all"):
        patch(tcr, attr, names[attr])

    for attr in ("range_push", "range_pop", "mark"):
        patch(nvtx, attr, none)
    patch(nvtx, "range", lambda *a, **k: contextlib.nullcontext())

    original_record_stream = torch.Tensor.record_stream
    patch(torch.Tensor, "record_stream", record_stream)
    patch(torch._C, "_scatter", scatter)

    patch(cudnn, "is_available", lambda: True)
    acc = getattr(torch, "accelerator", None)        # the device-generic API (torch >= 2.6), as accelerate asks it
    if acc is not None:
        generic = {"is_available": lambda: True, "current_accelerator": lambda check_available=False: torch.device("cuda"),
                   "device_count": device_count, "current_device_index": lambda: current[0],
                   "current_device_idx": lambda: current[0], "set_device_index": set_device,
                   "set_device_idx": set_device, "synchronize": lambda device=None: live.sync(),
                   "current_stream": lambda device=None: FakeStream(), "set_stream": none,
                   "empty_cache": lambda: live.empty_cache(), "memory_allocated": memory_allocated,
                   "max_memory_allocated": max_memory_allocated, "memory_reserved": memory_reserved,
                   "max_memory_reserved": max_memory_reserved, "memory_stats": lambda device=None: live.stats(),
                   "reset_peak_memory_stats": lambda device=None: live.reset_peaks(),
                   "get_memory_info": mem_get_info,
                   "get_device_capability": lambda device=None: {"major": facts.major, "minor": facts.minor}}
        for attr, value in generic.items():
            if hasattr(acc, attr):
                patch(acc, attr, value)
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            if value is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)


_MISSING = object()
