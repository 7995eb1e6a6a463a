"""The Python-level GPU choices of fake mode other than attention (fake_runtime)."""

import torch
import torch.nn.functional as F

from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy


class DropoutBlock(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x):
        return F.dropout(self.lin(x), self.p, self.training)


def _forward_kept(p, target=None):
    rep = measure_step(lambda: DropoutBlock(p), torch.randn(512, 256), loss_fn=lambda out, b: out.sum(),
                       fake=FakeCuda(target=target))
    f = next(ph for ph in rep.by_phase if ph.phase == "forward")
    return f.end_bytes - f.start_bytes


def test_dropout_keeps_a_boolean_mask_as_cudas_fused_kernel_does():
    n = 512 * 256
    # dropout output (float32) + its boolean mask; the linear's output is not needed by backward
    assert _forward_kept(0.1) == n * 4 + n
    assert _forward_kept(0.0) == n * 4                   # p = 0: no mask
    # the CPU kernels (plain target) keep a float32 noise tensor and the linear output instead
    assert _forward_kept(0.1, CudaTarget.plain()) > n * 4 + n


class MHABlock(torch.nn.Module):
    """torchvision's ViT attention: ``nn.MultiheadAttention(batch_first=True)`` called as self-attention
    without weights (training: ``F.multi_head_attention_forward``, SDPA on views of its packed projection)."""

    def __init__(self, e=64, h=4):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(e, h, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def _mha_step(precision, observers=()):
    return measure_step(MHABlock, torch.randn(4, 16, 64), StepPolicy(precision=precision),
                        loss_fn=lambda out, b: out.float().sum(), steps=1, probes=Probes(observers=observers))


def test_multihead_attention_body_runs_under_autocast_and_the_sdpa_rules():
    # F.multi_head_attention_forward reaches a function mode as one call; on the GPU its projections are
    # autocast to bf16 and its SDPA call is dispatched by sdp_utils like any other
    dtypes = []

    def seen(func, args, kwargs, out, phase):
        if phase == "forward" and str(func).startswith(("aten.addmm", "aten.mm")):
            dtypes.append(out.dtype)

    rep = _mha_step("amp-bf16", observers=(seen,))
    assert dtypes and set(dtypes) == {torch.bfloat16}, dtypes            # in_proj and out_proj
    assert list(rep.emulation["sdpa"]) == ["cudnn"]                     # bf16, head_dim 16: cuDNN on the H200
    rep = _mha_step("fp32")
    assert [k.split(" ")[0] for k in rep.emulation["sdpa"]] == ["efficient"]


def test_mem_efficient_output_layout_costs_multihead_attention_one_copy(monkeypatch):
    # attention.cu allocates the mem-efficient output (B, S, H, D); MHA's q/k/v views are laid out
    # (S, B, H, D), so MHA's permute(2, 0, 1, 3).contiguous() copies the output on the GPU and the
    # output projection keeps that copy for backward: one (S, B, E) float32 tensor more per layer
    from labkit.memory.trace.fake.fake_cuda import CudaEmulator

    def kept():
        f = next(ph for ph in _mha_step("fp32").by_phase if ph.phase == "forward")
        return f.end_bytes - f.start_bytes

    with_rule = kept()
    monkeypatch.setattr(CudaEmulator, "_gpu_layout", lambda self, *a: NotImplemented)
    assert with_rule - kept() == 16 * 4 * 64 * 4


def test_trunc_normal_initialises_in_place_as_the_targets_torch_does():
    """torch 2.12 rewrote ``nn.init.trunc_normal_`` as rejection sampling (pull request #174997,
    ``targets/torch_gates.json``): its masks are tensors of the weight's size, which a model built on the device takes
    from the caching allocator. The H200's 2.11 sampled in place; fake mode runs the target's version."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from labkit.memory.trace.fake.fake_runtime import recorded_init
    from labkit.memory.trace.fake.sdpa import parse_version
    from labkit.memory.trace.fake.targets import TORCH_GATES

    class NewTensors(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.made += sum(isinstance(o, torch.Tensor) and not any(o is a for a in args)
                             for o in (out if isinstance(out, (tuple, list)) else (out,)))
            return out

    def made(target):
        w = torch.empty(256, 64)
        with recorded_init(target), NewTensors() as mode:
            torch.nn.init.trunc_normal_(w, std=0.02, a=-0.04, b=0.04)
        assert w.abs().max() <= 0.04 and 0.01 < w.std() < 0.02
        return mode.made

    assert "https://github.com/pytorch/pytorch/pull/174997" in TORCH_GATES.source("trunc_normal_rejection")
    assert made("2.11") == 0                                        # uniform_, erfinv_, mul_, add_, clamp_: in place
    rejection = parse_version(torch.__version__) >= parse_version(TORCH_GATES["trunc_normal_rejection"]["torch"])
    assert (made("2.13") > 0) == rejection                          # the installed torch's own: masks where 2.12+
    assert torch.nn.init._no_grad_trunc_normal_.__module__ == "torch.nn.init"      # restored
