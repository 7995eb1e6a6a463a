"""Malformed input: an error naming the line and the problem, or an explicit warning; never a wrong matrix."""

import pytest

from labkit.core.errors import LabkitError
from labkit.topology import parse_nccl_xml, parse_p2p_test, parse_smi_text

GOOD = """\
# source: test
        GPU0    GPU1    GPU2    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV4     SYS     PIX     0-7             0               N/A
GPU1    NV4      X      SYS     PIX     0-7             0               N/A
GPU2    SYS     SYS      X      SYS     8-15            1               N/A
NIC0    PIX     PIX     SYS      X

NIC Legend:

  NIC0: mlx5_0
"""


def edit(old, new, text=GOOD):
    assert old in text
    return text.replace(old, new, 1)


def test_good_text_parses():
    t = parse_smi_text(GOOD, "good")
    assert t.matrix[0][1] == "NV4" and t.nics[0].device == "mlx5_0" and t.warnings == ["the GPU model is not known: "
                                                                                       "nominal bandwidths assume NVLink 25 GB/s per link and PCIe Gen4 x16 (pass gpu_name= / --gpu-name to choose)"]


def test_asymmetric_matrix_names_both_lines():
    bad = edit("GPU1    NV4      X      SYS", "GPU1    NV4      X      NODE")
    with pytest.raises(LabkitError, match=r"asymmetric.*GPU1 -> GPU2 is NODE \(line 4\).*GPU2 -> GPU1 is SYS \(line 5\)"):
        parse_smi_text(bad, "f")


def test_unknown_label_names_line_and_cell():
    with pytest.raises(LabkitError, match=r"f line 5: row GPU2, column GPU0: unknown link label 'QPI'"):
        parse_smi_text(edit("GPU2    SYS", "GPU2    QPI"), "f")


def test_wrong_column_count():
    with pytest.raises(LabkitError, match=r"f line 4: row GPU1 has 2 cells, expected 4 link labels"):
        parse_smi_text(edit("GPU1    NV4      X      SYS     PIX     0-7             0               N/A", "GPU1    NV4      X"), "f")
    with pytest.raises(LabkitError, match=r"line 3: row GPU0 has 8 cells, more than"):
        parse_smi_text(edit("0-7             0               N/A", "0-7             0               N/A  junk"), "f")


def test_self_link_and_x_elsewhere():
    with pytest.raises(LabkitError, match=r"line 3: GPU0's link to itself is 'NV4'"):
        parse_smi_text(edit("GPU0     X      NV4", "GPU0     NV4    NV4"), "f")
    bad = edit("GPU0     X      NV4", "GPU0     X      X  ")
    bad = edit("GPU1    NV4      X", "GPU1    X        X", bad)
    with pytest.raises(LabkitError, match=r"GPU0 -> GPU1 is 'X'"):
        parse_smi_text(bad, "f")


def test_not_a_topology():
    with pytest.raises(LabkitError, match="not `nvidia-smi topo -m` output"):
        parse_smi_text("hello\nworld\n", "notes.txt")
    with pytest.raises(LabkitError, match="cannot read"):
        parse_smi_text(edit("NIC0    PIX", "random text here\nNIC0    PIX"), "f")


def test_duplicate_and_unknown_rows():
    dup = edit("GPU2    SYS     SYS      X      SYS     8-15            1               N/A\n",
               "GPU2    SYS     SYS      X      SYS     8-15            1               N/A\n"
               "GPU2    SYS     SYS      X      SYS     8-15            1               N/A\n")
    with pytest.raises(LabkitError, match=r"line 6: row GPU2 appears twice \(first on line 5\)"):
        parse_smi_text(dup, "f")
    with pytest.raises(LabkitError, match="row 'GPU7' is not a column"):
        parse_smi_text(edit("NIC0    PIX", "GPU7    SYS     SYS     SYS     SYS\nNIC0    PIX"), "f")


def test_header_must_be_gpu0_gpu1_in_order():
    with pytest.raises(LabkitError, match="GPU0, GPU1, ... in order"):
        parse_smi_text(edit("GPU0    GPU1    GPU2", "GPU0    GPU2    GPU1"), "f")


def test_nic_row_disagreeing_with_gpu_column():
    with pytest.raises(LabkitError, match=r"NIC0 -> GPU2 is PIX but GPU2 -> NIC0 is SYS"):
        parse_smi_text(edit("NIC0    PIX     PIX     SYS", "NIC0    PIX     PIX     PIX"), "f")


def test_truncated_copy_missing_one_gpu_row_is_rebuilt_with_a_warning():
    t = parse_smi_text(edit("GPU2    SYS     SYS      X      SYS     8-15            1               N/A\n", ""), "f")
    assert t.matrix[2] == ["SYS", "SYS", "X"]
    assert any("row GPU2 is missing" in w for w in t.warnings)
    assert t.gpus[2].cpu_affinity is None and t.gpus[2].numa is None


