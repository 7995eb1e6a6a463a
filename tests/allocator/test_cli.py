import gzip
import json
import pickle

import pytest

from labkit.allocator.synthetic import fragmentation_pattern, to_snapshot, training_like
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
