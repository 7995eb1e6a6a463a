"""The pricing rules of advise's op-by-op step time, each on the recorded H200 kernel table."""

import pytest
import torch

from labkit.advise.kernel_table import recorded_table
from labkit.advise.op_price import OpPricer, _iterator_path, align_bytes
from labkit.advise.roofline import Roofline

aten = torch.ops.aten


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _price(func, args, kwargs=None, phase="forward", out=None):
    out = func(*args, **(kwargs or {})) if out is None else out
    return OpPricer(recorded_table()).price(func, args, kwargs or {}, out, phase)


def test_a_vocabulary_of_50257_misaligns_the_lm_head_gemm_and_costs_more():
    x, w_odd, w_even = _meta(8192, 768), _meta(50257, 768), _meta(50264, 768)
    assert align_bytes(x, w_odd.t(), _meta(8192, 50257)) == 2 and align_bytes(x, w_even.t(), _meta(8192, 50264)) == 16
    odd = _price(aten.mm.default, (x, w_odd.t()))
    even = _price(aten.mm.default, (x, w_even.t()))
    assert odd.kind == even.kind == "gemm" and odd.gpu_s > 1.5 * even.gpu_s


def test_elementwise_ops_take_the_tensor_iterator_path_their_operands_imply():
    a, b = _meta(64, 1024), _meta(64, 1024)
    assert _iterator_path([a, b], [a]) is None                                       # vectorized
    assert _iterator_path([a, _meta(1024)], [a]) == "broadcast"
    assert _iterator_path([a], [_meta(64, 1024, dtype=torch.float32)]) == "cast"
    assert _iterator_path([a, _meta(64, 1024, dtype=torch.float32)], [_meta(64, 1024, dtype=torch.float32)]) == "mixed"
    assert _iterator_path([a.t()], [_meta(1024, 64)]) == "strided"
    fast = _price(aten.add.Tensor, (a, b))
    slow = _price(aten.add.Tensor, (a.t().contiguous().t(), b))
    assert fast.kind == slow.kind == "memory" and slow.gpu_s >= fast.gpu_s


def test_concatenating_a_transposed_tensor_is_priced_as_a_strided_copy():
    """GPT-2's KV cache appends keys that are transposed views; the H200 profile ran those cats at ~27 us
    for 16 MB, the strided copy's recorded rate, not the vectorized copy's ~5 us."""
    empty, k = _meta(4, 16, 0, 64), _meta(4, 1024, 16, 64).transpose(1, 2)
    strided = _price(aten.cat.default, ([empty, k], -2))
    contiguous = _price(aten.cat.default, ([empty, k.contiguous()], -2))
    assert strided.gpu_s > 3 * contiguous.gpu_s


def test_a_bias_gradient_sum_over_the_tokens_is_priced_from_the_outer_reduction_recording():
    """kernel_rates_extra6.json: a (rows, cols) sum over rows; narrow columns run far below bandwidth
    (bf16 8192 x 1024: 16.3 us for 16.8 MB), unlike the last-dimension reduction by bytes."""
    t = recorded_table()
    g = _meta(8192, 1024)
    outer = _price(aten.sum.dim_IntList, (g, [0], True))
    assert outer.gpu_s == pytest.approx(t.outer_reduce_seconds("bf16", 8192, 1024))
    rec = {(r[0], r[1]): r[2] for r in t.reduce_outer["bf16"]}
    assert outer.gpu_s == pytest.approx(rec[(8192.0, 1024.0)])
    inner = _price(aten.sum.dim_IntList, (g, [1], True))
    assert outer.gpu_s > 2 * inner.gpu_s
    mid = t.outer_reduce_seconds("bf16", 4096, 1024)
    assert rec[(2048.0, 1024.0)] < mid < rec[(8192.0, 1024.0)]
    assert t.outer_reduce_seconds("bf16", 4, 1 << 20) is None          # a few rows: priced by bytes
    few = _price(aten.sum.dim_IntList, (_meta(4, 1024, 1024), [0], True))
    assert few.gpu_s < 2 * t.memory_seconds("reduce", 8 * 2 ** 20, 2)


def test_grouped_gemm_runs_one_kernel_in_bf16_and_the_synchronising_fallback_in_fp32():
    offs = torch.empty(8, dtype=torch.int32, device="meta")
    bf = _price(aten._grouped_mm.default, (_meta(8192, 1024), _meta(8, 1024, 3584)), {"offs": offs})
    f32 = _price(aten._grouped_mm.default, (_meta(8192, 1024, dtype=torch.float32),   # the meta kernel knows bf16 only
                                            _meta(8, 1024, 3584, dtype=torch.float32)), {"offs": offs},
                 out=_meta(8192, 3584, dtype=torch.float32))
    assert (bf.kernels, bf.sync) == (1, False)
    assert (f32.kernels, f32.sync) == (8, True) and f32.gpu_s > 3 * bf.gpu_s


def test_attention_is_priced_as_the_backend_the_h200_picks():
    from labkit.memory.trace.fake.sdpa import select_backend

    q = _meta(4, 16, 2048, 128)
    kv = _meta(4, 4, 2048, 128)
    assert select_backend(q, kv, kv, None, 0.0, True, True, grad=True).backend == "cudnn"
    q32, kv32 = _meta(4, 16, 2048, 128, dtype=torch.float32), _meta(4, 4, 2048, 128, dtype=torch.float32)
    assert select_backend(q32, q32, q32, None, 0.0, True, False, grad=True).backend == "efficient"
    fwd16 = OpPricer(recorded_table())._attention("_scaled_dot_product_flash_attention_for_cpu",
                                                  {"query": q, "key": q, "value": q, "is_causal": True})
    fwd32 = OpPricer(recorded_table())._attention("_scaled_dot_product_flash_attention_for_cpu",
                                                  {"query": q32, "key": q32, "value": q32, "is_causal": True})
    assert fwd16.kind == "attention" and 3 < fwd32.gpu_s / fwd16.gpu_s < 30   # tensor cores vs float32


