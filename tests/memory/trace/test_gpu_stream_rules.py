"""Rules that make fake mode's allocation stream the GPU's (each checked against a recorded H200 stream,
benchmarks/gpu/record_alloc_stream.py): cuDNN's one-block SDPA backward workspace and the temporaries
inside ``_safe_softmax``."""

import torch

from labkit.memory.trace.fake.fake_cuda import CudaEmulator, cudnn_backward_workspace


def test_cudnn_backward_workspace_matches_the_h200_blocks():
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(8, 12, 1024, 64, **meta)                        # GPT-2 b8: 12 heads, D 64
    assert cudnn_backward_workspace(q, q, q) == 25_559_296
    q, kv = torch.empty(2, 4, 1024, 256, **meta), torch.empty(2, 1, 1024, 256, **meta)   # Gemma 3 b2, GQA 4:1
    assert cudnn_backward_workspace(q, kv, kv) == 16_810_240


class _Rec:
    def __init__(self) -> None:
        self.groups = []

    def transient_group(self, sizes):
        self.groups.append(list(sizes))


def test_safe_softmax_holds_its_mask_temporaries_after_its_result():
    rec = _Rec()
    CudaEmulator._safe_softmax_inner((torch.empty(2, 4, 8, 16, device="meta"), -1), {}, rec)
    assert rec.groups == [[2 * 4 * 8 * 16, 2 * 4 * 8, 4]]   # bool mask, bool row flags, a float scalar


# ---- against the recorded H200 streams (data/measurements/measure/alloc_stream, record_alloc_stream.py)

import gzip  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

STREAMS = Path(__file__).resolve().parents[3] / "data/measurements/measure/alloc_stream"


def _step_allocs(name: str, step: str = "step2", where: str = "", run: str = "warm") -> list[int]:
    """Requested sizes of the allocations the GPU made during ``step`` of a recorded run (with ``where``:
    only those whose Python frames mention it; the autograd thread's have none)."""
    doc = json.loads(gzip.decompress((STREAMS / f"stream__{name}__{run}.json.gz").read_bytes()))
    marks = dict(doc["marks"])
    after = [t for _, t in doc["marks"] if t > marks[step]]
    t0, t1 = marks[step], min(after)
    alloc = doc["actions"].index("alloc")
    return [size for act, _, size, _, t, f in doc["trace"]
            if act == alloc and t0 <= t < t1 and where in doc["frames"][f]]


def test_recorded_cudnn_backward_takes_one_block_of_that_size_per_layer():
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(8, 12, 1024, 64, **meta)
    assert _step_allocs("gpt2-b8-bf16").count(cudnn_backward_workspace(q, q, q)) == 12          # 12 layers
    q, kv = torch.empty(2, 4, 1024, 256, **meta), torch.empty(2, 1, 1024, 256, **meta)
    assert _step_allocs("gemma3-b2-amp-bf16").count(cudnn_backward_workspace(q, kv, kv)) == 8   # 8 layers


def test_autocast_casts_an_ops_arguments_last_to_first_as_the_h200_did():
    from torch.utils._python_dispatch import TorchDispatchMode

    # GPT-2's Conv1D runs addmm(bias, x, weight); under amp-bf16 the H200 requested the copies weight first
    conv1d = _step_allocs("gpt2-medium-b8-ckpt2-amp-bf16", where="pytorch_utils.py:119", run="fresh")
    assert conv1d[:3] == [1024 * 3072 * 2, 8 * 1024 * 1024 * 2, 3072 * 2]     # weight, input, bias (bf16)

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    w, b = torch.nn.Parameter(torch.randn(16, 24)), torch.nn.Parameter(torch.randn(24))
    w2, b2 = torch.nn.Parameter(torch.randn(8, 16)), torch.nn.Parameter(torch.randn(8))
    x = torch.randn(4, 16)
    autocast, _ = _autocast_mode()
    with Casts() as casts, autocast:
        torch.addmm(b, x, w)
        torch.nn.functional.linear(x, weight=w2, bias=b2)             # keywords too: bias, weight, input
    assert casts.shapes == [(16, 24), (4, 16), (24,), (8,), (8, 16), (4, 16)]


def _autocast_mode():
    from labkit.memory.trace.fake.fake_cuda import CudaAutocast, _AutocastState

    state = _AutocastState()
    return CudaAutocast(torch.bfloat16, state), state


