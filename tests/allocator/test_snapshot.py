import gzip
import pickle

import pytest

from labkit.allocator import compile_trace, read_snapshot, replay
from labkit.allocator.sim.synthetic import to_snapshot, training_like
from labkit.core.errors import LabkitError


@pytest.fixture(scope="module")
def snap_dict():
    return to_snapshot(training_like(steps=3), "")


def test_reads_pickle_and_gzip(tmp_path, snap_dict):
    p1 = tmp_path / "s.pickle"
    p1.write_bytes(pickle.dumps(snap_dict))
    p2 = tmp_path / "s.pickle.gz"
    p2.write_bytes(gzip.compress(pickle.dumps(snap_dict)))
    a, b = read_snapshot(p1), read_snapshot(p2)
    assert a.device_traces == b.device_traces and len(a.segments) == len(snap_dict["segments"])


def test_truncated_files_are_refused(tmp_path, snap_dict):
    raw = pickle.dumps(snap_dict)
    (tmp_path / "cut.pickle").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(LabkitError, match="truncated"):
        read_snapshot(tmp_path / "cut.pickle")
    gz = gzip.compress(raw)
    (tmp_path / "cut.pickle.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(LabkitError, match="truncated"):
        read_snapshot(tmp_path / "cut.pickle.gz")


@pytest.mark.parametrize("payload, why", [
    (b"", "empty"),
    (b"hello, not a pickle", "not a pickle"),
    (pickle.dumps([1, 2, 3]), "holds a list"),
    (pickle.dumps({"a": 1}), "no 'segments'"),
    (pickle.dumps({"segments": [{"address": "x"}]}), r"segments\[0\] is malformed: needs a non-negative integer 'address'"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "teleport"}]]}),
     r"device_traces\[0\]\[0\] has action 'teleport' \(expected one of"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": "big"}]]}),
     r"device_traces\[0\]\[0\] \(alloc\) has size 'big', not a non-negative integer"),
    # issue 12: an unhashable action, a non-integer stream, malformed blocks and pool ids
    (pickle.dumps({"segments": [], "device_traces": [[{"action": ["alloc"], "addr": 1, "size": 2}]]}),
     r"device_traces\[0\]\[0\] has action \['alloc'\]"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 2, "stream": "s1"}]]}),
     r"device_traces\[0\]\[0\] \(alloc\) has stream 's1', not an integer"),
    (pickle.dumps({"segments": [{"address": 0, "total_size": 4, "blocks": [["x"]]}]}), r"segments\[0\].*block 0"),
    (pickle.dumps({"segments": [{"address": 0, "total_size": 4, "segment_pool_id": "p"}]}), "segment_pool_id"),
])
def test_malformed_snapshots_get_a_clear_error(tmp_path, payload, why):
    p = tmp_path / "bad.pickle"
    p.write_bytes(payload)
    with pytest.raises(LabkitError, match=why):
        read_snapshot(p)


