"""Hostile topology files: every reader (nvidia-smi topo text, NCCL XML, p2pBandwidthLatencyTest text)
answers a malformed input with one LabkitError line naming the input and the entry it could not read,
through the API and through the CLI (exit 2, one line on stderr). Never a traceback, never a matrix
it could not check.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.cli import main
from labkit.core.errors import LabkitError
from labkit.topology import load_file, load_p2p_table, parse_nccl_xml, parse_p2p_test, parse_smi_text
from labkit.topology.load import MAX_FILE_BYTES, sample_path

SMI = sample_path("a100_pcie_8gpu_nv12_bridge_pairs_dual_socket").read_text()
XML = sample_path("nccl_topo_xml_azure_ncv4_4xa100_nvlink_pairs").read_text()
P2P = sample_path("p2pBandwidthLatencyTest_2x_rtx6000ada_pcie").read_text()

SMALL = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV4     0-7             0
GPU1    NV4      X      0-7             0
"""


def _square(n: int, cell: str = "NV18") -> str:
    head = "        " + "  ".join(f"GPU{i}" for i in range(n)) + "  CPU Affinity  NUMA Affinity"
    rows = [f"GPU{i}  " + "  ".join("X" if i == j else cell for j in range(n)) + "  0-7  0" for i in range(n)]
    return head + "\n" + "\n".join(rows) + "\n"


P2P_HEAD = "Device: 0, A, pciBusID: 1, pciDeviceID: 0, pciDomainID:0\nDevice: 1, B, pciBusID: 2, pciDeviceID: 0, pciDomainID:0\n"
P2P_UNI = "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)\n   D\\D     0      1\n"

# (reader, text, a fragment the one-line message must hold)
CORPUS = [
    # truncated
    ("smi", SMI[: SMI.index("GPU3 ")], "missing"),
    ("smi", SMI.splitlines()[0] + "\n", "GPU0"),
    ("xml", XML[: len(XML) // 2], "not well-formed XML"),
    ("p2p", P2P[: P2P.index("Unidirectional")], "no bandwidth matrix"),
    # wrong columns, non-square
    ("smi", SMALL.replace("GPU1    NV4      X      0-7", "GPU1    NV4      0-7"), "row GPU1"),
    ("smi", SMALL.replace("GPU0    GPU1    CPU", "GPU0    GPU1    GPU2    CPU"), "column GPU2"),
    ("smi", SMALL.replace("GPU0    GPU1    CPU", "GPU1    GPU0    CPU"), "GPU0"),
    ("smi", SMALL + "GPU2    SYS     SYS\n", "GPU2"),
    ("p2p", P2P_HEAD + P2P_UNI + "     0   1.0  2.0  3.0\n", "row 0 has 3 values"),
    ("p2p", P2P_HEAD + P2P_UNI + "     0   1.0\n", "row 0 has 1 values"),
    ("p2p", P2P_HEAD + P2P_UNI + "     0   nan  2.0\n     1   1.0  1.0\n", "'nan'"),
    ("p2p", P2P_HEAD + P2P_UNI + "     0   1.0  -2.0\n     1   1.0  1.0\n", "'-2.0'"),
    ("p2p", P2P_HEAD + P2P_UNI + "     0   1.0  inf\n     1   1.0  1.0\n", "'inf'"),
    # duplicate names
    ("smi", SMALL + "GPU1    NV4      X      0-7             0\n", "appears twice"),
    ("smi", SMALL.replace("GPU0    GPU1    CPU", "GPU0    GPU1    GPU1    CPU"), "GPU"),
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu dev="0"/></pci><pci busid="b"><gpu dev="0"/></pci></cpu></system>',
     "dev number 0 appears twice"),
    ("p2p", P2P_HEAD + "Device: 1, C, pciBusID: 3, pciDeviceID: 0, pciDomainID:0\n" + P2P_UNI, "device 1 is listed twice"),
    # wrong types
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu dev="abc"/></pci></cpu></system>', "dev='abc'"),
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu dev="0"><nvlink target="b" count="two"/></gpu></pci></cpu></system>',
     "count='two'"),
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu/></pci></cpu></system>', "no dev attribute"),
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu dev="1"/></pci></cpu></system>', "expected 0..0"),
    ("xml", "<topology/>", "expected NCCL's <system>"),
    ("smi", SMALL.replace("NV4      X      0-7", "NV999999  X      0-7"), "NVLinks between two GPUs"),
    ("smi", SMALL.replace("NV4      X      0-7", "NV" + "9" * 5000 + " X 0-7"), "unknown link label"),
    # unicode
    ("smi", SMALL.replace("GPU1    NV4", "GPU1    NV٤"), "unknown link label"),
    ("smi", SMALL.replace("0-7             0\nGPU1", "0-7             ²\nGPU1"), "NUMA Affinity"),
    ("smi", SMALL.replace("GPU1    NV4 ", "GPU1    ＮＶ4"), "ＮＶ4"),
    ("xml", '<system><cpu numaid="0"><pci busid="a"><gpu dev="٣"/></pci></cpu></system>', "dev='٣'"),
    ("p2p", P2P_HEAD + P2P_UNI + "     ²   1.0  2.0\n", "no bandwidth matrix"),
    # huge
    ("smi", _square(513), "513 GPU columns"),
    ("xml", '<system><cpu numaid="0">' + "".join(f'<pci busid="{i}"><gpu dev="{i}"/></pci>' for i in range(600)) + "</cpu></system>",
     "600 <gpu> elements"),
    # binary-looking text
    ("smi", "\x00\x01\x02GPU0\x00\n\x7f\x80", "GPU0"),
    ("xml", "<\x00system>", "not well-formed XML"),
]

