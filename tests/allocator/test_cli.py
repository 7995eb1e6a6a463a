import gzip
import json
import pickle

import pytest

from labkit.allocator.sim.synthetic import fragmentation_pattern, to_snapshot, training_like
from labkit.cli import main

GiB = 1024**3


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("alloc") / "train.pickle.gz"
    p.write_bytes(gzip.compress(pickle.dumps(to_snapshot(training_like(steps=4), ""))))
    return p


def test_replay_json_keys(trace_file, capsys):
    assert main(["alloc", "replay", str(trace_file), "--conf", "expandable_segments:True", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for k in ("allocated_peak_bytes", "reserved_peak_bytes", "segments_peak", "num_device_alloc",
              "num_alloc_retries", "num_ooms"):
        assert isinstance(doc[k], int)
    assert doc["config"] == "expandable_segments:True" and doc["segments_peak"] == 0


def test_replay_cap_produces_ooms(tmp_path, capsys):
    p = tmp_path / "frag.pickle"
    p.write_bytes(pickle.dumps(to_snapshot(fragmentation_pattern(), "", cap_bytes=6 * GiB)))
    assert main(["alloc", "replay", str(p), "--cap-bytes", "6GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_ooms"] == 1
    assert main(["alloc", "replay", str(p), "--cap-bytes", "6GiB"]) == 0
    assert "OOM at request" in capsys.readouterr().out


def test_compare_table(trace_file, capsys):
    assert main(["alloc", "compare", str(trace_file), "--conf", "default", "--conf", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    assert "expandable_segments:True" in out and "reserved peak" in out


def test_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.pickle.gz"
    bad.write_bytes(gzip.compress(pickle.dumps({"segments": []}))[:20])
    assert main(["alloc", "replay", str(bad)]) == 2
    assert "truncated" in capsys.readouterr().err
    assert main(["alloc", "replay", str(tmp_path / "none.pickle")]) == 2
    assert main(["alloc", "doctor"]) == 2
    assert main(["alloc", "replay", str(bad), "--conf", "max_split_size_mb:1"]) == 2


def test_doctor_from_text_and_stats(tmp_path, capsys):
    t = tmp_path / "oom.txt"
    t.write_text("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
                 "133.90 GiB is free. Including non-PyTorch memory, this process has 5.52 GiB memory in use. 6.00 GiB "
                 "allowed; Of the allocated memory 100.00 MiB is allocated by PyTorch, and 4.90 GiB is reserved by "
                 "PyTorch but unallocated.")
    assert main(["alloc", "doctor", "--oom-text", str(t), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"][0]["kind"] == "fragmentation"
    s = tmp_path / "stats.json"
    s.write_text(json.dumps({"allocated_bytes.all.current": 1 * GiB, "reserved_bytes.all.current": 9 * GiB,
                             "inactive_split_bytes.all.current": 0}))
    assert main(["alloc", "doctor", "--stats", str(s)]) == 0
    assert "[cache_held]" in capsys.readouterr().out


# issue 12: every reader of a user's file names what it could not read; exit 2 and one line


def _one_line_error(capsys, argv, match):
    import re

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err
    return err


def test_doctor_on_a_binary_oom_text(tmp_path, capsys):
    b = tmp_path / "oom.bin"
    b.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    _one_line_error(capsys, ["alloc", "doctor", "--oom-text", str(b)], r"oom.bin: not a text file \(byte \d+ is not UTF-8\)")


@pytest.mark.parametrize("doc, match", [
    ({"ranks": "no"}, r"'ranks': expected a list of per-rank dicts, got str 'no'"),
    ({"ranks": [{"rank": 0}, 5]}, r"ranks\[1\]: expected a dict, got a int"),
    ({"ranks": [{"rank": "zero"}]}, r"ranks\[0\].rank: expected an integer"),
    ({"ranks": [], "nvml": [{"gpu": 0, "processes": [{"pid": "x"}]}]}, r"nvml\[0\].processes\[0\]"),
    ([{"allocated_bytes.all.current": 1}, "x"], r"stats.json\[1\]: a memory_stats\(\) sample is a dict"),
    ({"stats": [], "oom_message": "x"}, r"'stats' is a list"),
    ("just text", r"got a str"),
    # issue 27: impossible statistics are refused, not read as "no out-of-memory cause found"
    ({"allocated_bytes.all.current": -5, "reserved_bytes.all.current": 10},
     r"'allocated_bytes.all.current': expected a non-negative integer \(memory_stats\(\) counts\), got '-5'"),
    ({"allocated_bytes.all.current": "lots"}, r"'allocated_bytes.all.current': expected a non-negative integer"),
    ({"allocated_bytes.all.current": 20, "reserved_bytes.all.current": 10},
     r"20 bytes allocated exceed the 10 bytes reserved: impossible"),
    ({"reserved_bytes.all.current": 10, "reserved_bytes.all.peak": 5}, r"current 10 exceeds its peak 5"),
    ({"stats": {"num_ooms": -1}, "oom_message": "x"}, r"stats: 'num_ooms': expected a non-negative integer"),
    ([{"allocated_bytes.all.current": 1.5}], r"stats.json\[0\]: 'allocated_bytes.all.current'"),
])
def test_doctor_on_malformed_stats(tmp_path, capsys, doc, match):
    s = tmp_path / "stats.json"
    s.write_text(json.dumps(doc))
    _one_line_error(capsys, ["alloc", "doctor", "--stats", str(s)], match)


def test_doctor_stats_given_inline(capsys):
    _one_line_error(capsys, ["alloc", "doctor", "--stats", '{"ranks":"no"}'], r"--stats: 'ranks': expected a list")
    _one_line_error(capsys, ["alloc", "doctor", "--stats", '{"ranks":'], r"--stats: neither a file nor valid JSON")
    assert main(["alloc", "doctor", "--stats", json.dumps({"allocated_bytes.all.current": 1 * GiB,
                                                           "reserved_bytes.all.current": 9 * GiB})]) == 0
    assert "[cache_held]" in capsys.readouterr().out


def test_doctor_on_a_self_contradictory_message(tmp_path, capsys):
    t = tmp_path / "oom.txt"
    t.write_text("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.81 GiB of which "
                 "133.90 GiB is free. Including non-PyTorch memory, this process has 5.52 GiB memory in use. Of the "
                 "allocated memory 100.00 MiB is allocated by PyTorch, and 4.90 GiB is reserved by PyTorch but "
                 "unallocated.")
    _one_line_error(capsys, ["alloc", "doctor", "--oom-text", str(t)], r"contradicts itself.*133.90 GiB free is more "
                    r"than the total capacity 39.81 GiB")


@pytest.mark.parametrize("entry, match", [
    ({"action": ["alloc"], "addr": 1, "size": 2}, r"device_traces\[0\]\[0\] has action \['alloc'\]"),
    ({"action": "alloc", "addr": 1, "size": 2, "stream": 1.5}, r"device_traces\[0\]\[0\] \(alloc\) has stream 1.5"),
])
@pytest.mark.parametrize("verb", ["replay", "doctor"])
def test_replay_and_doctor_on_malformed_trace_entries(tmp_path, capsys, entry, match, verb):
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry]]}))
    argv = ["alloc", "replay", str(p)] if verb == "replay" else ["alloc", "doctor", "--snapshot", str(p)]
    _one_line_error(capsys, argv, match)


def test_replay_on_a_gzip_bomb_is_refused_and_the_limit_can_be_raised(tmp_path, capsys):
    p = tmp_path / "bomb.pickle.gz"
    p.write_bytes(gzip.compress(pickle.dumps({"segments": [], "pad": b"\0" * (3 << 20)})))
    _one_line_error(capsys, ["alloc", "replay", str(p), "--max-snapshot-bytes", "1MiB"],
                    r"decompresses to more than 1.00 MiB.*--max-snapshot-bytes")
    _one_line_error(capsys, ["alloc", "doctor", "--snapshot", str(p), "--max-snapshot-bytes", "1MiB"], "size limit")
    # raised: read, then refused for what it is (no trace history), not for its size
    _one_line_error(capsys, ["alloc", "replay", str(p), "--max-snapshot-bytes", "8MiB"], "no trace history")
    _one_line_error(capsys, ["alloc", "replay", str(p), "--max-snapshot-bytes", "-1"], "must be positive|size")


def test_gpu_flag_refuses_negatives_and_device_is_a_deprecated_alias(trace_file, capsys):
    _one_line_error(capsys, ["alloc", "replay", str(trace_file), "--gpu", "-1"], r"--gpu: must be an integer >= 0")
    _one_line_error(capsys, ["alloc", "replay", str(trace_file), "--device", "-1"], r"--device: must be an integer >= 0")
    assert main(["alloc", "replay", str(trace_file), "--device", "0", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["requests"] > 0
    assert out.err.count("\n") == 1 and "--device is deprecated: use --gpu N" in out.err
    assert main(["alloc", "compare", str(trace_file), "--gpu", "0", "--conf", "default"]) == 0
    capsys.readouterr()
    _one_line_error(capsys, ["alloc", "replay", str(trace_file), "--gpu", "3"], r"no trace for device 3")
