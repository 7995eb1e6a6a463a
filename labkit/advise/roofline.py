"""Step time on the target GPU, op by op, from a fake-mode run of the real model.

Every ATen op the tracer sees is priced by :class:`labkit.advise.op_price.OpPricer` (rules from what
PyTorch's CUDA build runs for it, with kernel times and host costs microbenchmarked on the GPU by
``benchmarks/gpu/record_kernels.py``; the kernel times fitted to no training step, the host costs
scaled once to whole steps issued on the GPU's host, :mod:`labkit.advise.host_calibration`), then
placed on two timelines:

* the host issues op i after op i-1, paying the op's host cost;
* the GPU runs op i's kernels once they are issued and the previous kernel is done;
* used as a context manager, each ``nn.Module.__call__`` adds its recorded host cost too;
* a synchronising op (``.item()``, ``nonzero``, a per-group grouped-GEMM fallback, a host copy)
  makes the host wait until the GPU has finished everything issued so far.

The step ends when the last kernel does (the plain loop's only sync). What this leaves out, and is
said: Python work outside ATen ops and module calls (the model's own Python code, the optimizer's
Python loop) except as the host scale's average, cuBLAS heuristics at shapes between the recorded grid points, kernels whose time depends
on data (embedding backward's sort, expert routing: the tokens are split evenly), and overlap of
kernels on several streams (the plain loop uses one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.nn.modules.module import register_module_forward_pre_hook

from labkit.advise.kernel_table import KernelTable, recorded_table
from labkit.advise.op_price import OpPricer


@dataclass
class OpTimes:
    ops: int = 0
    kernels: int = 0
    syncs: int = 0
    gpu_s: float = 0.0
    host_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)   # kind -> GPU seconds


@dataclass
class Roofline:
    """An observer for ``measure_step(observers=...)``: prices each op of the last step (a step
    begins where the phase turns back to forward; the timelines start again there)."""

    table: KernelTable | None = None
    per_phase: dict[str, OpTimes] = field(default_factory=dict)
    _gpu_free: float = 0.0
    _host: float = 0.0
    _last_phase: str | None = None

    def __post_init__(self) -> None:
        self.table = self.table or recorded_table()
        self.pricer = OpPricer(self.table)
        self.source = self.table.source

    def __enter__(self) -> "Roofline":
        """Also charge each ``nn.Module.__call__`` its recorded host cost (a global forward pre-hook,
        removed on exit): eager PyTorch pays it per module call, outside any ATen op."""
        cost = self.table.host.get("module_call_nop_s", 0.0)

        def on_call(module, inputs) -> None:
            self._host += cost
            self.per_phase.setdefault(self._last_phase or "forward", OpTimes()).host_s += cost

        self._hook = register_module_forward_pre_hook(on_call)
        return self

    def __exit__(self, *exc) -> None:
        self._hook.remove()

    def __call__(self, func, args, kwargs, out, phase: str) -> None:
        if phase == "forward" and self._last_phase not in (None, "forward"):
            self.per_phase.clear()
            self._gpu_free = self._host = 0.0
        self._last_phase = phase
        p = self.pricer.price(func, args, kwargs or {}, out, phase)
        t = self.per_phase.setdefault(phase, OpTimes())
        t.ops += 1
        self._host += p.host_s
        t.host_s += p.host_s
        if p.kernels:
            start = max(self._gpu_free, self._host)
            self._gpu_free = start + p.gpu_s
            t.kernels += p.kernels
            t.gpu_s += p.gpu_s
            t.flops += p.flops
            t.bytes += p.bytes
            t.by_kind[p.kind] = t.by_kind.get(p.kind, 0.0) + p.gpu_s
        if p.sync:
            t.syncs += 1
            self._host = max(self._host, self._gpu_free)

    @property
    def step_s(self) -> float:
        """The priced step: when the last kernel of the last step ends."""
        return max(self._gpu_free, self._host)

    @property
    def gpu_busy_s(self) -> float:
        return sum(t.gpu_s for t in self.per_phase.values())

    @property
    def host_s(self) -> float:
        return sum(t.host_s for t in self.per_phase.values())

    def describe(self) -> dict:
        kinds: dict[str, float] = {}
        for t in self.per_phase.values():
            for k, v in t.by_kind.items():
                kinds[k] = kinds.get(k, 0.0) + v
        return {"step_s": self.step_s, "gpu_busy_s": self.gpu_busy_s, "host_s": self.host_s,
                "kernels": sum(t.kernels for t in self.per_phase.values()),
                "syncs": sum(t.syncs for t in self.per_phase.values()),
                "flops": sum(t.flops for t in self.per_phase.values()),
                "bytes": sum(t.bytes for t in self.per_phase.values()),
                "gpu_by_kind": kinds,
                "per_phase": {k: vars(v) for k, v in self.per_phase.items()}, "source": self.source}
