"""Fake mode's SDPA backend choice against the H200's own, call by call.

data/measurements/measure/sdpa_choice__h200.json holds ``torch._fused_sdp_choice`` on the H200 (torch 2.11, cuDNN
9.19) for 4,320 calls: three dtypes, four sequence lengths, five head dims, eight kinds of mask (boolean, additive,
broadcast over batch or heads, requiring grad or not), causal or not, dropout or not, inputs requiring grad or not,
GQA or not (benchmarks/gpu/record_sdpa_choice.py). :func:`select_backend` must name the same backend for every one.
"""

import json
from collections import Counter

import pytest
import torch

from labkit.core.paths import REPO_ROOT
from labkit.core.provenance import load_measurement
from labkit.memory.trace.fake.sdpa import select_backend

RECORDING = REPO_ROOT / "data" / "measurements" / "measure" / "sdpa_choice__h200.json"


@pytest.fixture(scope="module")
def recorded():
    return load_measurement(RECORDING, kind="sdpa_choice")


def test_every_recorded_call_gets_the_gpus_backend(recorded, bench_script):
    tensors = bench_script("record_sdpa_choice").tensors
    rows = recorded["data"]["rows"]
    assert len(rows) == 4320 and recorded["provenance"]["torch"].startswith("2.11")
    # the grid exercises every backend, so a rule that names one backend for everything fails
    assert set(Counter(r["backend"] for r in rows)) == {"cudnn", "flash", "efficient", "math"}
    wrong = []
    for r in rows:
        q, k, v, mask = tensors(r, "meta")
        got = select_backend(q, k, v, mask, r["dropout_p"], r["is_causal"], r["enable_gqa"]).backend
        if got != r["backend"]:
            wrong.append((json.dumps({x: r[x] for x in ("dtype", "S", "D", "mask", "is_causal", "dropout_p", "grad",
                                                         "enable_gqa")}), r["backend"], got))
    assert not wrong, f"{len(wrong)} of {len(rows)} calls differ, e.g. {wrong[:3]}"


def test_a_learned_bias_runs_mem_efficient_as_the_profiler_saw(recorded):
    """A mask that requires grad (a learned relative-position bias, as timm's CoAtNet and MaxViT pass one) runs the
    mem-efficient kernels forward and backward on the H200, in float32 and bfloat16; fake mode once sent it to the
    math path, which keeps the float32 scores of every head."""
    ran = recorded["data"]["ran"]
    assert ran and all(r["mask"].endswith("_grad") for r in ran)
    for r in ran:
        assert r["backend"] == "efficient"
        assert "aten::_efficient_attention_backward" in r["ran"] and "aten::_efficient_attention_forward" in r["ran"]
    q = torch.empty(2, 4, 196, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    bias = torch.empty(1, 4, 196, 196, dtype=torch.bfloat16, device="meta", requires_grad=True)
    assert select_backend(q, q, q, bias).backend == "efficient"
