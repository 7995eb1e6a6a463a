"""Step time on the target GPU, op by op, from a fake-mode run of the real model.

Every ATen op the tracer sees is priced by rules, with hardware constants measured on the GPU
(``benchmarks/gpu/record_matmul.py``), not fitted to any training step:

* GPU time of an op that runs a kernel: the larger of its FLOPs over the measured matmul rate for
  its dtype at that size (FLOPs from ``torch.utils.flop_counter``'s formulas: matmuls, convolutions,
  attention) and its bytes (inputs read once, outputs written once) over the measured copy bandwidth;
* host time of every op: the measured cost of launching one small kernel from eager PyTorch;
* the two timelines: the host issues op i after op i-1; the GPU runs it once it is issued and the
  previous kernel is done. The step ends when the last kernel does (the plain loop's only sync).

Views, allocations and queries (ops that return no tensor) run no kernel. What this leaves out, and is said: kernel fusion inside
fused ops beyond what their single ATen call implies, cuBLAS choosing slower tiles at odd shapes,
and Python work outside ATen ops (module hooks, the loss's Python code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from labkit.advise.steptime import dtype_of_torch, hardware, matmul_rate_flops

_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
              "alias", "_unsafe_view", "set_", "resize_", "_local_scalar_dense", "_to_copy_meta", "sym_size",
              "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type"}


@dataclass
class OpTimes:
    ops: int = 0
    kernels: int = 0
    gpu_s: float = 0.0
    host_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0


@dataclass
class Roofline:
    """An observer for ``measure_step(observers=...)``: prices each op of the last step (a step
    begins where the phase turns back to forward; the timelines start again there)."""

    per_phase: dict[str, OpTimes] = field(default_factory=dict)
    _gpu_free: float = 0.0
    _host: float = 0.0
    _last_phase: str | None = None

    def __post_init__(self) -> None:
        hw = hardware()
        self.bandwidth_Bps = hw.bandwidth_Bps
        self.launch_s = hw.launch_s
        self.source = hw.source

    def __call__(self, func, args, kwargs, out, phase: str) -> None:
        if phase == "forward" and self._last_phase not in (None, "forward"):
            self.per_phase.clear()
            self._gpu_free = self._host = 0.0
        self._last_phase = phase
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        t = self.per_phase.setdefault(phase, OpTimes())
        t.ops += 1
        self._host += self.launch_s
        t.host_s += self.launch_s
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        if getattr(func, "is_view", False) or name in _NO_KERNEL or not outs:
            return  # views, allocations and queries (an op that returns no tensor) launch no kernel
        flops = 0.0
        from torch.utils.flop_counter import flop_registry

        packet = getattr(func, "overloadpacket", None)
        if packet in flop_registry:
            try:
                flops = float(flop_registry[packet](*args, **(kwargs or {}), out_val=out))
            except Exception:  # a formula that cannot read this call's arguments: count bytes only
                flops = 0.0
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        nbytes = float(sum(x.numel() * x.element_size() for x in tensors + outs))
        dt = next((x.dtype for x in tensors if x.is_floating_point()), torch.float32)
        compute = flops / matmul_rate_flops(dtype_of_torch(dt), flops) if flops else 0.0
        gpu = max(compute, nbytes / self.bandwidth_Bps)
        start = max(self._gpu_free, self._host)
        self._gpu_free = start + gpu
        t.kernels += 1
        t.gpu_s += gpu
        t.flops += flops
        t.bytes += nbytes

    @property
    def step_s(self) -> float:
        """The priced step: when the last kernel of the last step ends."""
        return max(self._gpu_free, self._host)

    @property
    def gpu_busy_s(self) -> float:
        return sum(t.gpu_s for t in self.per_phase.values())

    def describe(self) -> dict:
        return {"step_s": self.step_s, "gpu_busy_s": self.gpu_busy_s,
                "kernels": sum(t.kernels for t in self.per_phase.values()),
                "flops": sum(t.flops for t in self.per_phase.values()),
                "bytes": sum(t.bytes for t in self.per_phase.values()),
                "per_phase": {k: vars(v) for k, v in self.per_phase.items()}, "source": self.source}