def test_truncated_copy_missing_two_rows_is_an_error():
    bad = edit("GPU2    SYS     SYS      X      SYS     8-15            1               N/A\n", "")
    bad = edit("GPU1    NV4      X      SYS     PIX     0-7             0               N/A\n", "", bad)
    with pytest.raises(LabkitError, match="GPU rows GPU1, GPU2 are missing"):
        parse_smi_text(bad, "f")


def test_truncated_nic_row_read_from_column():
    t = parse_smi_text(GOOD.split("NIC0    PIX")[0], "f")
    assert t.nics[0].to_gpus == ["PIX", "PIX", "SYS"]
    assert any("row NIC0 is missing" in w for w in t.warnings)


def test_missing_affinity_cells_warn():
    t = parse_smi_text(edit("SYS     8-15            1               N/A", "SYS     8-15            1"), "f")
    assert t.gpus[2].numa == 1 and any("2 of 3 affinity cells" in w for w in t.warnings)
    t = parse_smi_text(edit("SYS     8-15            1               N/A", "SYS"), "f")
    assert t.gpus[2].cpu_affinity is None and any("no affinity cells" in w for w in t.warnings)


def test_bad_affinity_value():
    with pytest.raises(LabkitError, match="CPU Affinity 'zero' is not a CPU list"):
        parse_smi_text(edit("8-15  ", "zero  "), "f")


def test_legacy_soc_legend_read_as_sys_with_warning():
    old = """\
        GPU0    GPU1    CPU Affinity
GPU0     X      SOC     0-7
GPU1    SOC      X      8-15

Legend:

  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
"""
    t = parse_smi_text(old, "old")
    assert t.matrix == [["X", "SYS"], ["SYS", "X"]]
    assert any("legacy 'SOC'" in w for w in t.warnings)
    assert [g.numa for g in t.gpus] == [0, 1]


def test_nccl_xml_errors():
    with pytest.raises(LabkitError, match="not well-formed XML"):
        parse_nccl_xml("<system><cpu>", "x.xml")
    with pytest.raises(LabkitError, match="expected NCCL's <system>"):
        parse_nccl_xml("<foo/>", "x.xml")
    with pytest.raises(LabkitError, match="no <gpu> elements"):
        parse_nccl_xml("<system><cpu numaid='0'/></system>", "x.xml")
    one_sided = ("<system><cpu numaid='0' affinity='ff'><pci busid='0000:01:00.0'><gpu dev='0' sm='80'>"
                 "<nvlink target='0000:02:00.0' count='12'/></gpu></pci><pci busid='0000:02:00.0'><gpu dev='1' sm='80'/>"
                 "</pci></cpu></system>")
    with pytest.raises(LabkitError, match="GPU 0 lists 12 NVLinks to GPU 1, but GPU 1 lists 0 back"):
        parse_nccl_xml(one_sided, "x.xml")


def test_nccl_xml_pcie_paths():
    xml = ("<system><cpu numaid='0' affinity='0000ffff'>"
           "<pci busid='0000:10:00.0'><pci busid='0000:11:00.0'><gpu dev='0' sm='90'/></pci>"
           "<pci busid='0000:12:00.0'><gpu dev='1' sm='90'/></pci></pci>"
           "<pci busid='0000:20:00.0'><gpu dev='2' sm='90'/></pci></cpu>"
           "<cpu numaid='1' affinity='ffff0000'><pci busid='0000:30:00.0'><gpu dev='3' sm='90'/></pci></cpu></system>")
    t = parse_nccl_xml(xml, "x.xml")
    assert t.matrix[0][1] == "PIX" and t.matrix[0][2] == "NODE" and t.matrix[0][3] == "SYS"
    assert t.gpus[3].cpu_affinity == "16-31" and t.gpu_model == "H100"
    assert any("PHB from NODE" in w for w in t.warnings)


def test_p2p_test_errors():
    with pytest.raises(LabkitError, match="not p2pBandwidthLatencyTest output"):
        parse_p2p_test("nothing", "p.txt")
    text = ("Device: 0, X, pciBusID: 1\nDevice: 1, X, pciBusID: 2\n"
            "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)\n   D\\D     0      1\n     0 1.0 2.0\n     1 2.0\n")
    with pytest.raises(LabkitError, match=r"p.txt line 6: row 1 has 1 values"):
        parse_p2p_test(text, "p.txt")
    with pytest.raises(LabkitError, match="no bandwidth matrix"):
        parse_p2p_test("Device: 0, X, pciBusID: 1\n", "p.txt")