def test_attention_of_few_batch_x_heads_pairs_is_priced_at_their_recorded_rate():
    """kernel_rates_extra4.json: cuDNN attention at 4 x 16 (b, h) pairs, seq 1024, d 64, causal, recorded
    on the H200; priced from it, not at the base recording's 32k-token rate (which says 80% of it)."""
    from labkit.core.provenance import load_measurement

    t = recorded_table()
    (row,) = [r for r in load_measurement(_advise_data("kernel_rates_extra4.json"))["data"]["sdpa_small"]
              if (r["backend"], r["dtype"], r["seq"], r["head_dim"], r["causal"], r["batch"] * r["heads"])
              == ("cudnn", "bf16", 1024, 64, True, 64)]
    bwd = t.sdpa_seconds("cudnn", "bf16", True, 64, 1024.0, row["flops_bwd"], True, batch_heads=64)
    assert abs(bwd / row["bwd_s"] - 1) < 1e-9
    big = t.sdpa_seconds("cudnn", "bf16", True, 64, 1024.0, row["flops_bwd"], True)     # the largest recorded
    assert big < 0.9 * bwd
    mid = t.sdpa_seconds("cudnn", "bf16", True, 64, 1024.0, row["flops_bwd"], True, batch_heads=90)
    assert big < mid < bwd                       # between two recorded pair counts: in between
    q = _meta(4, 16, 1024, 64)
    priced = OpPricer(t)._attention("_scaled_dot_product_cudnn_attention_backward",
                                    {"query": q, "key": q, "value": q, "is_causal": True})
    assert priced.gpu_s == pytest.approx(bwd, rel=0.01)


def _advise_data(name):
    from labkit.core import paths

    return paths.DATA_DIR / "measurements" / "advise" / name


def test_multi_kernel_ops_cost_the_host_their_recorded_extra():
    """kernel_rates_extra5.json: a CUDA sort issues ~9 plain ops' worth of host work, the accumulating
    index_put of an indexing backward ~13; a non-accumulating index_put about one."""
    t = recorded_table()
    plain = t.host["op_alloc_s"]
    ids = torch.empty(16384, dtype=torch.int64, device="meta")
    srt = _price(aten.sort.default, (ids,), phase="optimizer")
    add = _price(aten.add.Tensor, (ids, ids), phase="optimizer")
    assert srt.host_s - add.host_s == pytest.approx((t.host_op_ratio["sort"] - 1) * plain)
    assert t.host_op_ratio["sort"] > 5
    dst, idx, vals = _meta(4096, 1024), torch.empty(16384, dtype=torch.int64, device="meta"), _meta(16384, 1024)
    acc = _price(aten._index_put_impl_.default, (dst, (idx,), vals, True), phase="backward", out=dst)
    put = _price(aten._index_put_impl_.default, (dst, (idx,), vals, False), phase="backward", out=dst)
    assert acc.host_s > put.host_s + 10 * plain * 0.9
    assert t.host_op_ratio["index_put_"] < 2


def test_fake_mode_queries_cost_nothing_and_a_scalar_read_waits_for_the_gpu():
    x = _meta(1024, 1024)
    dev = OpPricer(recorded_table()).price(torch.ops.prim.device.default, (x,), {}, x.device, "forward")
    assert dev.kind == "query" and dev.host_s == 0.0
    rf = Roofline()
    rf(aten.mm.default, (x, x), {}, aten.mm.default(x, x), "forward")
    busy = rf._gpu_free
    assert rf._host < busy                                       # the host ran ahead of the GPU
    s = torch.empty((), device="meta")
    rf(aten._local_scalar_dense.default, (s,), {}, 0.0, "forward")
    assert rf._host >= busy and rf.describe()["syncs"] == 1      # .item() waited for the GEMM


def test_a_convolution_is_priced_in_its_inputs_memory_layout():
    # ConvNeXt runs channels-last after its stem; there cuDNN's float32 7x7 depthwise backward takes 2.3x its
    # NCHW time on the H200 (kernel_rates_extra3.json) and the bf16 one a fifth of it
    def backward(dtype, channels_last):
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = _meta(32, 96, 56, 56, dtype=dtype).contiguous(memory_format=fmt)
        w = _meta(96, 1, 7, 7, dtype=dtype).contiguous(memory_format=fmt)
        gy = _meta(32, 96, 56, 56, dtype=dtype).contiguous(memory_format=fmt)
        args = (gy, x, w, [96], [1, 1], [3, 3], [1, 1], False, [0, 0], 96, [True, True, False])
        return _price(aten.convolution_backward.default, args, phase="backward").gpu_s

    for dt in (torch.float32, torch.bfloat16):
        assert backward(dt, False) > 0 and backward(dt, True) > 0
    assert 2.0 < backward(torch.float32, True) / backward(torch.float32, False) < 2.8
    assert backward(torch.bfloat16, True) < 0.35 * backward(torch.bfloat16, False)
