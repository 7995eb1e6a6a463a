"""Notebook 00 (this server): the machine, its GPU memory in both units, the versions that must agree."""

from __future__ import annotations

from labkit.core.machine import MachineInfo, probe
from labkit.core.units import GB, GiB, fmt_bytes
from labkit.env.server import ServerView, this_server
from labkit.env.summary import machine_rows
from labkit.viz.env import gpu_memory_figure, memory_rows, units_explorer
from labkit.viz.section import Section

__all__ = ["this_server", "machine", "gpu_memory", "units", "versions"]


def machine(view: ServerView, here: MachineInfo | None = None) -> Section:
    """The machine in one table: this one when it has a GPU, else the recorded GPU server (said so)."""
    here = view.machine if view.live else (here or probe())
    sec = Section("The machine in one table", source=view.label)
    sec.claim(f"NVIDIA GPUs on this machine ({here.hostname}, torch {here.torch_version}, "
              f"CUDA build {here.cuda_version or 'none'})", len(here.gpus), "GPU(s)", source="measured here",
              # a key result where no GPU is shown (a GPU server records gpu_count below): a GPU gone is a regression
              name=None if view.live else "gpus_here", direction="higher", tolerance=0.0)
    sec.claim("The server shown below", "this machine" if view.live else "the recorded GPU server")
    sec.table(["field", "value"], machine_rows(view.machine), caption=f"Source: {view.origin}")
    for w in view.machine.warnings:
        sec.note(f"Warning: {w}")
    for n in (here.notes if view.live else []):
        sec.note(n)
    if not here.gpus:
        sec.note(f"No NVIDIA GPU here ({here.nvml}): the GPU figures below are the recorded server's, "
                 "not this machine's.")
    return sec


def gpu_memory(view: ServerView) -> Section:
    """Memory per GPU as NVML reports it, in binary and decimal units; the wording is computed from the number."""
    m = view.machine
    sec = Section("Memory per GPU: NVML's total, in GiB and in GB", source=view.label)
    # a key result only when measured here: a recorded server's count cannot change from one run to the next
    sec.claim("GPUs in the server shown", len(m.gpus), "GPU(s)", name="gpu_count", source=view.origin,
              direction="higher" if view.live else None, tolerance=0.0 if view.live else None)
    if not m.gpus:
        return sec.note("This server has no GPU to show.")
    g = m.gpus[0]
    total = g.memory_total_bytes
    sec.claim(f"GPU0 ({g.name}) total memory as NVML reports it, binary units (1 GiB = 2^30 bytes)",
              round(total / GiB, 3), "GiB", name="gpu0_memory_total", digits=2, source=view.origin,
              direction="higher" if view.live else None, tolerance=0.001 if view.live else None)
    sec.claim("The same bytes in decimal units (1 GB = 10^9 bytes), as datasheets count", round(total / GB, 2), "GB",
              digits=2)
    sec.claim("How much larger the same memory reads in GB than in GiB", round((GiB / GB - 1) * 100, 1), "%", digits=1)
    used = [x for x in m.gpus if x.memory_free_bytes is not None]
    if used:
        held = max(x.memory_total_bytes - x.memory_free_bytes for x in used)
        sec.claim("Most memory already in use on one GPU (other processes, CUDA contexts)", fmt_bytes(held))

    sec.figure(gpu_memory_figure(m, view.label))
    return sec


def units(view: ServerView) -> Section:
    """The GiB/GB toggle (interactive in JupyterLab), with the decimal table as its static result."""
    sec = Section("Try it: units", source=view.label)
    sec.table(["GPU", "name", "total", "free"], memory_rows(view.machine, False),
              caption="Static result: decimal GB (10^9 bytes)")
    return sec.widget(units_explorer(view.machine, view.label))


def versions(view: ServerView) -> Section:
    """Driver, torch, CUDA and NCCL builds, compute capability, CPU and NUMA: what must agree."""
    m = view.machine
    caps = sorted({g.compute_capability for g in m.gpus if g.compute_capability})
    sec = Section("Versions that must agree", source=view.label)
    sec.claim("NVIDIA driver", m.driver_version or "none")
    sec.claim("torch, and the CUDA runtime it was built with", f"{m.torch_version}, CUDA {m.cuda_version or 'none'}")
    sec.claim("NCCL (comes with torch)", m.nccl_version or "n/a")
    sec.claim("Compute capability", ", ".join(caps) or "unknown")
    sec.claim(f"CPU: {m.cpu_model}; RAM {fmt_bytes(m.ram_bytes or 0)}; NUMA nodes", m.numa_nodes)
    return sec
