"""The facts fake mode's rules rest on, in data files beside this module, each with its source.

* ``h200.json``: the GPU fake mode reproduces by default (SM count, threads per SM, compute capability,
  the torch and cuDNN it ran, cuBLAS workspace size, allocator rounding, ...):
  :class:`~labkit.memory.trace.fake.fake_cuda.CudaTarget`'s and :class:`~labkit.memory.trace.fake.sdpa.SdpaTarget`'s
  defaults.
* ``sdpa_gates.json``: where PyTorch's SDPA backend selection changed with the torch and cuDNN versions
  and the GPU; :mod:`labkit.memory.trace.fake.sdpa` reads each gate by name.
* ``torch_gates.json``: where torch's own Python code changed what it allocates (``nn.init.trunc_normal_``);
  :mod:`labkit.memory.trace.fake.fake_runtime` reads each gate by name.

A new target is a new file of the same facts (``CudaTarget.from_facts(load_facts(path))``).
"""

from __future__ import annotations

from pathlib import Path

from labkit.core.facts import Facts, load_facts

HERE = Path(__file__).resolve().parent
H200: Facts = load_facts(HERE / "h200.json")
SDPA_GATES: Facts = load_facts(HERE / "sdpa_gates.json")
TORCH_GATES: Facts = load_facts(HERE / "torch_gates.json")

__all__ = ["H200", "HERE", "SDPA_GATES", "TORCH_GATES"]
