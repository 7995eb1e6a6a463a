"""An allocator state (the segments a process holds) rebuilt in the simulator (labkit.allocator.sim.state)."""

import pytest

from labkit.allocator import CachingAllocatorSim
from labkit.allocator.sim.state import live_bytes, seed_segments
from labkit.core.errors import LabkitError

MiB = 1 << 20
# what the H200 corpus recording's cases started from (record_plain.py, base_segments): a 32 MiB cuBLAS
# workspace at the end of a 64 MiB segment whose first half is free, and a small segment with one block
STATE = [
    {"address": 0x7F0000000000, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
     "blocks": [[32 * MiB, "inactive"], [32 * MiB, "active_allocated"]]},
    {"address": 0x7F1000000000, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
     "blocks": [[512, "active_allocated"], [2 * MiB - 512, "inactive"]]},
]


def test_seeded_segments_and_live_blocks_are_the_states():
    sim = CachingAllocatorSim()
    seeded = seed_segments(sim, STATE)
    st = sim.memory_stats()
    assert (seeded.segments, st["segment.all.current"]) == (2, 2)
    assert seeded.reserved_bytes == st["reserved_bytes.all.current"] == 66 * MiB
    assert seeded.allocated_bytes == st["allocated_bytes.all.current"] == 32 * MiB + 512
    assert live_bytes(STATE) == 32 * MiB + 512


def test_the_free_space_in_a_held_segment_serves_the_next_request():
    sim = CachingAllocatorSim()
    seed_segments(sim, STATE)
    sim.malloc(30 * MiB)                                   # fits the free half: no new segment
    assert sim.memory_stats()["segment.all.current"] == 2
    sim.malloc(30 * MiB)                                   # does not: cudaMalloc
    assert sim.memory_stats()["segment.all.current"] == 3


@pytest.mark.parametrize("one_live_block_at, two_live_blocks_at, lands_in", [
    (0x7F2000000000, 0x7F1000000000, [16 * MiB, 16 * MiB]),
    (0x7F1000000000, 0x7F2000000000, [32 * MiB]),
])
def test_the_rebuilt_segments_keep_the_recorded_address_order(one_live_block_at, two_live_blocks_at, lands_in):
    # best fit takes the lowest address among equal-size free blocks: each segment has a free 32 MiB half
    # before its live blocks, and the request must land in the segment recorded lower
    def seg(address, live):
        return {"address": address, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
                "blocks": [[32 * MiB, "inactive"]] + [[n * MiB, "active_allocated"] for n in live]}

    sim = CachingAllocatorSim()
    seed_segments(sim, [seg(one_live_block_at, [32]), seg(two_live_blocks_at, [16, 16])])
    b, after = sim.malloc(32 * MiB), []
    while b.next is not None:
        b = b.next
        after.append(b.size)
    assert after == lands_in


def test_an_unsplittable_remainder_is_folded_into_the_block_before_it():
    state = [{"total_size": 20 * MiB, "segment_type": "large",
              "blocks": [[19 * MiB + 512 * 1024, "active_allocated"], [512 * 1024, "inactive"]]}]
    sim = CachingAllocatorSim()
    assert seed_segments(sim, state).allocated_bytes == 20 * MiB


@pytest.mark.parametrize("bad, says", [
    ({"segments": "x"}, "expected a list of segments"),
    ([{"total_size": 4 * MiB}], "segment 0 has no total_size/blocks"),
    ([{"total_size": 64 * MiB, "blocks": [[32 * MiB, "active_allocated"]]}], "do not add up to its total_size"),
])
def test_a_malformed_state_is_refused_naming_what_is_wrong(bad, says):
    with pytest.raises(LabkitError, match=says):
        seed_segments(CachingAllocatorSim(), bad)
