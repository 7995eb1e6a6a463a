"""Live discovery logic, exercised on CI through a stand-in for the pynvml module (the real NVML
path runs on the GPU machine in benchmarks/gpu/record_topology.py)."""

import sys
import types

import pytest

from labkit.topology import live


class NVMLError(Exception):
    pass


def fake_pynvml(n, nvlink, ancestor, remote_type=None, p2p_ok=True, pcie=(5, 16)):
    """nvlink(i, link) -> ("peer", j) | ("switch", None) | None (link down) | "unsupported" | "end"."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 18
    m.NVML_P2P_CAPS_INDEX_READ = 0
    m.NVML_P2P_STATUS_OK = 0
    bus = lambda i: f"00000000:{0x10 + i:02X}:00.0"  # noqa: E731
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus(h).encode())
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 * 10**9)
    m.nvmlDeviceGetCpuAffinity = lambda h, words: [0xFF if h < n // 2 or n == 1 else 0xFF00] + [0] * (words - 1)

    def state(h, link):
        v = nvlink(h, link)
        if v == "unsupported":
            raise NVMLError("Not Supported")
        if v == "end":
            raise NVMLError("Invalid Argument")
        return 1 if v else 0

    def remote_type(h, link):
        return 2 if nvlink(h, link)[0] == "switch" else 0

    def remote_pci(h, link):
        return types.SimpleNamespace(busId=bus(nvlink(h, link)[1]))

    m.nvmlDeviceGetNvLinkState = state
    m.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type
    m.nvmlDeviceGetNvLinkRemotePciInfo_v2 = remote_pci
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: ancestor(a, b)
    m.nvmlDeviceGetP2PStatus = lambda a, b, idx: 0 if p2p_ok else 2
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: pcie[0]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: pcie[1]
    return m


def use(monkeypatch, mod, smi_text=None):
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    monkeypatch.setattr(live, "smi_topo_text", lambda timeout=30: (smi_text, "ok") if smi_text else (None, "not on PATH"))


def test_nvswitch_system(monkeypatch):
    nv = lambda h, link: ("switch", None) if link < 18 else "end"  # noqa: E731
    use(monkeypatch, fake_pynvml(4, nv, lambda a, b: 50))
    t = live.nvml_topology()
    assert t.matrix[0] == ["X", "NV18", "NV18", "NV18"]
    assert t.gpus[0].cpu_affinity == "0-7" and t.gpus[3].cpu_affinity == "8-15"
    assert t.link(0, 1).bandwidth_Bps == 450e9 and t.p2p[0][1] is True
    assert t.source == "live (NVML)"


def test_direct_nvlink_pairs_and_pcie_ancestors(monkeypatch):
    # GPU0-GPU1 joined by 4 links; 2-3 by 4 links; others via PCIe: same switch (10) or across sockets (50).
    def nv(h, link):
        if link >= 4:
            return "end"
        return ("peer", h ^ 1)
    anc = lambda a, b: 10 if a // 2 == b // 2 else 50  # noqa: E731
    use(monkeypatch, fake_pynvml(4, nv, anc, p2p_ok=False))
    t = live.nvml_topology()
    assert t.matrix[0] == ["X", "NV4", "SYS", "SYS"] and t.matrix[2][3] == "NV4"
    assert t.p2p[0][2] is False


def test_nvlink_not_supported_falls_back_to_smi_labels(monkeypatch):
    smi = ("        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
           "GPU0     X      NV18    0-7     0\nGPU1    NV18     X      0-7     0\n")
    use(monkeypatch, fake_pynvml(2, lambda h, link: "unsupported", lambda a, b: 40), smi)
    t = live.nvml_topology()
    assert t.matrix[0][1] == "NV18"
    assert any("Not Supported" in w and "nvidia-smi" in w for w in t.warnings)


def test_unreadable_smi_text_is_a_warning_not_a_failure(monkeypatch):
    use(monkeypatch, fake_pynvml(2, lambda h, link: "unsupported", lambda a, b: 40), "garbage\n")
    t = live.nvml_topology()
    assert t.matrix[0][1] == "NODE"
    assert any("could not be read" in w for w in t.warnings)


def test_single_h200_like_the_recorded_one(monkeypatch):
    from labkit.core.paths import TOPOLOGIES_DIR
    with open(TOPOLOGIES_DIR / "h200_1gpu_live_ansi.txt") as f:
        text = f.read()
    use(monkeypatch, fake_pynvml(1, lambda h, link: "unsupported", lambda a, b: 0), text)
    t = live.nvml_topology()
    assert t.n == 1 and t.matrix == [["X"]] and t.gpu_model == "NVIDIA H200"
    # sysfs does not know the GPU's NUMA node here; nvidia-smi's NUMA Affinity column does.
    assert t.gpus[0].numa == 0 and any("taken from nvidia-smi" in w for w in t.warnings)


def test_no_driver(monkeypatch):
    m = fake_pynvml(1, lambda h, link: "end", lambda a, b: 0)

    def fail():
        raise NVMLError("NVML Shared Library Not Found")
    m.nvmlInit = fail
    use(monkeypatch, m)
    from labkit.core.errors import LabkitError
    with pytest.raises(LabkitError, match="no NVIDIA driver"):
        live.nvml_topology()


def test_pcie_generation_from_nvml_overrides_the_model_table(monkeypatch):
    use(monkeypatch, fake_pynvml(2, lambda h, link: "end", lambda a, b: 10, pcie=(4, 16)))
    t = live.nvml_topology()
    from labkit.topology.links import pcie_bps
    assert t.generation.pcie_gen == 4 and t.link(0, 1).bandwidth_Bps == pytest.approx(pcie_bps(4))
    assert any("Gen4 x16" in w for w in t.warnings)
