"""Every bundled sample parses, and the parsed matrix is exactly what the text says."""

import re
from pathlib import Path

import pytest

from labkit.core.errors import LabkitError
from labkit.topology import list_samples, load_p2p_table, load_sample, load_topology
from labkit.topology.load import SMI

SAMPLES = list_samples()


def test_every_sample_is_bundled_with_its_source_line():
    assert len(SAMPLES) >= 10
    for s in SAMPLES:
        assert s.origin, f"{s.name} lost its '# source:' line"


@pytest.mark.parametrize("s", [s for s in SAMPLES if s.format == SMI], ids=lambda s: s.name)
def test_smi_sample_matrix_matches_the_text(s):
    text = Path(s.path).read_text()
    t = load_sample(s.name)
    # Independent reading: each 'GPUi' row's first n cells, split on any whitespace.
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines() if re.match(r"^GPU\d+\s", ln)}
    n = len(rows)
    assert t.n == n
    for i in range(n):
        assert t.matrix[i] == [c.upper() for c in rows[f"GPU{i}"][:n]]
        assert t.matrix[i][i] == "X"
        for j in range(n):
            assert t.matrix[i][j] == t.matrix[j][i]
            lk = t.link(i, j)
            assert lk.bandwidth_Bps > 0
    # NIC rows carry no affinity columns; NIC names come from the legend when there is one.
    nic_rows = [ln.split()[0] for ln in text.splitlines() if re.match(r"^(NIC\d+|mlx5_\d+)\s", ln)]
    assert [nic.name for nic in t.nics] == nic_rows
    for nic in t.nics:
        assert len(nic.to_gpus) == n
        m = re.search(rf"^\s*{nic.name}:\s*(\S+)", text, re.M)
        if m:
            assert nic.device == m.group(1)
    # Affinity columns, when present, are read per GPU.
    if "CPU Affinity" in text:
        assert all(g.cpu_affinity and re.match(r"^[\d,-]+$", g.cpu_affinity) for g in t.gpus)
    if "NUMA Affinity" in text:
        assert all(g.numa is not None for g in t.gpus)


def test_specific_variants():
    a30 = load_sample("a30_4gpu_nvlink_bridge_pairs_1nic")
    assert a30.matrix[0][1] == "NV4" and a30.matrix[1][2] == "SYS"
    assert [g.numa for g in a30.gpus] == [0, 0, 1, 1]
    assert a30.gpus[2].cpu_affinity == "24-47,72-95" and a30.gpus[0].gpu_numa_id is None
    assert a30.nics[0].device == "mlx5_0" and a30.nics[0].to_gpus == ["SYS", "SYS", "PXB", "PIX"]
    k80 = load_sample("k80_8gpu_pix_pxb_phb_sys_tabs")  # tabs, no NUMA column
    assert k80.matrix[4][6] == "PXB" and k80.matrix[2][4] == "PHB"
    assert [g.numa for g in k80.gpus] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert any("NUMA" in w for w in k80.warnings)
    rtx = load_sample("rtx4090_8gpu_all_sys_2nic_tabs")  # empty tab cell before GPU NUMA ID
    assert [g.numa for g in rtx.gpus] == [0] * 4 + [1] * 4
    assert rtx.nics[0].to_gpus[6] == "PHB"
    assert any("NIC Legend" in w for w in rtx.warnings)
    dgx1 = load_sample("dgx1_v100_hybrid_cube_mesh_4nic")  # mlx5 columns, CPU Affinity only
    assert [n.name for n in dgx1.nics] == ["mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"]
    assert dgx1.link(0, 3).nvlinks == 2 and dgx1.link(0, 5).kind == "SYS"


def test_nccl_xml_sample():
    t = load_sample("nccl_topo_xml_azure_ncv4_4xa100_nvlink_pairs")
    assert t.matrix == [["X", "NV12", "SYS", "SYS"], ["NV12", "X", "SYS", "SYS"],
                        ["SYS", "SYS", "X", "NV12"], ["SYS", "SYS", "NV12", "X"]]
    assert [g.numa for g in t.gpus] == [0, 1, 2, 3]
    assert t.gpus[0].cpu_affinity == "0-23" and t.gpus[3].cpu_affinity == "72-95"
    assert t.gpu_model == "A100" and t.link(0, 1).bandwidth_Bps == 12 * 25e9


def test_p2p_sample_is_bandwidth_data_not_a_topology():
    with pytest.raises(LabkitError, match="load_p2p_table"):
        load_sample("p2pBandwidthLatencyTest_2x_rtx6000ada_pcie")
    t = load_p2p_table("p2pBandwidthLatencyTest_2x_rtx6000ada_pcie")
    assert t.n == 2 and t.gpus[0].startswith("NVIDIA RTX 6000 Ada")
    assert t.uni_Bps["p2p_on"][0][1] == pytest.approx(26.32e9)
    assert t.bi_Bps["p2p_on"][1][0] == pytest.approx(52.10e9)
    assert t.latency_s["p2p_off"][0][1] == pytest.approx(10.90e-6)
    assert t.cpu_latency_s["p2p_on"][1][1] == pytest.approx(1.58e-6)
    assert t.can_access == [[True, True], [True, True]]
    # Measured PCIe P2P stays below the PCIe Gen4 x16 nominal figure.
    from labkit.topology.links import pcie_bps
    assert t.uni_Bps["p2p_on"][0][1] < pcie_bps(4)


def test_load_topology_dispatch(tmp_path):
    name = "a30_4gpu_nvlink_bridge_pairs_1nic"
    assert load_topology(name).source == f"sample: {name}"
    p = tmp_path / "t.txt"
    p.write_text(Path([s for s in SAMPLES if s.name == name][0].path).read_text())
    assert load_topology(str(p)).matrix == load_topology(name).matrix
    with pytest.raises(LabkitError, match="neither"):
        load_topology("no_such_sample")


def test_live_without_driver_is_a_clear_error():
    # CI has no NVIDIA driver: live discovery must say so, not crash.
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_driver = True
    except Exception:
        has_driver = False
    if has_driver:
        assert load_topology("live").n >= 1
    else:
        with pytest.raises(LabkitError, match="--sample"):
            load_topology("live")
