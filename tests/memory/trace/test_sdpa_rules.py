"""SDPA backend selection as PyTorch's ``select_sdp_backend`` decides it, and what each choice keeps.

Expected choices follow pytorch/pytorch ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
(commit 001f694a: ``priority_order``/``check_prefer_cudnn_attention``, ``can_use_cudnn_attention`` with
``check_cudnn_tensor_shapes``/``check_cudnn_dropout``/``check_attn_mask_shape``,
``can_use_flash_attention`` with ``check_for_attn_mask``/``check_head_dim_size_flash``/
``check_flash_causal_non_square_seqlens``/``check_dtypes_flash_attention``,
``can_use_mem_efficient_attention`` with ``check_head_dim_size_mem_efficient``/``minimum_gemm_alignment``;
commit 21c3369e for the torch 2.4 priority list) and ``sdp_utils_cpp.h`` (commit 0119c205:
``check_batch_size_and_num_heads_dense``, ``check_grouped_query_attention``,
``check_last_dim_stride_equals_1_dense``, ``check_tensor_shapes``).
"""

import pytest
import torch
import torch.nn.functional as F

from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.fake.sdpa import SdpaTarget, select_backend
from labkit.memory.trace.step import FakeCuda, measure_step
from labkit.workloads import StepPolicy

H200 = SdpaTarget()                                   # sm90, torch 2.11, cuDNN 9.19 (targets/h200.json)
CUDNN_916 = SdpaTarget(torch_version=(2, 12), cudnn_version=91600, cudnn_frontend_d256=False)
T212 = SdpaTarget(torch_version=(2, 12))
T211_CUDNN_909 = SdpaTarget(cudnn_version=90900)


