"""`labkit topo` and `labkit place`: JSON contract, human output, errors (exit 2)."""

import json

import pytest

from labkit.cli import main

A100 = "a100_pcie_8gpu_nv12_bridge_pairs_dual_socket"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_topo_json_contract(capsys):
    rc, out, _ = run(capsys, "topo", "--sample", "a30_4gpu_nvlink_bridge_pairs_1nic", "--json")
    assert rc == 0
    d = json.loads(out)
    assert [set(g) >= {"index", "name", "numa", "cpu_affinity"} for g in d["gpus"]] == [True] * 4
    assert d["matrix"][0] == ["X", "NV4", "SYS", "SYS"]
    assert d["nics"][0]["name"] == "NIC0" and d["nics"][0]["device"] == "mlx5_0"
    assert d["warnings"] == []


def test_topo_human_table_and_list(capsys):
    rc, out, _ = run(capsys, "topo", "--sample", A100)
    assert rc == 0 and "NV12" in out and "300.0" in out and "32-63,96-127" in out
    rc, out, _ = run(capsys, "topo", "--list")
    assert rc == 0 and A100 in out and "NCCL topology XML" in out


def test_topo_file_and_errors(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("GPU0 GPU1\nGPU0 X NV1\nGPU1 NV2 X\n")
    rc, _, err = run(capsys, "topo", "--file", str(bad))
    assert rc == 2 and "asymmetric" in err and "bad.txt" in err
    notes = tmp_path / "notes.txt"
    notes.write_text("not a topology at all\n")
    rc, _, err = run(capsys, "topo", "--file", str(notes))
    assert rc == 2 and "not `nvidia-smi topo -m` output" in err
    rc, _, err = run(capsys, "topo", "--file", str(tmp_path / "missing.txt"))
    assert rc == 2 and "no such topology file" in err
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    rc, _, err = run(capsys, "topo", "--file", str(binary))
    assert rc == 2 and "not a text file" in err
    rc, _, err = run(capsys, "topo", "--sample", "nope")
    assert rc == 2 and "no topology sample named 'nope'" in err


def test_topo_p2p_table(capsys):
    name = "p2pBandwidthLatencyTest_2x_rtx6000ada_pcie"
    rc, _, err = run(capsys, "topo", "--sample", name)
    assert rc == 2 and "load_p2p_table" in err
    rc, out, _ = run(capsys, "topo", "--sample", name, "--p2p", "--json")
    assert rc == 0 and json.loads(out)["uni_Bps"]["p2p_on"][0][1] == pytest.approx(26.32e9)


def test_place_json_contract(capsys):
    rc, out, _ = run(capsys, "place", "--tp", "2", "--pp", "2", "--dp", "2", "--sample", A100, "--json")
    assert rc == 0
    d = json.loads(out)
    for key in ("tp_groups", "pp_groups", "dp_groups", "cuda_visible_devices", "weakest_tp_link", "comparison"):
        assert key in d
    assert d["weakest_tp_link"] == "NV12"
    assert sorted(int(x) for x in d["cuda_visible_devices"].split(",")) == list(range(8))
    assert set(d["comparison"]) >= {"naive", "placed", "tp_allreduce_speedup", "dp_allreduce_speedup", "summary"}
    assert d["comparison"]["naive"]["gpu_of_rank"] == list(range(8))


def test_place_human_and_errors(capsys):
    rc, out, _ = run(capsys, "place", "--tp", "4", "--dp", "2", "--sample", A100)
    assert rc == 0 and "no good placement" in out and "numactl --cpunodebind=1" in out
    rc, _, err = run(capsys, "place", "--tp", "16", "--sample", A100)
    assert rc == 2 and "16 ranks" in err
    rc, _, err = run(capsys, "place", "--tp", "2", "--tp-bytes", "lots", "--sample", A100)
    assert rc == 2 and "--tp-bytes" in err


def test_place_refuses_overflowing_sizes_and_oversized_matrices_in_one_line(capsys, tmp_path):
    for bad in ("1e400", "1e30GiB", "inf"):
        rc, _, err = run(capsys, "place", "--tp", "2", "--tp-bytes", bad, "--sample", A100)
        assert rc == 2 and err.count("\n") == 1 and "--tp-bytes" in err
        expected = {"1e400": "not a finite size", "1e30GiB": "largest size", "inf": "cannot read 'inf'"}[bad]
        assert expected in err, err
    n = 73
    head = "        " + "  ".join(f"GPU{i}" for i in range(n)) + "  CPU Affinity  NUMA Affinity"
    rows = [f"GPU{i}  " + "  ".join("X" if i == j else "NV18" for j in range(n)) + "  0-7  0" for i in range(n)]
    f = tmp_path / "big.txt"
    f.write_text(head + "\n" + "\n".join(rows) + "\n")
    rc, _, err = run(capsys, "place", "--tp", "8", "--file", str(f))
    assert rc == 2 and err.count("\n") == 1 and "73 GPUs" in err and "up to 72" in err


def test_place_names_idle_gpus(capsys):
    rc, out, _ = run(capsys, "place", "--tp", "2", "--sample", A100)
    assert rc == 0 and "2 of the 8 GPUs" in out and "stay idle" in out
