"""The driver's placement of new segments (labkit.allocator.sim.driver_va), against the H200's recorded streams."""

import gzip
import json
from pathlib import Path

import pytest

from labkit.allocator import CachingAllocatorSim
from labkit.allocator.sim.driver_va import RANGE, DriverVA

MiB = 1 << 20
STREAMS = Path(__file__).resolve().parents[2] / "data/measurements/measure/alloc_stream"


def test_ranges_are_rounded_to_32_mib_and_handed_out_top_down():
    va = DriverVA(top=1 << 40)
    a = va.place(1960 * MiB)
    b = va.place(1960 * MiB)
    assert RANGE == 32 * MiB and a - b == 1984 * MiB and (1 << 40) - a == 1984 * MiB


def test_a_segment_that_fits_the_unused_end_of_a_range_goes_there_lowest_first():
    va = DriverVA(top=1 << 40)
    hi = va.place(36 * MiB)           # range of 64 MiB: 28 MiB unused above it
    lo = va.place(36 * MiB)           # the next range below, 28 MiB unused too
    assert va.place(20 * MiB) == lo + 36 * MiB       # the lower of the two holes
    assert va.place(28 * MiB) == hi + 36 * MiB
    assert va.place(8 * MiB) == lo + 56 * MiB        # what the 20 MiB left
    assert va.place(30 * MiB) == lo - 32 * MiB       # nothing fits: a new range


def test_freed_neighbours_merge_into_one_hole():
    va = DriverVA(top=1 << 40)
    a, b, c = (va.place(64 * MiB) for _ in range(3))          # c < b < a, adjacent
    va.release(a, 64 * MiB)
    va.release(c, 64 * MiB)
    va.release(b, 64 * MiB)
    assert va.holes == [(c, 192 * MiB)]
    assert va.place(192 * MiB) == c


def test_a_freed_segment_is_reused():
    va = DriverVA(top=1 << 40)
    a = va.place(64 * MiB)
    va.place(64 * MiB)
    va.release(a, 64 * MiB)
    assert va.place(64 * MiB) == a


def _replay(doc, sim):
    acts = doc["actions"]
    alloc, done = acts.index("alloc"), acts.index("free_completed")
    live = {}
    for act, addr, size, stream, _, _ in doc["trace"]:
        if act == alloc:
            live[addr] = sim.malloc(size, stream)
        elif act == done and addr in live:
            sim.free(live.pop(addr))
    return sim.memory_stats()["reserved_bytes.all.peak"]


def _load(name):
    return json.loads(gzip.decompress((STREAMS / f"stream__{name}.json.gz").read_bytes()))


def _recorded_addresses(doc):
    seg = doc["actions"].index("segment_alloc")
    return [(r[2], r[1]) for r in doc["trace"] if r[0] == seg]


class _TopDown(DriverVA):
    """Every segment below the last, no reuse of a range's unused end (the simulator before this model)."""

    def place(self, size):
        return self.reserve(size, 2 * MiB)


def test_bloom_reserves_what_the_h200_reserved_with_the_drivers_placement_and_11_percent_less_without():
    # best fit breaks ties between equal-size free blocks by address: BLOOM amp-bf16's recorded requests
    # (a cold process) reserve the H200's 19.80 GB with the driver's addresses and with the model's;
    # with plain top-down addresses, 2 GB less
    doc = _load("bloom-b2-amp-bf16__cold")
    recorded = doc["case"]["step_peaks_reserved"][-1]
    assert _replay(doc, CachingAllocatorSim(address_oracle=_recorded_addresses(doc))) == recorded == 19_799_212_032
    assert _replay(doc, CachingAllocatorSim()) == recorded
    plain = CachingAllocatorSim()
    plain._va = _TopDown()
    assert (recorded - _replay(doc, plain)) / recorded > 0.10


# stream -> why the placement model is off on it
PLACEMENT_GAPS = {
    "mistral-b4-ckpt2-nocache-amp-bf16__fresh": "11.39 GB with the model's addresses, the H200's 10.86 GB with its own: "
                                                "the driver's placement in a fresh process is not fully modelled (fake mode's "
                                                "requests, which still free some blocks in another order, reserve 10.86 GB "
                                                "with the model's addresses: the two differences cancel on this loop)",
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.xfail(reason=PLACEMENT_GAPS[n], strict=True)] if n in PLACEMENT_GAPS else [])
    for n in sorted(p.name[len("stream__"):-len(".json.gz")] for p in STREAMS.glob("stream__*.json.gz"))])
def test_every_recorded_stream_replays_as_with_the_drivers_own_addresses(name):
    doc = _load(name)
    real = _replay(doc, CachingAllocatorSim(address_oracle=_recorded_addresses(doc)))
    model = _replay(doc, CachingAllocatorSim())
    assert abs(model - real) <= 0.005 * real, (name, model, real)


