"""Rules that make fake mode's allocation stream the GPU's (each checked against a recorded H200 stream,
benchmarks/gpu/record_alloc_stream.py): cuDNN's one-block SDPA backward workspace and the temporaries
inside ``_safe_softmax``."""

import torch

from labkit.memory.trace.fake_cuda import CudaEmulator, cudnn_backward_workspace


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


def _step_allocs(name: str, step: str = "step2", where: str = "") -> list[int]:
    """Requested sizes of the allocations the GPU made during ``step`` of a recorded run (with ``where``:
    only those whose Python frames mention it; the autograd thread's have none)."""
    doc = json.loads(gzip.decompress((STREAMS / f"stream__{name}__warm.json.gz").read_bytes()))
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


def test_recorded_safe_softmax_masks_one_bool_block_per_layer_and_no_second_result():
    sizes = _step_allocs("mistral-b4-fp32", where="sdpa_attention")    # the forward's attention calls
    scores = 4 * 16 * 2048 * 2048          # batch 4, 16 heads, 2048 x 2048
    assert sizes.count(scores) == 6                      # the bool mask, one per layer (6)
    assert sizes.count(4 * scores) == 6 * 2              # fp32 scores and softmax's own result: no where() copy
