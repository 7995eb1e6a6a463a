"""F.rms_norm on the fake GPU as a CUDA build runs it (labkit.memory.trace.fake.rms_norm): one fused kernel from torch
2.9 that saves the input and a float32 rstd per row, where a CPU build's composite also saves the normalised input;
the composite wherever the GPU keeps it (a weight of another dtype, an older target torch)."""

import pytest
import torch
import torch.nn as nn

from labkit.memory.script.runtime import fake_gpu
from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.fake.rms_norm import fused_applies

ROWS, DIM = 4096, 1024
MIB = 2**20


def _kept_by_forward(target: CudaTarget | None = None, weight_dtype: torch.dtype = torch.float32) -> int:
    """Bytes a forward of nn.RMSNorm over a float32 input keeps for backward (the output freed)."""
    with fake_gpu(target=target) as _:
        norm = nn.RMSNorm(DIM).to("cuda", weight_dtype)
        x = torch.randn(ROWS, DIM, device="cuda", requires_grad=True)
        before = torch.cuda.memory_allocated()
        y = norm(x)
        kept = torch.cuda.memory_allocated() - before - y.untyped_storage().nbytes()
        y.sum().backward()
        assert x.grad.shape == x.shape and norm.weight.grad.shape == (DIM,)
    return kept


def test_the_fused_kernel_keeps_only_rstd_beside_the_input():
    assert _kept_by_forward() == ROWS * 4                      # rstd, float32 per row; the input is the caller's


def test_the_composite_runs_where_the_gpu_runs_it():
    fused = _kept_by_forward()
    # a bf16 weight over a float32 input: rms_norm_symint warns and takes rms_norm_composite, which saves x * rstd
    assert _kept_by_forward(weight_dtype=torch.bfloat16) >= fused + ROWS * DIM * 4
    # torch 2.8 had no fused kernel (targets/torch_gates.json fused_rms_norm)
    assert _kept_by_forward(CudaTarget(torch_version="2.8")) >= fused + ROWS * DIM * 4


@pytest.mark.parametrize("case, fused", [
    (dict(shape=(2, 8, 4, 4), fmt=torch.channels_last), False),    # channels-last: the composite
    (dict(shape=(2, 8, 4, 4), fmt=torch.contiguous_format), True),
    (dict(shape=(8, 16), dtype=torch.complex64), False),
])
def test_which_inputs_take_the_fused_kernel(case, fused):
    x = torch.randn(*case["shape"], dtype=case.get("dtype", torch.float32))
    if "fmt" in case:
        x = x.contiguous(memory_format=case["fmt"])
    assert fused_applies(x, None, "2.11") is fused
