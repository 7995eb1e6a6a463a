"""What this machine is: GPUs through NVML, torch/CUDA versions, CPU, NUMA, RAM.

Every probe degrades gracefully: no GPU, no NVML or no torch is stated in ``notes``
and the rest is still filled in.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import labkit
from labkit.core.envvars import REDACTED, commit_id, secret_value, shown_environment

# torch (2.5 s to import: python -X importtime, 2-core machine) and pynvml are imported where the machine is
# probed: `labkit --help` imports this module.



@dataclass
class GPUInfo:
    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int | None = None
    bus_id: str | None = None
    uuid: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    compute_capability: str | None = None
    numa_node: int | None = None


@dataclass
class MachineInfo:
    hostname: str
    os: str
    python: str
    labkit_version: str
    git_commit: str | None
    torch_version: str | None
    cuda_version: str | None
    nccl_version: str | None
    cuda_available: bool
    driver_version: str | None
    nvml: str
    gpus: list[GPUInfo]
    cpu_model: str | None
    cpu_logical_cores: int
    cpu_physical_cores: int | None
    numa_nodes: int
    ram_bytes: int | None
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_name(self) -> str | None:
        return self.gpus[0].name if self.gpus else None


def redact_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that matter for GPUs and training, credentials redacted (:mod:`labkit.core.envvars`)."""
    return shown_environment(dict(os.environ if environ is None else environ))


def _git_commit() -> str | None:
    """The checkout's commit; LABKIT_GIT_COMMIT names it where the tree travels without .git."""
    if os.environ.get("LABKIT_GIT_COMMIT"):
        value = os.environ["LABKIT_GIT_COMMIT"]
        return value if commit_id("LABKIT_GIT_COMMIT", value) else REDACTED if secret_value(value) else value
    root = Path(labkit.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu() -> tuple[str | None, int | None]:
    model, cores = None, set()
    phys = core = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if key == "model name" and model is None:
                model = val
            elif key == "physical id":
                phys = val
            elif key == "core id":
                core = val
                cores.add((phys, core))
    except OSError:
        pass
    return model or platform.processor() or None, (len(cores) or None)


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _numa_nodes() -> int:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return max(1, len(nodes))


def pci_numa_node(bus_id: str | None) -> int | None:
    """NUMA node of a PCI device from sysfs (-1 or missing means unknown)."""
    if not bus_id:
        return None
    bus = bus_id.lower()
    # NVML prints 8 hex digits of domain ("00000000:19:00.0"); sysfs uses 4.
    if re.match(r"^[0-9a-f]{8}:", bus):
        bus = bus[4:]
    try:
        node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _nvml_gpus(notes: list[str]) -> tuple[list[GPUInfo], str, str | None]:
    try:
        import pynvml
    except ImportError:
        notes.append("pynvml (package nvidia-ml-py) is not installed: no NVML data")
        return [], "not installed", None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        notes.append(f"NVML unavailable ({exc}): no NVIDIA driver on this machine, so no GPU data")
        return [], f"unavailable: {exc}", None
    gpus: list[GPUInfo] = []
    try:
        driver = _s(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            bus = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
            g = GPUInfo(index=i, name=_s(pynvml.nvmlDeviceGetName(h)), memory_total_bytes=int(mem.total),
                        memory_free_bytes=int(mem.free), bus_id=bus, numa_node=pci_numa_node(bus))
            for attr, fn in (("uuid", "nvmlDeviceGetUUID"), ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                             ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"), ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                             ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
                try:
                    v = getattr(pynvml, fn)(h)
                    setattr(g, attr, _s(v) if isinstance(v, (bytes, str)) else int(v))
                except Exception:
                    pass
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                g.compute_capability = f"{major}.{minor}"
            except Exception:
                pass
            gpus.append(g)
    finally:
        pynvml.nvmlShutdown()
    return gpus, "ok", driver


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _torch_info(notes: list[str]) -> tuple[str | None, str | None, str | None, bool]:
    try:
        import torch
    except ImportError:
        notes.append("torch is not installed")
        return None, None, None, False
    nccl = None
    try:
        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
    avail = bool(torch.cuda.is_available())
    if not avail:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        notes.append(f"torch {torch.__version__} ({build}) sees no CUDA GPU: GPU measurements are skipped here")
    return torch.__version__, torch.version.cuda, nccl, avail


def probe() -> MachineInfo:
    """Describe this machine. Never raises for a missing GPU, driver or library."""
    notes: list[str] = []
    warnings: list[str] = []
    gpus, nvml_status, driver = _nvml_gpus(notes)
    torch_version, cuda_version, nccl, cuda_ok = _torch_info(notes)
    if cuda_ok and gpus:
        import torch

        for g in gpus:
            if g.index < torch.cuda.device_count() and g.compute_capability is None:
                major, minor = torch.cuda.get_device_capability(g.index)
                g.compute_capability = f"{major}.{minor}"
    totals = {g.memory_total_bytes for g in gpus}
    if len(totals) > 1:
        warnings.append("GPUs differ in memory (" + ", ".join(f"GPU{g.index} {g.memory_total_bytes / 2**30:.1f} GiB" for g in gpus)
                        + "): the smallest one bounds every data-parallel replica")
    model, phys = _cpu()
    return MachineInfo(
        hostname=socket.gethostname(), os=f"{platform.system()} {platform.release()}", python=platform.python_version(),
        labkit_version=labkit.__version__, git_commit=_git_commit(), torch_version=torch_version,
        cuda_version=cuda_version, nccl_version=nccl, cuda_available=cuda_ok, driver_version=driver,
        nvml=nvml_status, gpus=gpus, cpu_model=model, cpu_logical_cores=os.cpu_count() or 1,
        cpu_physical_cores=phys, numa_nodes=_numa_nodes(), ram_bytes=_ram_bytes(), env=redact_env(),
        warnings=warnings, notes=notes,
    )