def qkv(dtype=torch.bfloat16, B=2, H=8, Hkv=None, S=128, Sk=None, D=64, grad=True):
    Hkv = Hkv or H
    Sk = Sk or S
    q = torch.empty(B, H, S, D, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(B, Hkv, Sk, D, dtype=dtype, device="meta", requires_grad=grad)
    v = torch.empty(B, Hkv, Sk, D, dtype=dtype, device="meta", requires_grad=grad)
    return q, k, v


def mask(S=128, Sk=None, grad=False, dtype=torch.bool):
    return torch.empty(2, 1, S, Sk or S, dtype=dtype, device="meta", requires_grad=grad)


TABLE = [
    # (description, inputs, call kwargs, target, expected backend)
    ("bf16 causal: cuDNN first on sm90", dict(), dict(is_causal=True), H200, "cudnn"),
    ("fp16 causal", dict(dtype=torch.float16), dict(is_causal=True), H200, "cudnn"),
    ("fp32: only mem-efficient takes float32", dict(dtype=torch.float32), dict(is_causal=True), H200, "efficient"),
    ("fp32 GQA on 2.11: mem-efficient needs equal heads -> math", dict(dtype=torch.float32, Hkv=2),
     dict(is_causal=True, enable_gqa=True), H200, "math"),
    ("fp32 GQA once mem-efficient supports GQA", dict(dtype=torch.float32, Hkv=2),
     dict(is_causal=True, enable_gqa=True), SdpaTarget(torch_version=(2, 13)), "efficient"),
    ("bf16 GQA", dict(Hkv=2), dict(is_causal=True, enable_gqa=True), H200, "cudnn"),
    ("heads not a multiple of kv heads", dict(H=6, Hkv=4), dict(enable_gqa=True), H200, "math"),
    ("bf16 head_dim 256 on 2.12 with cuDNN 9.16: cuDNN stops at 128 -> flash", dict(D=256), dict(is_causal=True),
     CUDNN_916, "flash"),
    ("bf16 head_dim 256 on 2.12 with cuDNN 9.19: 256 needs cuDNN > 9.22 -> flash", dict(D=256),
     dict(is_causal=True), T212, "flash"),
    ("bf16 head_dim 256 on 2.12 with cuDNN > 9.22 and frontend d256", dict(D=256), dict(is_causal=True),
     SdpaTarget(torch_version=(2, 12), cudnn_version=92300), "cudnn"),
    ("bf16 head_dim 256 on 2.11 with cuDNN 9.19 (Gemma on the H200)", dict(D=256), dict(is_causal=True), H200,
     "cudnn"),
    ("bf16 head_dim 256 on 2.11 with cuDNN 9.9: 256 needs cuDNN 9.10 -> flash", dict(D=256), dict(is_causal=True),
     T211_CUDNN_909, "flash"),
    ("bf16 head_dim 192 on 2.12 with cuDNN 9.16: flash", dict(D=192), dict(), CUDNN_916, "flash"),
    ("bf16 head_dim 100: cuDNN wants a multiple of 8", dict(D=100), dict(), H200, "flash"),
    ("bf16 head_dim 512: above flash's 256", dict(D=512), dict(), H200, "efficient"),
    ("fp32 head_dim 66: mem-efficient wants a multiple of 4", dict(dtype=torch.float32, D=66), dict(), H200, "math"),
    ("bf16 boolean padding mask: cuDNN takes a 4-D mask", dict(), dict(attn_mask=mask()), H200, "cudnn"),
    ("mask requiring grad (a learned bias): mem-efficient, as the H200's dispatcher chose", dict(),
     dict(attn_mask=mask(grad=True, dtype=torch.bfloat16)), H200, "efficient"),
    ("fp32 with a mask", dict(dtype=torch.float32), dict(attn_mask=mask()), H200, "efficient"),
    ("dropout 0.1 on 2.11: cuDNN (as recorded for GPT-2, BERT)", dict(), dict(dropout_p=0.1), H200, "cudnn"),
    ("dropout 0.1 on 2.12: cuDNN resolution is 1/16 -> flash", dict(), dict(dropout_p=0.1), T212, "flash"),
    ("dropout 0.125 on 2.12", dict(), dict(dropout_p=0.125), T212, "cudnn"),
    ("causal, seq_q != seq_k on torch 2.4: flash refuses, mem-efficient takes it", dict(S=64, Sk=128),
     dict(is_causal=True), SdpaTarget(torch_version=(2, 4)), "efficient"),
    ("torch 2.4 priority: flash first", dict(), dict(is_causal=True), SdpaTarget(torch_version=(2, 4)), "flash"),
    ("sm80 (A100): cuDNN is not preferred", dict(), dict(is_causal=True), SdpaTarget(sm=(8, 0)), "flash"),
    ("unequal heads without enable_gqa on torch 2.5", dict(Hkv=2), dict(), SdpaTarget(torch_version=(2, 5)), "math"),
]


@pytest.mark.parametrize("desc,inputs,kw,target,expected", TABLE, ids=[t[0] for t in TABLE])
def test_backend_choice_table(desc, inputs, kw, target, expected):
    q, k, v = qkv(**inputs)
    choice = select_backend(q, k, v, kw.get("attn_mask"), kw.get("dropout_p", 0.0), kw.get("is_causal", False),
                            kw.get("enable_gqa", False), target=target)
    assert choice.backend == expected, choice.describe()
    assert list(choice.rejected) == list(target.priority[:target.priority.index(expected)])


def test_layout_and_rank_checks():
    q, k, v = qkv()
    t = q.transpose(-1, -2).transpose(-1, -2)          # same shape, strides unchanged
    assert select_backend(t, k, v, target=H200).backend == "cudnn"
    bad = torch.empty(2, 8, 64, 128, dtype=torch.bfloat16, device="meta").transpose(-1, -2)   # last stride != 1
    assert select_backend(bad, k, v, target=H200).backend == "math"
    q3 = torch.empty(8, 128, 64, dtype=torch.bfloat16, device="meta")
    assert select_backend(q3, q3, q3, target=H200).backend == "math"


class Attn(torch.nn.Module):
    """Projections and one SDPA call: the policy under test decides the kernel."""

    def __init__(self, H=4, Hkv=4, D=32, mask_len=None, dropout=0.0):
        super().__init__()
        self.H, self.Hkv, self.D, self.mask_len, self.dropout = H, Hkv, D, mask_len, dropout
        self.q = torch.nn.Linear(H * D, H * D, bias=False)
        self.kv = torch.nn.Linear(H * D, 2 * Hkv * D, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.H, self.D).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.Hkv, self.D).permute(2, 0, 3, 1, 4)
        m = None
        if self.mask_len is not None:
            m = torch.ones(B, 1, S, S, dtype=torch.bool)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None, enable_gqa=self.H != self.Hkv,
                                           dropout_p=self.dropout)
        return o.transpose(1, 2).reshape(B, S, -1)