def test_recorded_safe_softmax_masks_one_bool_block_per_layer_and_no_second_result():
    sizes = _step_allocs("mistral-b4-fp32", where="sdpa_attention")    # the forward's attention calls
    scores = 4 * 16 * 2048 * 2048          # batch 4, 16 heads, 2048 x 2048
    assert sizes.count(scores) == 6                      # the bool mask, one per layer (6)
    assert sizes.count(4 * scores) == 6 * 2              # fp32 scores and softmax's own result: no where() copy


# ---- embedding backward and attention layouts (OPT bf16, stream__opt-b4-bf16__*.json.gz)

from labkit.memory.trace.fake.embedding_backward import embedding_backward_temporaries  # noqa: E402


def _opt_embedding_partials(num_weights: int) -> int:
    grad = torch.empty(4, 1024, 2048, device="meta", dtype=torch.bfloat16)
    ids = torch.empty(4, 1024, device="meta", dtype=torch.long)
    return max(embedding_backward_temporaries(grad, ids, num_weights))


def test_recorded_embedding_backward_takes_the_partial_sums_block_of_each_table():
    token, position = _opt_embedding_partials(50272), _opt_embedding_partials(2050)
    assert (token, position) == (4505 * 2048 * 4, 2459 * 2048 * 4)
    for run in ("warm", "cold"):
        doc = json.loads(gzip.decompress((STREAMS / f"stream__opt-b4-bf16__{run}.json.gz").read_bytes()))
        alloc = doc["actions"].index("alloc")
        sizes = [r[2] for r in doc["trace"] if r[0] == alloc]
        assert sizes.count(token) == 4 and sizes.count(position) == 4     # one each per step, 4 steps


def test_embedding_backward_takes_no_buffers_on_the_atomic_path_and_a_float32_copy_when_fused():
    meta = dict(device="meta")
    small = embedding_backward_temporaries(torch.empty(3072, 64, **meta), torch.empty(3072, dtype=torch.long, **meta), 100)
    assert small == []
    # few rows, narrow table: sum_and_scatter would launch < 4 blocks per SM, so the fused atomic kernel runs
    g, ids = torch.empty(8192, 64, dtype=torch.bfloat16, **meta), torch.empty(8192, dtype=torch.long, **meta)
    fused = embedding_backward_temporaries(g, ids, 16)
    assert 16 * 64 * 4 in fused and (8192 // 10 + 16) * 64 * 4 not in fused


class _Attention(torch.nn.Module):
    """q, k, v projections viewed (B, H, S, D) as Hugging Face models make them; ``cat_kv``: k and v made
    contiguous first, as OPT's ``DynamicCache.update`` does in the recorded H200 stream."""

    def __init__(self, cat_kv: bool, e: int = 256, h: int = 4):
        super().__init__()
        self.cat_kv, self.h = cat_kv, h
        self.q, self.k, self.v = (torch.nn.Linear(e, e) for _ in range(3))

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = (m(x).view(b, s, self.h, e // self.h).transpose(1, 2) for m in (self.q, self.k, self.v))
        if self.cat_kv:
            k, v = k.contiguous(), v.contiguous()
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(b, s, e)


def _backward_allocs(cat_kv: bool, block: int) -> tuple[int, dict]:
    from labkit.memory.trace.step import Probes, measure_step
    from labkit.workloads import StepPolicy

    rep = measure_step(lambda: _Attention(cat_kv).bfloat16(), torch.randn(2, 1024, 256, dtype=torch.bfloat16),
                       StepPolicy(precision="bf16"), loss_fn=lambda out, b: out.float().sum(), steps=1,
                       probes=Probes(op_log=True))
    grew = [r for r in rep.op_log if r.phase == "backward" and r.out_bytes >= block]
    return len(grew), rep.emulation["sdpa"]


def test_cudnn_gradients_keep_each_inputs_layout_so_a_contiguous_key_and_value_cost_a_copy_each():
    # cuDNN's backward allocates dq, dk, dv like q, k, v (the CPU kernel: (B, S, H, D) for all): gradients of
    # a contiguous k and v must be copied for the view back to (B, S, E); a transposed view's need not
    block = 2 * 1024 * 256 * 2
    views, backend = _backward_allocs(False, block)
    cat, _ = _backward_allocs(True, block)
    assert [k.split(" ")[0] for k in backend] == ["cudnn"]
    assert cat - views == 2