def test_pickles_with_objects_are_not_executed(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": Evil()}))
    with pytest.raises(LabkitError, match="refusing to load"):
        read_snapshot(p)


def test_missing_file_and_no_history(tmp_path):
    with pytest.raises(LabkitError, match="no such"):
        read_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(LabkitError, match="no trace history"):
        compile_trace(read_snapshot({"segments": [], "device_traces": [[]]}))


def test_ring_buffer_overflow_is_reported_incomplete(snap_dict):
    full = compile_trace(read_snapshot(snap_dict))
    assert full.complete
    cut = dict(snap_dict, device_traces=[snap_dict["device_traces"][0][100:]])
    tr = compile_trace(read_snapshot(cut))
    assert not tr.complete and "before the history starts" in tr.incomplete_reason
    with pytest.raises(LabkitError, match="incomplete"):
        replay(tr, "")


def test_program_requests_are_separated_from_allocator_actions(snap_dict):
    tr = compile_trace(read_snapshot(snap_dict))
    actions = [e["action"] for e in snap_dict["device_traces"][0]]
    assert tr.n_ids == actions.count("alloc")
    assert len(tr.segment_oracle) == actions.count("segment_alloc")
    # alloc sizes are the program's requested sizes, not the rounded block sizes
    req = [e["size"] for e in snap_dict["device_traces"][0] if e["action"] == "alloc"]
    assert [op[2] for op in tr.ops if op[0] == 0] == req


def test_deferred_free_is_not_reused_before_free_completed():
    """record_stream: free_requested, other work, then free_completed; until then the block is not reusable
    (it still counts as active), as in free()/process_events()."""
    MiB = 1024 * 1024
    A, B = 0x7F0000000000, 0x7F0000000000 + 40 * MiB
    tr = [
        {"action": "segment_alloc", "addr": A, "size": 40 * MiB, "stream": 0},
        {"action": "alloc", "addr": A, "size": 40 * MiB, "stream": 0},
        {"action": "free_requested", "addr": A, "size": 40 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": B, "size": 40 * MiB, "stream": 0},
        {"action": "alloc", "addr": B, "size": 40 * MiB, "stream": 0},  # cannot reuse A yet
        {"action": "free_completed", "addr": A, "size": 40 * MiB, "stream": 0},
        {"action": "free_requested", "addr": B, "size": 40 * MiB, "stream": 0},
        {"action": "free_completed", "addr": B, "size": 40 * MiB, "stream": 0},
        {"action": "alloc", "addr": A, "size": 40 * MiB, "stream": 0},
    ]
    snap = {"segments": [{"address": A, "total_size": 40 * MiB, "allocated_size": 40 * MiB, "blocks": []},
                         {"address": B, "total_size": 40 * MiB, "allocated_size": 0, "blocks": []}],
            "device_traces": [tr], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
    t = compile_trace(read_snapshot(snap))
    assert t.complete
    r = replay(t, "")
    assert r.segments_peak == 2 and r.num_device_alloc == 2
    assert r.stats["active_bytes.all.peak"] == 80 * MiB and r.allocated_peak_bytes == 40 * MiB
    from labkit.allocator import replay_with_sim

    assert replay_with_sim(t, "").addresses == [A, B, A]


def test_empty_cache_in_a_trace_is_replayed():
    """A run of segment_free entries not followed by an oom is the program's empty_cache()."""
    from labkit.allocator.sim.synthetic import to_snapshot
    from labkit.allocator import TraceBuilder

    tb = TraceBuilder()
    a = tb.alloc(100 * 1024 * 1024)
    tb.free(a)
    tb.empty_cache()
    tb.alloc(100 * 1024 * 1024)
    snap = to_snapshot(tb.build(), "")
    t = compile_trace(read_snapshot(snap))
    assert [op[0] for op in t.ops] == [0, 1, 4, 0]
    assert t.empty_cache_runs == 1 and t.ambiguous_runs == 1  # a new segment follows: could have been a retry
    r = replay(t, "")
    assert r.num_device_alloc == 2 and r.stats["num_device_free"] == 1


def test_private_pools_are_refused(snap_dict):
    seg = dict(snap_dict["segments"][0], segment_pool_id=(1, 0))
    with pytest.raises(LabkitError, match="private memory pool"):
        compile_trace(read_snapshot(dict(snap_dict, segments=[seg])))


def test_deep_nesting_is_named_without_recursing(tmp_path, monkeypatch):
    import labkit.allocator.snapshot as snapshot_mod

    """issue 12: a trace entry nested 100,000 deep raised RecursionError inside the error message."""
    n = 100_000
    deep = b"]" * n + b"a" * (n - 1)  # pickle opcodes: n empty lists, each appended into the one below
    raw = (b"\x80\x04}" + b"\x8c\x08segments]s" + b"\x8c\x0ddevice_traces]]}" + b"\x8c\x06action" + deep + b"s"
           + b"\x8c\x04addrK\x01s" + b"aas.")
    p = tmp_path / "deep.pickle"
    p.write_bytes(raw)
    # refused before decoding now (100,000 empty lists in 200 KB is built to expand), and past that budget the
    # description of the entry is still bounded
    with pytest.raises(LabkitError, match="built to expand"):
        read_snapshot(p)
    monkeypatch.setattr(snapshot_mod, "MAX_DECODE_RATIO", 1000)
    with pytest.raises(LabkitError, match=r"device_traces\[0\]\[0\] has action \[\[\[\.\.\.\]\]\]"):
        read_snapshot(p)


def test_gzip_bomb_is_refused_before_it_is_unpacked(tmp_path):
    """issue 12: 2 MB of gzip that unpacks to 2 GB took 4.2 GB. Here 8 MiB of zeros in a few KB: refused at a 512 KiB
    limit after reading just past the limit; the limit can be raised."""
    import tracemalloc

    raw = pickle.dumps({"segments": [], "pad": b"\0" * (8 << 20)})
    bomb = tmp_path / "bomb.pickle.gz"
    bomb.write_bytes(gzip.compress(raw))
    assert bomb.stat().st_size < 20_000
    tracemalloc.start()
    with pytest.raises(LabkitError, match=r"decompresses to more than 512.00 KiB.*--max-snapshot-bytes"):
        read_snapshot(bomb, max_bytes=512 * 1024)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 512 * 1024  # not the 8 MiB it unpacks to
    assert read_snapshot(bomb, max_bytes=9 << 20).segments == []
    plain = tmp_path / "big.pickle"
    plain.write_bytes(raw)
    with pytest.raises(LabkitError, match="size limit"):
        read_snapshot(plain, max_bytes=512 * 1024)