def _fwd_end(factory, x, precision="fp32", target=None):
    rep = measure_step(factory, x, StepPolicy(precision=precision), loss_fn=lambda out, b: out.float().pow(2).mean(),
                       fake=FakeCuda(target=target))
    fwd = next(p for p in rep.by_phase if p.phase == "forward")
    return fwd.end_bytes - fwd.start_bytes, rep


def test_fp32_gqa_math_path_keeps_the_scores():
    B, S, H, D = 2, 256, 4, 32
    x = torch.randn(B, S, H * D)
    gqa, rep = _fwd_end(lambda: Attn(H=H, Hkv=2, D=D), x)
    mha, rep_mha = _fwd_end(lambda: Attn(H=H, Hkv=H, D=D), x)
    assert any(key.startswith("math") for key in rep.emulation["sdpa"])
    assert all(key.startswith("efficient") for key in rep_mha.emulation["sdpa"])
    # math keeps the float32 probabilities (B, H, S, S) for backward; mem-efficient keeps only a logsumexp.
    # The same GQA call once mem-efficient supports GQA (torch 2.13): same projections, no scores.
    gqa13, rep13 = _fwd_end(lambda: Attn(H=H, Hkv=2, D=D), x, target=CudaTarget(torch_version="2.13"))
    assert all(key.startswith("efficient") for key in rep13.emulation["sdpa"])
    assert gqa - gqa13 >= B * H * S * S * 4
    assert gqa13 < mha                     # and GQA's smaller K/V projection shows


def test_math_path_dropout_keeps_a_boolean_mask():
    """The math path's dropout is at::dropout, fused on CUDA: the dropped probabilities (float32) and a
    boolean mask are kept, where the CPU's unfused dropout would keep a float32 noise tensor."""
    B, S, H, D = 2, 256, 4, 32
    x = torch.randn(B, S, H * D)
    with_dropout, rep = _fwd_end(lambda: Attn(H=H, Hkv=2, D=D, dropout=0.1), x)
    without, _ = _fwd_end(lambda: Attn(H=H, Hkv=2, D=D), x)
    assert all(key.startswith("math") for key in rep.emulation["sdpa"])
    assert with_dropout - without == B * H * S * S * (4 + 1)


@pytest.mark.parametrize("S,cols", [(200, 200), (196, 200)])
def test_mem_efficient_keeps_the_mask_in_its_own_shape_padded_once(S, cols):
    """``preprocess_mask`` (attention.cpp): the (B, 1, S, S) additive mask is padded to a multiple of 8 columns only
    where its strides are not multiples of 8 (S = 196), then expanded over the heads without a copy; the kernel
    saves it in that shape, never (B, H, S, S)."""
    B, H, D = 2, 4, 32
    x = torch.randn(B, S, H * D)
    masked, rep = _fwd_end(lambda: Attn(H=H, D=D, mask_len=S), x)
    causal, _ = _fwd_end(lambda: Attn(H=H, D=D), x)
    assert all(key.startswith("efficient") for key in rep.emulation["sdpa"])
    kept = B * S * cols * 4                        # float32, one head's worth, saved for backward
    assert kept <= masked - causal < kept + 512


def test_sdpa_choice_is_reported():
    _, rep = _fwd_end(lambda: Attn(H=4, Hkv=2, D=32), torch.randn(2, 64, 128), precision="amp-bf16")
    (key,) = rep.emulation["sdpa"]
    assert key == "cudnn"


@pytest.mark.parametrize("dtype,causal,gqa,mask", [(torch.float32, True, True, None), (torch.float32, False, False, "bool"),
                                                  (torch.bfloat16, False, False, "float"), (torch.bfloat16, True, True, None)])
