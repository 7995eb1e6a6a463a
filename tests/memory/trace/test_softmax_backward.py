"""CUDA's softmax backward forms ``grad * output`` before its kernel: fake mode holds that temporary
inside the op, which is where a step with SDPA's math path and recomputation peaks on the H200."""

from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.core.provenance import load_measurement
from labkit.memory.trace.fake.fake_cuda import CudaEmulator, CudaTarget, softmax_backward_temporaries
from labkit.memory.trace.storage import StorageTracker
from labkit.memory.trace.step import Probes
from labkit.workloads.corpus import Case, predict

RECORDED = Path(__file__).resolve().parents[3] / "data/measurements/measure/plain__ckpt_nodes.json"


def test_temporary_sizes_follow_the_kernel():
    g, out = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    assert softmax_backward_temporaries(g, out) == [2 * 3 * 8 * 8 * 4]
    # bfloat16 gradient against a float32 output (half_to_float): the product is float32
    assert softmax_backward_temporaries(g.bfloat16(), out) == [2 * 3 * 8 * 8 * 4]
    # a non-contiguous gradient: the product keeps its layout, then host_softmax_backward copies it
    assert softmax_backward_temporaries(g.transpose(-1, -2), out) == [2 * 3 * 8 * 8 * 4] * 2
    assert softmax_backward_temporaries(g, out.transpose(-1, -2)) == [2 * 3 * 8 * 8 * 4] * 2
    assert softmax_backward_temporaries(g[:0], out[:0]) == []


def test_fake_softmax_backward_peaks_with_the_product():
    n = 2 * 4 * 64 * 64 * 4            # bytes of each (2, 4, 64, 64) float32 tensor
    emu = CudaEmulator(CudaTarget(), None)
    with FakeTensorMode(), StorageTracker(device_type="meta", emulator=emu) as tr:
        x = torch.randn(2, 4, 64, 64, requires_grad=True)
        y = torch.softmax(x, -1)           # saved for backward
        g = torch.ones_like(y)
        tr.begin_phase("backward")
        y.backward(g)
    # x, y, g, the gradient of x and, inside the op, grad * output
    assert tr.phase_peaks[-1] == 5 * n


def _tiny_llama(checkpointing: bool) -> Case:
    o = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    return Case("tiny-llama-gqa-fp32", "transformers", "llama", "causal-lm", o, 2, 128, "fp32",
                recompute="full" if checkpointing else "none", checkpoint_impl="hf" if checkpointing else "torch")


def test_checkpointed_math_attention_peaks_inside_the_softmax_backward():
    """fp32 + GQA takes SDPA's math path on the H200 (torch 2.11); under HF gradient checkpointing the
    step peaks inside the attention's softmax backward, one (B, H, S, S) float32 product above what the
    op leaves live (its result, the incoming gradient, the recomputed probabilities)."""
    scores = 2 * 4 * 128 * 128 * 4                     # one (B, H, S, S) float32 tensor
    rep = predict(_tiny_llama(True), steps=1, probes=Probes(op_log=True))
    assert any(k.startswith("math") for k in rep.emulation["sdpa"])
    top = max(rep.op_log, key=lambda r: r.tracked_bytes)
    assert "_softmax_backward_data" in top.name and top.phase == "backward"
    assert rep.peak_bytes - top.tracked_bytes == scores


def test_recorded_h200_softmax_backward_holds_two_score_tensors():
    """The measurement the rule models: on the H200, SafeSoftmaxBackward0 of the math path peaks two
    (B, H, S, S) float32 tensors above its start (its result and grad * output), with and without HF
    gradient checkpointing; the checkpointed step's peak is that moment."""
    cases = load_measurement(RECORDED, kind="ckpt_nodes")["data"]["cases"]
    assert [c["case"]["checkpoint_impl"] for c in cases] == ["hf", "torch"]
    for c in cases:
        o = c["case"]["overrides"]
        scores = c["case"]["micro_batch"] * o["num_attention_heads"] * c["case"]["seq"] ** 2 * 4
        nodes = [n for n in c["nodes"]["nodes"] if n["node"] == "SafeSoftmaxBackward0"]
        assert len(nodes) == o["num_hidden_layers"]
        assert all(n["peak_inside"] - n["before"] == 2 * scores for n in nodes)
    hf = cases[0]
    assert hf["plain_peak_allocated"] == max(n["peak_inside"] for n in hf["nodes"]["nodes"])
