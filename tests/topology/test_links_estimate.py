"""Nominal bandwidths by generation and kind; group links; the alpha-beta collective estimate."""

import pytest

from labkit.core.collectives import alpha_beta_time
from labkit.core.errors import LabkitError
from labkit.topology import (collective_time, generation_for, link_kind, link_label, load_sample, nominal_bandwidth,
                             parse_label, parse_smi_text, ring_bottleneck, weakest_link)
from labkit.topology.group_links import ALPHA_NVLINK_S, ALPHA_PCIE_S
from labkit.topology.links import pcie_bps


def test_labels():
    assert parse_label("NV12") == ("NVLINK", 12)
    assert parse_label("soc") == ("SYS", 0)
    for bad in ("NV0", "NVX", "QPI", ""):
        with pytest.raises(LabkitError):
            parse_label(bad)


def test_pcie_figures_follow_128b130b_encoding():
    # lanes x GT/s x 128/130 / 8 bits
    assert pcie_bps(3) == pytest.approx(15.754e9, rel=1e-3)
    assert pcie_bps(4) == pytest.approx(2 * pcie_bps(3))
    assert pcie_bps(5, 8) == pytest.approx(pcie_bps(4))
    with pytest.raises(LabkitError):
        pcie_bps(9)


def test_generations():
    assert generation_for("NVIDIA H200").nvlink == 4 and generation_for("NVIDIA H200").pcie_gen == 5
    assert generation_for("Tesla V100-SXM2-16GB").nvlink == 2
    assert generation_for("NVIDIA A100-SXM4-80GB").nvlink == 3
    assert generation_for("NVIDIA GeForce RTX 4090").nvlink is None
    assert generation_for("NVIDIA RTX 6000 Ada Generation").pcie_gen == 4
    assert generation_for("Some Future GPU") is None


def test_nominal_bandwidth_per_sample():
    h100 = load_sample("h100_nv18_8gpu_dual_numa")
    assert nominal_bandwidth(h100, 0, 7) == 18 * 25e9 == 450e9  # 900 GB/s both ways
    dgx1 = load_sample("dgx1_v100_hybrid_cube_mesh_4nic")
    assert nominal_bandwidth(dgx1, 0, 1) == 25e9 and nominal_bandwidth(dgx1, 0, 3) == 50e9
    assert nominal_bandwidth(dgx1, 0, 5) == pytest.approx(pcie_bps(3))
    a100 = load_sample("a100_pcie_8gpu_nv12_bridge_pairs_dual_socket")
    assert link_label(a100, 0, 1) == "NV12" and link_kind(a100, 0, 2) == "NODE"
    assert nominal_bandwidth(a100, 0, 1) == 300e9 and nominal_bandwidth(a100, 0, 4) == pytest.approx(pcie_bps(4))
    # Override of the GPU model changes the table.
    assert nominal_bandwidth(load_sample("h100_nv18_8gpu_dual_numa", gpu_name="B200"), 0, 1) == 18 * 50e9
    with pytest.raises(LabkitError, match="no GPU 8"):
        nominal_bandwidth(h100, 0, 8)


def test_weakest_link_vs_ring_bottleneck_on_the_hybrid_cube_mesh():
    t = load_sample("dgx1_v100_hybrid_cube_mesh_4nic")
    all8 = list(range(8))
    assert weakest_link(t, all8).link.kind == "SYS"
    # A ring over doubled NVLinks alone exists through all 8 GPUs: 0-3-2-1-5-6-7-4-0 (all NV2).
    ring = [0, 3, 2, 1, 5, 6, 7, 4]
    assert all(link_label(t, ring[k], ring[(k + 1) % 8]) == "NV2" for k in range(8))
    assert ring_bottleneck(t, all8).link.label == "NV2"
    assert ring_bottleneck(t, [0, 1, 2, 3]).link.kind == "NVLINK"
    assert ring_bottleneck(t, [0, 5]).link.label == "SYS"
    assert weakest_link(t, [3]) is None and ring_bottleneck(t, [3]) is None
    with pytest.raises(LabkitError, match="twice"):
        weakest_link(t, [1, 1])


def test_ring_bottleneck_uses_best_ring_not_worst_pair():
    # 4 GPUs: a ring 0-1-2-3-0 on NVLink, the diagonals 0-2 and 1-3 over SYS.
    text = """\
        GPU0    GPU1    GPU2    GPU3
GPU0     X      NV2     SYS     NV2
GPU1    NV2      X      NV2     SYS
GPU2    SYS     NV2      X      NV2
GPU3    NV2     SYS     NV2      X
"""
    t = parse_smi_text(text, "ring", gpu_name="A100")
    assert weakest_link(t, [0, 1, 2, 3]).label == "SYS"
    assert ring_bottleneck(t, [0, 1, 2, 3]).label == "NV2"
    # 7 and 8 GPUs go through the bitmask search: a ring 0..n-1 on NV1, everything else SYS.
    for n in (7, 8):
        rows = [["X" if i == j else ("NV1" if (i - j) % n in (1, n - 1) else "SYS") for j in range(n)] for i in range(n)]
        head = "        " + "  ".join(f"GPU{i}" for i in range(n))
        txt = head + "\n" + "\n".join(f"GPU{i}  " + "  ".join(r) for i, r in enumerate(rows)) + "\n"
        t = parse_smi_text(txt, "ring", gpu_name="V100")  # NV1 25 GB/s > PCIe Gen3 15.75 GB/s
        assert ring_bottleneck(t, list(range(n))).label == "NV1"
        assert ring_bottleneck(t, [0, 2, 4]).label == "SYS"


def test_collective_time_is_alpha_beta_over_the_bottleneck():
    t = load_sample("a100_pcie_8gpu_nv12_bridge_pairs_dual_socket")
    e = collective_time(t, [0, 1], "all_reduce", 2**30)
    assert e.time_s == pytest.approx(alpha_beta_time("all_reduce", 2**30, 2, 300e9, ALPHA_NVLINK_S))
    e4 = collective_time(t, [0, 1, 2, 3], "all_reduce", 2**30)
    assert e4.bottleneck.label == "NODE" and e4.alpha_s == ALPHA_PCIE_S
    assert e4.time_s == pytest.approx(2 * 3 * ALPHA_PCIE_S + 2**30 * 1.5 / pcie_bps(4))
    ag = collective_time(t, [0, 1, 2, 3], "all_gather", 2**30)
    assert ag.time_s < e4.time_s and ag.busbw_factor == 0.75
    assert collective_time(t, [5], "all_reduce", 2**30).time_s == 0.0
    with pytest.raises(LabkitError):
        collective_time(t, [0, 1], "all_reduce", -1)
    with pytest.raises(LabkitError, match="unknown collective"):
        collective_time(t, [0, 1], "allreduce", 10)
