"""This server's topology, live: NVML first (NVLink state and peers, PCIe common ancestor, P2P
status), ``nvidia-smi topo -m`` to fill what NVML does not answer.

NVML calls (``pynvml`` from the ``nvidia-ml-py`` package): ``nvmlDeviceGetNvLinkState`` per link up to
``NVML_NVLINK_MAX_LINKS`` (raises NotSupported where the driver cannot tell, as on some H200 systems),
``nvmlDeviceGetNvLinkRemotePciInfo_v2`` (the peer's bus id; behind an NVSwitch the peer is the switch,
``nvmlDeviceGetNvLinkRemoteDeviceType``), ``nvmlDeviceGetTopologyCommonAncestor`` (PCIe only:
INTERNAL 0, SINGLE 10 ~ PIX, MULTIPLE 20 ~ PXB, HOSTBRIDGE 30 ~ PHB, NODE 40, SYSTEM 50),
``nvmlDeviceGetP2PStatus`` and ``nvmlDeviceGetCpuAffinity``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from labkit.core.errors import LabkitError
from labkit.core.machine import pci_numa_node
from labkit.topology.model import GPU, Topology, build
from labkit.topology.ncclxml import cpulist
from labkit.topology.smi import parse_smi_text

_ANCESTOR = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVSWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def smi_topo_text(timeout: float = 30) -> tuple[str | None, str]:
    """Run ``nvidia-smi topo -m``: (text or None, why not)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi is not on PATH"
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi topo -m failed: {exc}"
    if r.returncode != 0:
        return None, f"nvidia-smi topo -m exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
    return r.stdout, "ok"


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _norm_bus(bus: str) -> str:
    bus = bus.lower()
    # NVML prints an 8-digit domain ("00000000:19:00.0"); compare on the last 12 characters.
    return bus[-12:]


