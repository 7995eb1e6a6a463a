"""Fake mode's CUDA autocast lists against the target's own: every op the H200's torch 2.11 gives an AutocastCUDA
kernel (its dispatch table, data/measurements/measure/dispatch_keys__h200.json) is in one of fake mode's lists or
reached only through one that is; nothing is in them that torch 2.11 does not autocast, save what a gate starts
later; and what autocast bans raises, as on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from labkit.core.paths import DATA_DIR
from labkit.core.provenance import load_measurement
from labkit.memory.script.runtime import fake_gpu
from labkit.memory.trace.fake.fake_cuda import (BANNED, FP32, FP32_FROM_2_12, FP32_SET_OPT_DTYPE, LOWER_PRECISION,
                                                 PROMOTE)

KEYS = load_measurement(DATA_DIR / "measurements" / "measure" / "dispatch_keys__h200.json", kind="dispatch_keys")
ON_H200 = {op.split("::")[1].split(".")[0] for op in KEYS["data"]["autocast_cuda"]}
OURS = LOWER_PRECISION | FP32 | FP32_SET_OPT_DTYPE | PROMOTE | BANNED
# autocast kernels of ops a model reaches only through an op on our lists (its kernel runs inside that one's)
REACHED_THROUGH = {
    "cudnn_convolution": "convolution", "cudnn_convolution_transpose": "convolution",
    "_cudnn_rnn": "the recurrent layers, whose dtype fake mode's cuDNN RNN takes from autocast (cudnn_rnn.py)",
    "_thnn_fused_lstm_cell": "lstm_cell", "_thnn_fused_gru_cell": "gru_cell",
}


def test_every_op_the_target_autocasts_is_on_a_list():
    assert KEYS["provenance"]["torch"].startswith("2.11") and len(ON_H200) > 80
    assert ON_H200 - OURS - set(REACHED_THROUGH) == set()


def test_the_lists_hold_nothing_the_target_does_not_autocast():
    # the composites fake mode casts at the Python level are named as torch names them; FP32_FROM_2_12 waits for 2.12
    assert OURS - ON_H200 == set()
    assert FP32_FROM_2_12 & ON_H200 == set()


def test_binary_cross_entropy_under_autocast_raises_as_on_the_gpu():
    with fake_gpu():
        p = torch.rand(8, 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="with_logits"):
            F.binary_cross_entropy(p, torch.zeros(8, 4, device="cuda"))
        assert F.binary_cross_entropy(p, torch.zeros(8, 4, device="cuda")).dtype == torch.float32