READERS = {"smi": parse_smi_text, "xml": parse_nccl_xml, "p2p": parse_p2p_test}


@pytest.mark.parametrize("reader,text,fragment", CORPUS, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(CORPUS)])
def test_each_malformed_input_is_one_line_naming_it(reader, text, fragment):
    with pytest.raises(LabkitError) as info:
        READERS[reader](text, "hostile.txt")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("hostile.txt"), msg
    assert fragment in msg, msg


def test_deep_nesting_is_read_without_recursion():
    deep = 5000
    xml = '<system><cpu numaid="0">' + '<pci busid="b">' * deep + '<gpu dev="0"/>' + "</pci>" * deep + "</cpu></system>"
    assert parse_nccl_xml(xml, "deep.xml").n == 1


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00\x01binary\x00", b"", b"\x89PNG\r\n\x1a\n" + bytes(range(256))])
def test_binary_and_empty_files_through_the_cli(capsys, tmp_path, payload):
    f = tmp_path / "topo.bin"
    f.write_bytes(payload)
    for argv in (["topo", "--file", str(f)], ["topo", "--p2p", "--file", str(f)], ["place", "--tp", "2", "--file", str(f)]):
        rc, _, err = _cli(capsys, *argv)
        assert rc == 2 and err.count("\n") == 1 and str(f) in err, (argv, err)


def test_a_huge_file_is_refused_before_it_is_read(capsys, tmp_path):
    f = tmp_path / "huge.txt"
    with f.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(LabkitError, match=r"huge.txt: 8388609 bytes, more than a topology file can be"):
        load_file(f)
    with pytest.raises(LabkitError, match="more than a topology file"):
        load_p2p_table(f)
    rc, _, err = _cli(capsys, "topo", "--file", str(f))
    assert rc == 2 and err.count("\n") == 1


# ---- property-based: arbitrary edits of real files ----

_ONE_LINE = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_reader(reader, text: str) -> None:
    try:
        out = reader(text, "fuzz.txt")
    except LabkitError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and msg.startswith("fuzz.txt"), msg
        return
    # a result it returns is one it checked
    if hasattr(out, "matrix"):
        n = out.n
        assert len(out.matrix) == n and all(len(r) == n for r in out.matrix)
        assert all(out.matrix[i][i] == "X" for i in range(n))


def _mutate(base: str):
    lines = base.splitlines(keepends=True)
    edits = st.lists(st.tuples(st.integers(0, max(0, len(lines) - 1)),
                               st.sampled_from(["drop", "dup", "cut", "junk", "swap"]),
                               st.text(max_size=12)), max_size=4)

    def apply(es):
        ls = list(lines)
        for i, op, junk in es:
            if not ls:
                break
            i %= len(ls)
            if op == "drop":
                del ls[i]
            elif op == "dup":
                ls.insert(i, ls[i])
            elif op == "cut":
                ls[i] = ls[i][: len(ls[i]) // 2] + "\n"
            elif op == "junk":
                k = len(ls[i]) // 3
                ls[i] = ls[i][:k] + junk + ls[i][k:]
            else:
                j = (i + 1) % len(ls)
                ls[i], ls[j] = ls[j], ls[i]
        return "".join(ls)

    return edits.map(apply)


@settings(**_ONE_LINE)
@given(_mutate(SMI))
def test_edited_nvidia_smi_text_is_read_or_refused_in_one_line(text):
    _check_reader(parse_smi_text, text)


@settings(**_ONE_LINE)
@given(_mutate(XML))
def test_edited_nccl_xml_is_read_or_refused_in_one_line(text):
    _check_reader(parse_nccl_xml, text)


@settings(**_ONE_LINE)
@given(_mutate(P2P))
def test_edited_p2p_text_is_read_or_refused_in_one_line(text):
    _check_reader(parse_p2p_test, text)


@settings(**_ONE_LINE)
@given(st.text(max_size=300))
def test_arbitrary_text_is_read_or_refused_in_one_line(text):
    for reader in READERS.values():
        _check_reader(reader, text)