def test_the_same_requests_reserve_either_figure_two_recordings_measured_depending_on_the_segments_addresses():
    # llama-gqa-b8-ckpt3-amp-bf16 after a cold case: record_alloc_stream.py's process reserved 21.58 GB,
    # record_plain.py's (twice) 23.63 GB, both starting from the same segments (88 + 32 MiB, the cuBLAS
    # workspaces'); this stream's requests from those segments, under random segment orders, reserve one or the other
    from labkit.allocator.sim.driver_va import ShuffledVA
    from labkit.allocator.sim.state import seed_segments
    from labkit.memory.trace.corpus_check import load_plain

    doc = _load("llama-gqa-b8-ckpt3-amp-bf16__after-cold")
    rec = next(r for r in load_plain() if r.name == "llama-gqa-b8-ckpt3-amp-bf16")
    assert (doc["case"]["step_peaks_reserved"][-1], rec.peak_reserved) == (21_581_791_232, 23_626_514_432)
    for tag in "BC":                                        # record_plain.py's repeats: the same 23.63 GB
        (again,) = [r for r in load_plain(STREAMS.parent / f"plain__repeat_ckpt_every_k_{tag}.json") if r.name == rec.name]
        layout = [[(s["total_size"], [tuple(b) for b in s["blocks"]]) for s in r.base_segments] for r in (again, rec)]
        assert again.peak_reserved == rec.peak_reserved and layout[0] == layout[1]     # addresses are per process

    def replay(va=None):
        sim = CachingAllocatorSim(address_space=va)
        seed_segments(sim, rec.base_segments)
        return _replay(doc, sim)

    assert replay() == 21_579_694_080                       # the driver's placement in a fresh address space
    got = {round(replay(ShuffledVA(seed)) / 1e8) / 10 for seed in range(12)}
    assert {21.5, 23.6} <= got, got


def test_where_fake_mode_misses_a_fresh_process_the_h200s_own_requests_replay_exactly():
    # the three cases of plain__fresh.json fake mode missed on reserved before autocast cast an op's arguments last
    # to first (fake_cuda.cast_arguments), each recorded again as the only case of a new process
    # (summary__fresh_misses.json, the same reserved bytes as plain__fresh.json): for two, the H200's own requests
    # reserve the H200's bytes with the model's addresses, so what differed was fake mode's requests, not placement
    from labkit.core.provenance import load_measurement
    from labkit.memory.trace.corpus_check import load_plain

    runs = load_measurement(STREAMS / "summary__fresh_misses.json", kind="measure_alloc_stream")["data"]["runs"]
    fresh = {r.name: r for r in load_plain(process="fresh")}
    for run in runs:
        assert run["step_peaks_reserved"][-1] == fresh[run["case"]].peak_reserved
    for name in ("llama-gqa-b8-ckpt3-amp-bf16", "gpt2-medium-b8-ckpt2-amp-bf16"):
        doc = _load(f"{name}__fresh")
        assert _replay(doc, CachingAllocatorSim()) == fresh[name].peak_reserved


def test_a_fresh_llama_allocates_its_forward_cublas_workspace_at_the_rotary_embedding():
    # transformers 5.17's rotary embedding computes its frequencies with a float32 bmm, the forward's first cuBLAS
    # call: the first 32 MiB request of the H200's fresh stream comes from there (corpus_check.recorded_rotary)
    doc = _load("llama-gqa-b8-ckpt3-amp-bf16__fresh")
    alloc = doc["actions"].index("alloc")
    first = next(r for r in doc["trace"] if r[0] == alloc and r[2] == 32 * MiB)
    assert "modeling_llama.py:122:forward" in str(doc["frames"][first[5]])


def test_shuffled_segments_never_overlap():
    from labkit.allocator.sim.driver_va import ShuffledVA

    va = ShuffledVA(0, top=1 << 40)
    spans = sorted((va.place(s), s) for s in [2 * MiB, 64 * MiB, 1960 * MiB] * 20)
    assert all(a + s <= b for (a, s), (b, _) in zip(spans, spans[1:]))


def test_a_shuffled_reservation_never_overlaps_a_placed_segment():
    from labkit.allocator.sim.driver_va import ShuffledVA

    va = ShuffledVA(1, top=1 << 38)
    spans = [(va.place(64 * MiB), 64 * MiB) for _ in range(50)] + [(va.reserve(4 << 30, 2 * MiB), 4 << 30)]
    spans.sort()
    assert all(a + s <= b for (a, s), (b, _) in zip(spans, spans[1:]))