def nvml_topology(use_smi: bool = True) -> Topology:
    """Discover this server's GPUs and links. Raises LabkitError when there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        raise LabkitError("live topology needs pynvml (package nvidia-ml-py); use --sample or --file") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise LabkitError(f"live topology: NVML unavailable ({exc}): no NVIDIA driver here; use --sample NAME or --file PATH") from None

    warnings: list[str] = []
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            raise LabkitError("live topology: NVML reports no GPUs")
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        gpus: list[GPU] = []
        buses: list[str] = []
        pcie: list[tuple[int, int] | None] = []
        ncpu = os.cpu_count() or 64
        for i, h in enumerate(hs):
            bus = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
            buses.append(_norm_bus(bus))
            aff = None
            try:
                words = pynvml.nvmlDeviceGetCpuAffinity(h, (ncpu + 63) // 64)
                cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
                aff = cpulist(cpus)
            except Exception as exc:
                warnings.append(f"GPU{i}: CPU affinity unavailable ({exc})")
            try:  # the most this GPU and this slot can do (the current link may downshift when idle)
                pcie.append((int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)), int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))))
            except Exception:
                pcie.append(None)
            gpus.append(GPU(index=i, name=_s(pynvml.nvmlDeviceGetName(h)),
                            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total), bus_id=bus,
                            numa=pci_numa_node(bus), cpu_affinity=aff))
        # NVLink: links per peer GPU, links to an NVSwitch, and whether NVML could tell at all.
        direct = [[0] * n for _ in range(n)]
        to_switch = [0] * n
        known = [True] * n
        max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
        for i, h in enumerate(hs):
            answered = False
            for link in range(max_links):
                try:
                    state = pynvml.nvmlDeviceGetNvLinkState(h, link)
                except pynvml.NVMLError as exc:
                    if link == 0 and "Not Supported" in str(exc):
                        known[i] = False
                    break
                answered = True
                if state != pynvml.NVML_FEATURE_ENABLED:
                    continue
                try:
                    rtype = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
                except Exception:
                    rtype = None
                if rtype == _NVSWITCH:
                    to_switch[i] += 1
                    continue
                try:
                    fn = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or pynvml.nvmlDeviceGetNvLinkRemotePciInfo
                    peer = _norm_bus(_s(fn(h, link).busId))
                except Exception:
                    continue
                if peer in buses:
                    direct[i][buses.index(peer)] += 1
                else:
                    to_switch[i] += 1  # a peer that is not a GPU here: an NVSwitch on older drivers
            known[i] = known[i] and answered
        matrix = [["X"] * n for _ in range(n)]
        p2p: list[list[bool | None]] = [[True if i == j else None for j in range(n)] for i in range(n)]
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                if direct[i][j]:
                    matrix[i][j] = f"NV{direct[i][j]}"
                elif to_switch[i] and to_switch[j]:
                    matrix[i][j] = f"NV{min(to_switch[i], to_switch[j])}"
                else:
                    try:
                        anc = pynvml.nvmlDeviceGetTopologyCommonAncestor(hs[i], hs[j])
                        matrix[i][j] = _ANCESTOR.get(int(anc), "SYS")
                    except Exception as exc:
                        raise LabkitError(f"live topology: NVML cannot tell the PCIe path GPU{i} -> GPU{j} ({exc})") from None
                try:
                    st = pynvml.nvmlDeviceGetP2PStatus(hs[i], hs[j], pynvml.NVML_P2P_CAPS_INDEX_READ)
                    p2p[i][j] = st == pynvml.NVML_P2P_STATUS_OK
                except Exception:
                    p2p[i][j] = None
    finally:
        pynvml.nvmlShutdown()

    text = None
    if use_smi:
        text, why = smi_topo_text()
        if text is None:
            warnings.append(f"nvidia-smi topo -m not available ({why})")
    smi = None
    if text is not None:
        try:
            smi = parse_smi_text(text, "nvidia-smi topo -m (live)")
        except LabkitError as exc:
            warnings.append(f"nvidia-smi topo -m could not be read ({exc})")
    if smi is not None and smi.n == n:
        # sysfs may not know a GPU's NUMA node (a VM reports -1); nvidia-smi's NUMA Affinity column may.
        filled = []
        for g, sg in zip(gpus, smi.gpus):
            if g.numa is None and sg.numa is not None:
                g.numa = sg.numa
                filled.append(g.index)
            if g.cpu_affinity is None and sg.cpu_affinity:
                g.cpu_affinity = sg.cpu_affinity
        if filled:
            warnings.append(f"NUMA node of GPU(s) {filled} not in sysfs: taken from nvidia-smi topo -m")
    if not all(known):
        unknown = [i for i in range(n) if not known[i]]
        if text is not None:
            if smi is None:
                warnings.append(f"NVML could not report NVLink for GPU(s) {unknown}: labels are PCIe paths only")
            elif n == 1:
                pass  # no pairs: nothing NVLink could add
            elif smi.n == n:
                for i in range(n):
                    for j in range(n):
                        if (i in unknown or j in unknown) and smi.matrix[i][j].startswith("NV"):
                            matrix[i][j] = smi.matrix[i][j]
                warnings.append(f"NVML answered 'Not Supported' for the NVLink state of GPU(s) {unknown}: "
                                f"NVLink labels taken from nvidia-smi topo -m")
            else:
                warnings.append(f"NVML could not report NVLink for GPU(s) {unknown} and nvidia-smi lists {smi.n} GPUs, not {n}: "
                                f"labels are PCIe paths only")
        elif n > 1:
            warnings.append(f"NVML could not report NVLink for GPU(s) {unknown}: labels are PCIe paths only")
    for i in range(n):
        for j in range(i + 1, n):
            if matrix[i][j] != matrix[j][i]:
                warnings.append(f"NVML gave GPU{i}->GPU{j} {matrix[i][j]} but GPU{j}->GPU{i} {matrix[j][i]}: kept the weaker")
                weaker = max(matrix[i][j], matrix[j][i], key=lambda lab: (not lab.startswith("NV"), -int(lab[2:]) if lab.startswith("NV") else 0))
                matrix[i][j] = matrix[j][i] = weaker
    topo = build("live (NVML)", gpus, matrix, warnings=warnings, p2p=p2p, raw_text=text)
    if pcie and all(pcie) and len(set(pcie)) == 1:
        gen, width = pcie[0]
        if (gen, width) != (topo.generation.pcie_gen, topo.generation.pcie_width) and gen in (3, 4, 5):
            topo.warnings.append(f"NVML: the PCIe link can reach Gen{gen} x{width} here (the GPU model's table says "
                                 f"Gen{topo.generation.pcie_gen} x{topo.generation.pcie_width}): nominal PCIe figures use Gen{gen} x{width}")
            topo.generation = dataclasses.replace(topo.generation, pcie_gen=gen, pcie_width=width)
            topo.__post_init__()
    return topo
