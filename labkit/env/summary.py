"""Human-readable views of a :class:`MachineInfo`, and the recorded GPU server sample."""

from __future__ import annotations

from pathlib import Path

from labkit.core.machine import GPUInfo, MachineInfo
from labkit.core.paths import MEASUREMENTS_DIR
from labkit.core.provenance import load_measurement
from labkit.core.units import fmt_bytes

RECORDED_ENV = MEASUREMENTS_DIR / "env" / "h200_env.json"


def machine_rows(m: MachineInfo) -> list[tuple[str, str]]:
    """(field, value) rows describing the machine, for a table."""
    rows = [
        ("host", m.hostname),
        ("OS", m.os),
        ("CPU", f"{m.cpu_model} ({m.cpu_physical_cores or '?'} cores / {m.cpu_logical_cores} threads)"),
        ("NUMA nodes", str(m.numa_nodes)),
        ("RAM", fmt_bytes(m.ram_bytes) if m.ram_bytes else "unknown"),
        ("python", m.python),
        ("torch", f"{m.torch_version} (CUDA {m.cuda_version or 'none'})"),
        ("NCCL", m.nccl_version or "n/a"),
        ("driver", m.driver_version or "n/a"),
        ("NVML", m.nvml),
        ("GPUs", str(len(m.gpus))),
    ]
    for g in m.gpus:
        rows.append((f"GPU{g.index}", gpu_line(g)))
    return rows


def gpu_line(g: GPUInfo) -> str:
    free = f", {fmt_bytes(g.memory_free_bytes)} free" if g.memory_free_bytes is not None else ""
    pcie = f", PCIe Gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen else ""
    cc = f", sm_{g.compute_capability.replace('.', '')}" if g.compute_capability else ""
    numa = f", NUMA {g.numa_node}" if g.numa_node is not None else ""
    return f"{g.name}, {fmt_bytes(g.memory_total_bytes)}{free}{pcie}{cc}{numa}"


def load_recorded_machine(path: str | Path = RECORDED_ENV) -> tuple[MachineInfo, dict]:
    """The GPU server recorded under data/ (for machines without a GPU), with its provenance."""
    doc = load_measurement(path, kind="env")
    d = dict(doc["data"])
    d["gpus"] = [GPUInfo(**g) for g in d["gpus"]]
    return MachineInfo(**d), doc["provenance"]
