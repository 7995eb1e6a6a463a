"""The Python-level GPU choices of fake mode other than attention (fake_runtime)."""

import torch
import torch.nn.functional as F

from labkit.memory.trace.fake_cuda import CudaTarget
from labkit.memory.trace.step import measure_step


class DropoutBlock(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x):
        return F.dropout(self.lin(x), self.p, self.training)


def _forward_kept(p, target=None):
    rep = measure_step(lambda: DropoutBlock(p), torch.randn(512, 256), loss_fn=lambda out, b: out.sum(),
                       target=target)
    f = next(ph for ph in rep.by_phase if ph.phase == "forward")
    return f.end_bytes - f.start_bytes


def test_dropout_keeps_a_boolean_mask_as_cudas_fused_kernel_does():
    n = 512 * 256
    # dropout output (float32) + its boolean mask; the linear's output is not needed by backward
    assert _forward_kept(0.1) == n * 4 + n
    assert _forward_kept(0.0) == n * 4                   # p = 0: no mask
    # the CPU kernels (plain target) keep a float32 noise tensor and the linear output instead
    assert _forward_kept(0.1, CudaTarget.plain()) > n * 4 + n