def test_math_path_composition_computes_what_torch_computes(dtype, causal, gqa, mask):
    """Fake mode's op-by-op math path (sdpa._math) gives the C++ composite's result on real tensors."""
    from labkit.memory.trace.fake.sdpa import _additive_mask, _math

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g).to(dtype)
    k, v = (torch.randn(2, 2 if gqa else 4, 16, 8, generator=g).to(dtype) for _ in range(2))
    m = {None: None, "bool": torch.rand(2, 1, 16, 16, generator=g) > 0.3,
         "float": torch.randn(2, 1, 16, 16, generator=g).to(dtype)}[mask]
    m = _additive_mask(m, dtype) if m is not None else None
    kw = {"enable_gqa": True} if gqa else {}
    ref = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, m, 0.0, causal, None, scale=0.3, **kw)[0]
    torch.testing.assert_close(_math(q, k, v, m, 0.0, causal, 0.3, gqa), ref)


def test_math_path_adds_the_mask_in_place():
    """On the GPU the math path adds the mask to the scores in place (attention.cpp: ``attn.add_`` unless a
    tensor is subclass-like, which fake tensors are): one (B, H, S, S) scores block before the softmax, not two."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from labkit.memory.trace.fake.fake_cuda import CudaEmulator
    from labkit.memory.trace.fake.sdpa import SdpaChoice, run_sdpa
    from labkit.memory.trace.storage import StorageTracker

    B, H, S, D = 2, 4, 64, 32
    with FakeTensorMode(), StorageTracker(device_type="meta", emulator=CudaEmulator(CudaTarget(), None)) as tr:
        q = torch.randn(B, H, S, D, requires_grad=True)
        k, v = (torch.randn(B, 2, S, D, requires_grad=True) for _ in range(2))
        start = len(tr.events)
        run_sdpa(SdpaChoice("math"), q, k, v, None, 0.0, True, None, True)
    scores = [d for _, d, _ in tr.events[start:] if d == B * H * S * S * 4]
    assert len(scores) == 2             # the scores (masked in place) and the softmax's result


class BiasAttn(torch.nn.Module):
    """One SDPA call with a learned (1, H, S, S) bias, as timm's CoAtNet passes its relative positions."""

    def __init__(self, H=4, D=32, S=49):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(H * D, 3 * H * D, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(1, H, S, S))

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.H, self.D).permute(2, 0, 3, 1, 4).contiguous()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias).transpose(1, 2).reshape(B, S, -1)


def test_a_learned_bias_runs_mem_efficient_and_gets_its_gradient():
    """The bias (1, H, 49, 49) is padded once to 56 columns and kept in that shape, not per batch row (the same
    forward as a frozen bias); the backward kernel also allocates its gradient, (B, H, 49, 64): the expanded shape,
    columns padded to 16 (attention_backward.cu ``grad_bias``), as on the GPU."""
    from labkit.memory.trace.fake.sdpa import _efficient_mask

    B, H, S, D = 8, 4, 49, 32
    x = torch.randn(B, S, H * D)

    def frozen():
        m = BiasAttn(H, D, S)
        m.bias.requires_grad_(False)
        return m

    _, learned = _fwd_end(lambda: BiasAttn(H, D, S), x)
    _, fixed = _fwd_end(frozen, x)
    assert all(key.startswith("efficient") for r in (learned, fixed) for key in r.emulation["sdpa"])
    a, b = ({p.phase: p for p in r.by_phase} for r in (learned, fixed))
    assert a["forward"].end_bytes - a["forward"].start_bytes == b["forward"].end_bytes - b["forward"].start_bytes
    grad_bias = B * H * S * 64 * 4
    extra = (a["backward"].peak_bytes - a["backward"].start_bytes) - (b["backward"].peak_bytes - b["backward"].start_bytes)
    assert grad_bias <= extra < 2 * grad_bias
    q = torch.empty(B, H, S, D, device="meta")
    m = _efficient_mask(torch.empty(1, H, S, S, device="meta"), q, q)
    assert m.shape == (B, H, S, S) and m.stride() == (0, S * 56, 56, 1)     # a view of (1, H, 49, 56)
