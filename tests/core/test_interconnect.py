"""The nominal link figures live in labkit.core.interconnect, and every chapter that states one reads it."""

import ast
from pathlib import Path

import pytest

from labkit.core import interconnect as ic

PKG = Path(__file__).resolve().parents[2] / "labkit"


def test_nvlink4_node_is_18_links_of_25_GB_per_direction():
    assert ic.NVLINK_GENERATIONS[4].per_link_Bps == 25e9
    assert ic.NVLINK_PARTS["H200"].links == 18
    assert ic.NVLINK4_NODE_Bps == 450e9
    assert ic.NVLINK_PARTS["H800"].Bps == 200e9
    assert ic.NVLINK_PARTS["B200"].Bps == 900e9


@pytest.mark.parametrize("fact", [*ic.NVLINK_GENERATIONS.values(), *ic.NVLINK_PARTS.values()], ids=repr)
def test_every_nvlink_figure_names_its_document(fact):
    assert fact.document.startswith("NVIDIA")
    assert fact.url.startswith("https://") or fact is ic.NVLINK_PARTS["H800"]


def test_the_chapters_state_the_same_nvlink4_figure():
    from labkit.advise.cluster import resolve
    from labkit.advise.request import MachineSource
    from labkit.comm.nominal import nominal_nvlink
    from labkit.comm.simulate import LinkModel
    from labkit.memory.estimate.planner import h100_cluster, h200_cluster
    from labkit.topology import generation_for, link, load_sample

    assert generation_for("NVIDIA H200").nvlink_per_link_Bps * 18 == ic.NVLINK4_NODE_Bps
    assert nominal_nvlink("NVIDIA H200").GBps_per_direction * 1e9 == ic.NVLINK4_NODE_Bps
    assert LinkModel().intra_bw_GBps * 1e9 == ic.NVLINK4_NODE_Bps
    assert LinkModel().inter_bw_GBps * 1e9 == ic.NIC_400G_Bps
    for cl in (h200_cluster(8), h100_cluster(16)):
        assert cl.intra[8].bandwidth_Bps == ic.NVLINK4_NODE_Bps
        assert cl.intra[8].latency_s == ic.NCCL_RING_STEP_S["NVLINK"]
        assert cl.inter.bandwidth_Bps == ic.NIC_400G_Bps
    m = resolve(MachineSource(gpus=8, gpu_memory_bytes=141 * 10**9))
    assert m.cluster.intra[8].bandwidth_Bps == ic.NVLINK4_NODE_Bps
    topo = load_sample("h100_nv18_8gpu_dual_numa")
    assert link(topo, 0, 1).bandwidth_Bps == ic.NVLINK4_NODE_Bps


FIGURES = {450e9, 25e9, 50e9, 900e9, 3.4e-6, 5.7e-6, 112.5e9}


def test_no_module_writes_a_link_figure_again():
    """A number literal equal to one of the figures, outside labkit.core.interconnect, is a second copy."""
    copies = []
    for p in PKG.rglob("*.py"):
        if p == PKG / "core" / "interconnect.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is float and node.value in FIGURES:
                copies.append(f"{p.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
    assert copies == []
