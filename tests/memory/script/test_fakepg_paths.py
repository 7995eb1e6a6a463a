"""Issue 26, item 3: the fake process group against NCCL's code path, recorded on one H200
(``benchmarks/gpu/record_fakepg_paths.py``, ``data/measurements/script/fakepg_paths.json``)."""

import os
from pathlib import Path

from labkit.core.provenance import load_measurement

REPO = Path(__file__).resolve().parents[3]
DOC = load_measurement(REPO / "data" / "measurements" / "script" / "fakepg_paths.json", "fakepg_paths")
ROWS = {(r["name"], r["mode"]): r for r in DOC["data"]}
SAME = ("peak_allocated", "peak_reserved", "allocations", "segments", "allocated_bytes_total")


def _pairs(prefix: str, other: str) -> list[tuple[dict, dict]]:
    return [(r, ROWS[(name, other)]) for (name, mode), r in ROWS.items()
            if name.startswith(prefix) and mode == "fake" and (name, other) in ROWS]


def test_every_case_ran_and_took_its_path():
    assert DOC["provenance"]["gpu_name"] == "NVIDIA H200" and len(ROWS) == 12
    for (name, mode), r in ROWS.items():
        assert r["status"] == "ok", (name, mode)
        routed = r["routed"]
        if mode == "nccl-path":
            assert r["inner_backend"] == "nccl" and routed["passed_through"] == 0, name
            if name.startswith("fsdp2"):     # 3 optimizer steps: every FSDP group's all-gathers and reduce-scatters
                assert routed["all_gather"] > 0 and routed["reduce_scatter"] > 0, name
            else:
                assert routed["all_reduce"] > 0, name


def test_fsdp2_allocates_the_same_on_nccls_path():
    """Rank 0 of FSDP2 at world 2 and 4 (float32, bf16 MixedPrecisionPolicy, with checkpointing), its collectives
    through a real ProcessGroupNCCL, and a real one-rank NCCL launch: the fake group's figures to the byte, and the
    same number of allocations and cudaMallocs."""
    pairs = _pairs("fsdp2", "nccl-path") + _pairs("fsdp2", "nccl-w1")
    assert len(pairs) == 5
    for fake, nccl in pairs:
        assert {k: fake[k] for k in SAME} == {k: nccl[k] for k in SAME}, fake["name"]
        assert fake["peak_allocated"] == fake["predicted"]["peak_allocated"] or fake["world_size"] == 1


def _gpt2_medium_params() -> int:
    """GPT2Config(n_layer=24, n_embd=1024, n_head=16): tied embeddings, biases, 1024 positions."""
    n_embd, n_layer, vocab, ctx = 1024, 24, 50257, 1024
    per_layer = 2 * n_embd + (n_embd * 3 * n_embd + 3 * n_embd) + (n_embd * n_embd + n_embd) + 2 * n_embd \
        + (n_embd * 4 * n_embd + 4 * n_embd) + (4 * n_embd * n_embd + n_embd)
    return vocab * n_embd + ctx * n_embd + n_layer * per_layer + 2 * n_embd


def test_ddp_holds_its_old_buckets_on_nccls_path():
    """DDP's allreduce is async: NCCL's stash keeps the buckets the rebuild before step 2 dropped, until the next
    allreduce. GPT-2 medium's float32 gradients (every bucket) are what the NCCL path holds more, from step 2 on."""
    (fake, nccl), = _pairs("ddp", "nccl-path")
    params = _gpt2_medium_params()
    extra = nccl["peak_allocated"] - fake["peak_allocated"]
    assert abs(extra - 4 * params) < 0.001 * 4 * params, (extra, 4 * params)
    assert nccl["step_cumulative_peaks"][0] == fake["step_cumulative_peaks"][0]     # no rebuild before step 1
    assert nccl["allocations"] == fake["allocations"]                              # the same tensors, held longer


def test_ddp_extra_is_not_the_watchdogs_timing():
    """The same DDP case with the GPU idle 0.3 s after each step (longer than NCCL's 100 ms watchdog period): NCCL's
    path holds the same bytes as without the pause, and the group still holds one set of buckets after the
    script's end (the model and DDP gone)."""
    pause = load_measurement(REPO / "data" / "measurements" / "script" / "fakepg_paths_pause.json", "fakepg_paths")
    rows = {r["mode"]: r for r in pause["data"]}
    assert all(r["status"] == "ok" and r["step_pause_s"] == 0.3 for r in rows.values())
    before = ROWS[("ddp-gpt2-w2", "nccl-path")]
    assert {k: rows["nccl-path"][k] for k in SAME} == {k: before[k] for k in SAME}
    assert {k: rows["fake"][k] for k in SAME} == {k: ROWS[("ddp-gpt2-w2", "fake")][k] for k in SAME}
    held_at_end = rows["nccl-path"]["end_allocated"] - rows["fake"]["end_allocated"]
    assert held_at_end == 4 * _gpt2_medium_params()


def test_a_one_rank_nccl_communicator_outside_the_allocator():
    """Device memory in use minus the allocator's reserve at each step: a one-rank NCCL communicator adds
    hundreds of MiB outside the allocator (NCCL's own buffers and kernels)."""
    fake, nccl = ROWS[("fsdp2-llama-mp-w1", "fake")], ROWS[("fsdp2-llama-mp-w1", "nccl-w1")]
    extra = nccl["outside_allocator_at_steps"][-1] - fake["outside_allocator_at_steps"][-1]
    assert 256 * 2**20 < extra < 1024 * 2**20, extra


DDP_ON_CPU = '''
import os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")            # becomes the fake group of the recorder's child
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
print("rank", dist.get_rank(), "of", dist.get_world_size(), "grad", float(model.module.weight.grad.abs().sum()) > 0)
'''


def test_the_recorders_child_runs_a_ddp_script_on_the_fake_group(tmp_path, bench_script):
    """benchmarks/gpu/script_child.py, as record_scripts.py and record_fakepg_paths.py start it: the script's own
    init_process_group becomes rank 0 of a fake world of 2, DDP gets the in-place hook (a hook DDP would refuse, as
    an annotated one was, fails the run), and the child's one result line comes back."""
    child = bench_script("script_child")
    (tmp_path / "ddp.py").write_text(DDP_ON_CPU)
    wrapper = "import sys, script_child as c; c.fake_process_group(2); c.ddp_comm_hook(); c.run_script(sys.argv[1], world=2)"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}
    row, err, rc = child.run_child(wrapper, [str(tmp_path / "ddp.py")], env=env, cwd=tmp_path, timeout=120)
    assert rc == 0 and row["status"] == "ok", err[-2000:]
    assert row["world"] == 2 and row["wall_s"] > 0 and "peak_allocated" not in row     # no GPU here: no peaks
    row, err, rc = child.run_child("raise SystemExit(3)", [], env=env, cwd=tmp_path, timeout=60)
    assert rc == 3 and row["status"] == "no result (rc 3)"
