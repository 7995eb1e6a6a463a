import pytest

from labkit.allocator import diagnose, parse_oom_message
from labkit.allocator.sim.synthetic import fragmentation_pattern, growth, to_snapshot
from labkit.core.errors import LabkitError

GiB = 1024**3
MiB = 1024**2
TAIL = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
        "#environment-variables)")
TOO_LARGE = ("CUDA out of memory. Tried to allocate 5.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
             "134.22 GiB is free. Including non-PyTorch memory, this process has 5.02 GiB memory in use. 4.00 GiB "
             "allowed; Of the allocated memory 1.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch "
             "but unallocated." + TAIL)
FRAG = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 133.9 GiB "
        "is free. Including non-PyTorch memory, this process has 5.52 GiB memory in use. 6.00 GiB allowed; Of the "
        "allocated memory 100.00 MiB is allocated by PyTorch, and 4.90 GiB is reserved by PyTorch but unallocated." + TAIL)
OTHER = ("CUDA out of memory. Tried to allocate 69.91 GiB. GPU 0 has a total capacity of 139.81 GiB of which 52.31 GiB "
         "is free. Process 4242 has 86.88 GiB memory in use. Including non-PyTorch memory, this process has 530.00 MiB "
         "memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch "
         "but unallocated." + TAIL)
LEGACY = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already "
          "allocated; 3.44 MiB free; 14.73 GiB reserved in total by PyTorch)")


def test_parse_current_message():
    m = parse_oom_message(FRAG)
    assert m.request_bytes == 2 * GiB and m.allowed_bytes == 6 * GiB and m.device == 0
    assert m.allocated_bytes == 100 * MiB and abs(m.reserved_unallocated_bytes - 4.90 * GiB) < 0.01 * GiB
    assert m.limit_bytes == 6 * GiB
    o = parse_oom_message(OTHER)
    assert o.other_processes == [(4242, int(round(86.88 * GiB)))] and o.allowed_bytes is None


def test_parse_legacy_message():
    m = parse_oom_message(LEGACY)
    assert m.format == "legacy" and m.request_bytes == 20 * MiB
    assert abs(m.reserved_bytes - 14.73 * GiB) < 0.01 * GiB


def test_not_an_oom_message():
    with pytest.raises(LabkitError, match="not a PyTorch CUDA out-of-memory"):
        parse_oom_message("Segmentation fault")
    with pytest.raises(LabkitError, match="give an OOM message"):
        diagnose()


@pytest.mark.parametrize("text, kind", [(TOO_LARGE, "too_large"), (FRAG, "fragmentation"), (OTHER, "other_process"),
                                        (LEGACY, "fragmentation")])
def test_classifies_messages(text, kind):
    d = diagnose(oom_text=text)
    assert d.primary == kind
    f = d.findings[0]
    assert f.evidence and f.fix


def test_small_fragmentation_on_a_full_device_is_fragmentation_with_little_room():
    d = diagnose(oom_text=LEGACY)
    assert d.kinds == ["fragmentation"]
    assert any("little room" in e for e in d.findings[0].evidence)


# issue 11: a default-allocator OOM under a 13.5 GiB cap that the same run survives with expandable segments
ISSUE11 = ("CUDA out of memory. Tried to allocate 1.51 GiB. GPU 0 has a total capacity of 139.80 GiB of which 126.09 GiB "
           "is free. Including non-PyTorch memory, this process has 13.71 GiB memory in use. 13.50 GiB allowed; Of the "
           "allocated memory 11.64 GiB is allocated by PyTorch, and 825.00 MiB is reserved by PyTorch but "
           "unallocated." + TAIL)


def test_fake_oom_of_issue_11_is_fragmentation_with_its_arithmetic():
    d = diagnose(oom_text=ISSUE11)
    assert d.kinds == ["fragmentation"]
    f = d.findings[0]
    assert "expandable_segments:True" in f.fix and "cannot help" not in f.fix
    ev = " | ".join(f.evidence)
    # allocated + request fits under the cap ...
    assert "allocated 11.64 GiB + request 1.51 GiB = 13.15 GiB <= 13.50 GiB allowed" in ev
    # ... but the room for a new segment does not, and the cached bytes could not serve it
    assert "13.50 GiB - 12.45 GiB = 1.05 GiB < request 1.51 GiB" in ev
    assert "1.05 GiB + 825.00 MiB = 1.86 GiB >= request 1.51 GiB" in ev
    assert f.verified is None and any("record a snapshot" in n for n in d.notes)


def test_fragmentation_without_a_memory_fraction_counts_other_memory_out():
    # no fraction: the limit is what this process could reserve, reserved + free (context and others excluded)
    text = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.00 GiB "
            "is free. Including non-PyTorch memory, this process has 78.10 GiB memory in use. Of the allocated memory "
            "70.00 GiB is allocated by PyTorch, and 7.50 GiB is reserved by PyTorch but unallocated.")
    d = diagnose(oom_text=text)
    assert d.primary == "fragmentation"
    assert "reserved 77.50 GiB + free 1.00 GiB" in d.findings[0].evidence[0]
    # the same, with the request larger than allocated + everything this process could have
    big = text.replace("Tried to allocate 2.00 GiB", "Tried to allocate 9.00 GiB")
    assert diagnose(oom_text=big).primary == "too_large"


