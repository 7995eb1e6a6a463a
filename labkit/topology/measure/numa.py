"""Where CPUs and GPUs sit: NUMA nodes and their CPUs from sysfs, a GPU's NUMA node from its PCI bus id."""

from __future__ import annotations

from pathlib import Path

from labkit.core.machine import pci_numa_node

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

NODE_DIR = Path("/sys/devices/system/node")


def numa_nodes_with_cpus(node_dir: Path = NODE_DIR) -> dict[int, list[int]]:
    """NUMA node -> its CPUs, for nodes that have CPUs (memory-only nodes are left out)."""
    out = {}
    for d in sorted(node_dir.glob("node[0-9]*")):
        try:
            text = (d / "cpulist").read_text().strip()
            cpus = expand_cpulist(text)
        except (OSError, ValueError):
            continue
        if cpus:
            out[int(d.name[4:])] = cpus
    return out


def expand_cpulist(text: str) -> list[int]:
    """A kernel cpulist (``"0-3,8,10-11"``) as CPU numbers; ValueError on anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def gpu_numa_node(gpu: int) -> int | None:
    """The NUMA node of torch's GPU ``gpu``: its PCI bus id (torch, else NVML at the same index, which
    matches when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) looked up in sysfs."""
    try:
        import torch

        p = torch.cuda.get_device_properties(gpu)
        bus = getattr(p, "pci_bus_id", None)
        if bus is not None:
            return pci_numa_node(f"{getattr(p, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(p, 'pci_device_id', 0):02x}.0")
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            b = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).busId
            return pci_numa_node(b.decode() if isinstance(b, bytes) else str(b))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