def test_a_margin_under_two_pages_is_not_promised_to_expandable_segments():
    # allocated + request fits by 10 MiB only: no allocator setting can be promised to make room
    text = ISSUE11.replace("1.51 GiB. GPU", "1.85 GiB. GPU")
    d = diagnose(oom_text=text)
    assert d.primary == "too_large" and any("under two 20 MiB pages" in e for e in d.findings[0].evidence)


def test_a_self_contradictory_message_is_refused():
    bad = FRAG.replace("of which 133.9 GiB is free", "of which 200.00 GiB is free")
    with pytest.raises(LabkitError, match="contradicts itself.*more than the total capacity"):
        diagnose(oom_text=bad)
    worse = FRAG.replace("this process has 5.52 GiB", "this process has 1.00 GiB")
    with pytest.raises(LabkitError, match="contradicts itself"):
        parse_oom_message(worse)


def test_fragmentation_checked_by_simulator():
    snap = to_snapshot(fragmentation_pattern(), "", cap_bytes=6 * GiB)
    d = diagnose(oom_text=FRAG, snapshot=snap)
    f = [x for x in d.findings if x.kind == "fragmentation"][0]
    assert f.simulator_check and "expandable_segments:True: reserved peak" in f.simulator_check
    # the simulator says: default OOMs (again), expandable segments do not
    assert "default: reserved peak 5.00 GiB, 1 OOM(s)" in f.simulator_check
    assert "expandable_segments:True: reserved peak" in f.simulator_check and ", 0 OOM(s), 1 of the recorded" in f.simulator_check
    assert f.verified is True and "the fix is confirmed by the simulator" in f.simulator_check


def test_growth_from_steps_and_from_trace():
    d = diagnose(step_allocated=[300 * MiB + i * 200 * MiB for i in range(12)])
    assert d.primary == "growth"
    # the arithmetic: the floor rose from 300 MiB to 1.86 GiB over the windows, ~200 MiB a step
    assert "~200.00 MiB per sample" in d.findings[0].evidence[0]
    series = [{"allocated_bytes.all.current": 1 * GiB + i * 100 * MiB, "reserved_bytes.all.current": 4 * GiB}
              for i in range(10)]
    d3 = diagnose(stats=series, cap_bytes=4 * GiB)
    assert d3.primary == "growth" and "limit 4.00 GiB is reached after about" in d3.findings[0].evidence[1]
    # a trace alone has no step marks: its rise is a note, not a finding (one big step rises the same way)
    d2 = diagnose(snapshot=to_snapshot(growth(steps=20), ""))
    assert "growth" not in d2.kinds and any("no step marks" in n for n in d2.notes)
    flat = diagnose(step_allocated=[500 * MiB + (i % 2) * MiB for i in range(12)])
    assert "growth" not in flat.kinds


def test_stats_cache_held_and_fragmentation():
    cache = {"allocated_bytes.all.current": 2 * GiB, "reserved_bytes.all.current": 20 * GiB,
             "inactive_split_bytes.all.current": 100 * MiB, "num_alloc_retries": 3}
    d = diagnose(stats=cache)
    assert d.primary == "cache_held" and any("num_alloc_retries = 3" in e for e in d.findings[0].evidence)
    frag = {"allocated_bytes.all.current": 2 * GiB, "reserved_bytes.all.current": 8 * GiB,
            "inactive_split_bytes.all.current": 5 * GiB}
    assert diagnose(stats=frag).primary == "fragmentation"


def test_imbalance_across_ranks():
    ranks = [{"rank": 0, "pid": 10, "stats": {"reserved_bytes.all.current": 2 * GiB}},
             {"rank": 1, "pid": 11, "stats": {"reserved_bytes.all.current": 2 * GiB}}]
    nvml = [{"gpu": 0, "used_bytes": 5 * GiB, "processes": [{"pid": 10, "used_bytes": 2 * GiB},
                                                             {"pid": 11, "used_bytes": 500 * MiB}]},
            {"gpu": 1, "used_bytes": 2500 * MiB, "processes": [{"pid": 11, "used_bytes": 2 * GiB}]}]
    d = diagnose(ranks=ranks, nvml=nvml)
    assert d.primary == "imbalance"
    assert any("stray CUDA contexts" in e for e in d.findings[0].evidence)


STRAY = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.50 GiB is "
         "free. Process 311 has 512.00 MiB memory in use. Process 312 has 512.00 MiB memory in use. Process 313 has "
         "512.00 MiB memory in use. Including non-PyTorch memory, this process has 76.61 GiB memory in use. Of the "
         "allocated memory 74.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.")


def test_stray_contexts_seen_in_a_rank_oom_message():
    d = diagnose(ranks=[{"rank": 0, "oom_text": STRAY}, {"rank": 1, "stats": {"reserved_bytes.all.current": 75 * GiB}}])
    assert "imbalance" in d.kinds and d.findings[0].rank == 0
    assert any("CUDA context" in e for e in d.findings[0].evidence)
