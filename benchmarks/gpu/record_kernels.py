"""Record the hardware constants of advise's op-by-op step time (labkit/advise/roofline.py) on this
GPU by microbenchmarks, nothing taken from a training step:

* GEMM time by (m, n, k), dtype (bf16, fp32 with TF32 off as PyTorch defaults, tf32) and operand
  layout (``nt``: a linear's forward ``x @ W.T``; ``nn``: its input gradient ``g @ W``; ``tn``: its
  weight gradient ``g.T @ x``), on a log grid;
* elementwise, reduction, softmax, normalisation and fused-AdamW kernel time against the bytes they
  read and write, from 4 KiB to 1 GiB;
* scaled-dot-product attention forward and backward per backend (flash, efficient, cudnn, math),
  dtype, sequence length, head dimension, causal or not;
* host costs of eager PyTorch: one ATen op (in place, and allocating its output), one
  ``nn.Module.__call__``, recording one autograd node and running it in backward, one synchronising
  op (``nonzero``, ``.item()``), one autocast-cast linear.

GPU times exclude the host: the stream is first held by ``torch.cuda._sleep`` while the host
enqueues ``reps`` calls, then the two CUDA events around them time only the kernels back to back
(the host is checked to have finished enqueuing before the sleep ended). Host times are wall times of
many calls on tiny tensors, one synchronisation at the end.

Then, for diagnosis only (nothing is taken from them): a few REFERENCE corpus steps under
``torch.profiler`` (kernel time by category against the step's wall time).

Writes DIR/kernel_rates.json (``kernel_rates``), DIR/step_profiles.json (``step_profiles``), DIR/log.txt;
with ``--only extra`` the second recording: GEMMs with a leading dimension not a multiple of 16 bytes,
TensorIterator's slower paths (broadcast, cast, mixed dtypes, non-contiguous), softmax over a wide row,
the bf16 grouped expert GEMM, cuDNN convolutions forward and backward, in DIR/kernel_rates_extra.json
(and DIR/step_profiles_extra.json); with ``--only extra2`` the third: batch norm, layer norm with float32
affine on bfloat16, gather / scatter-add, embedding forward / backward, index_put with accumulate, and
the convolutions at batch 128, in DIR/kernel_rates_extra2.json.

    PYTHONPATH=. python3 benchmarks/gpu/record_kernels.py --out DIR [--smoke] [--budget 270] [--only base|extra|extra2]
                                                          [--profile CASE,CASE]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from labkit.core.provenance import format_header, header, write_measurement

T0 = time.perf_counter()
LOG: list[str] = []
GEMM_M = (64, 256, 1024, 4096, 16384, 65536)
GEMM_NK = (64, 256, 1024, 4096, 16384)
GEMM_MAX_FLOPS = {"bf16": 4e12, "fp32": 4e11, "tf32": 1.5e12}   # larger grid points are extrapolated at their rate
LAYOUTS = {"bf16": ("nt", "nn", "tn"), "fp32": ("nt", "nn", "tn"), "tf32": ("nn",)}
BYTES = tuple(4096 * 4 ** i for i in range(10)) + (1 << 30,)          # 4 KiB .. 1 GiB
SDPA_SEQ = (128, 256, 512, 1024, 2048, 4096)
PROFILE_CASES = ("gpt2-b8-fp32", "gpt2-b8-bf16", "llama-gqa-b4-amp-bf16", "mixtral-b4-amp-bf16",
                 "bert-base-mlm-b32-bf16")   # all split "reference"
DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16}


def synced_wall(fn: Callable[[], Any], cuda: bool) -> float:
    """Wall seconds of one call of ``fn``, the GPU synchronised before and after (as the plain loops time a step)."""
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


class Timer:
    """GPU seconds per call of ``fn``, the host excluded (see the module docstring); on the CPU, wall
    seconds per call."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.cycles_per_s = self._calibrate() if self.cuda else 0.0

    def _calibrate(self) -> float:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        s.record()
        torch.cuda._sleep(20_000_000)
        e.record()
        e.synchronize()
        return 20_000_000 / (s.elapsed_time(e) / 1e3)

    def __call__(self, fn: Callable[[], Any], target_s: float = 2e-3, max_reps: int = 200,
                 repeats: int = 3) -> dict[str, float]:
        fn()
        fn()
        if not self.cuda:
            t = time.perf_counter()
            for _ in range(3):
                fn()
            return {"seconds": (time.perf_counter() - t) / 3, "reps": 3}
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        rough = time.perf_counter() - t
        reps = int(max(3, min(max_reps, target_s / max(rough, 1e-6))))
        out, host_over = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            host_one = time.perf_counter() - t            # the host's enqueue time of one call
            torch.cuda.synchronize()
            hold = min(0.25, max(2e-3, 3 * host_one * reps + 1e-3))
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(hold * self.cycles_per_s))
            s.record()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            enq = time.perf_counter() - t
            e.record()
            e.synchronize()
            host_over += enq > hold
            out.append(s.elapsed_time(e) / 1e3 / reps)
        return {"seconds": statistics.median(out), "reps": reps, "host_bound_repeats": host_over}


# ---------------------------------------------------------------------------------------------
# GEMMs


def operands(m: int, n: int, k: int, layout: str, dt: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """a (m x k) and b (k x n) with the strides of ``layout``: 't' = stored transposed (column-major)."""
    a = torch.randn(k, m, device=device, dtype=dt).t() if layout[0] == "t" else torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(n, k, device=device, dtype=dt).t() if layout[1] == "t" else torch.randn(k, n, device=device, dtype=dt)
    return a, b


def record_gemms(timer: Timer, device: str, smoke: bool) -> list[dict]:
    rows = []
    ms, nks = ((64, 256), (64, 128)) if smoke else (GEMM_M, GEMM_NK)
    for name, layouts in LAYOUTS.items():
        if smoke and name == "tf32":
            continue
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for layout in layouts:
            for m, n, k in itertools.product(ms, nks, nks):
                flops = 2.0 * m * n * k
                if flops > GEMM_MAX_FLOPS[name] and not smoke:
                    continue
                a, b = operands(m, n, k, layout, DT[name], device)
                c = torch.empty(m, n, device=device, dtype=DT[name])
                r = timer(lambda: torch.mm(a, b, out=c))
                rows.append({"dtype": name, "layout": layout, "m": m, "n": n, "k": k, "flops": flops, **r})
                del a, b, c
            log(f"gemm {name} {layout}: {sum(1 for r in rows if r['dtype'] == name and r['layout'] == layout)} shapes")
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


# ---------------------------------------------------------------------------------------------
# Memory-bound kernels


def _memory_kernels(numel: int, dt: torch.dtype, device: str) -> dict[str, tuple[Callable[[], Any], int]]:
    """kind -> (call, bytes read + written), each on tensors of ``numel`` elements."""
    es = torch.empty((), dtype=dt).element_size()
    x = torch.randn(numel, device=device, dtype=dt)
    y = torch.randn(numel, device=device, dtype=dt)
    z = torch.empty_like(x)
    cols = 1024 if numel >= 1024 else numel
    x2 = x.view(-1, cols)
    red = torch.empty(x2.shape[0], device=device, dtype=dt)
    w = torch.ones(cols, device=device, dtype=dt)
    bias = torch.zeros(cols, device=device, dtype=dt)
    return {
        "copy": (lambda: z.copy_(x), 2 * numel * es),
        "binary": (lambda: torch.add(x, y, out=z), 3 * numel * es),
        "unary": (lambda: torch.nn.functional.gelu(x), 2 * numel * es),
        "reduce": (lambda: torch.sum(x2, dim=-1, out=red), numel * es + red.numel() * es),
        "softmax": (lambda: torch.softmax(x2, dim=-1), 2 * numel * es),
        "layer_norm": (lambda: F.layer_norm(x2, (cols,), w, bias), 2 * numel * es),
    }


def _sweep_bytes(timer: Timer, device: str, smoke: bool, kernels, min_numel: int, what: str) -> list[dict]:
    """Time each of ``kernels(numel, dtype, device)`` at every size of BYTES, in fp32 and bf16."""
    rows = []
    sizes = BYTES[:3] if smoke else BYTES
    for name in ("fp32", "bf16"):
        dt = DT[name]
        es = torch.empty((), dtype=dt).element_size()
        for nbytes in sizes:
            numel = max(min_numel, nbytes // (3 * es))   # the binary kernel's three tensors ~ nbytes
            numel = numel // 1024 * 1024 if numel >= 1024 else numel
            for kind, (fn, moved) in kernels(numel, dt, device).items():
                r = timer(fn)
                rows.append({"kind": kind, "dtype": name, "numel": numel, "bytes": moved, **r})
            gc.collect()
        log(f"{what} {name}: {len(rows)} rows")
    return rows


def record_memory(timer: Timer, device: str, smoke: bool) -> list[dict]:
    return _sweep_bytes(timer, device, smoke, _memory_kernels, 256, "memory-bound kernels")


def record_adamw(timer: Timer, device: str, smoke: bool) -> list[dict]:
    """torch._fused_adamw_ over ``count`` fp32 tensors of ``numel`` each (params, grads, two moments)."""
    rows = []
    grid = ((4, 1024), (16, 65536)) if smoke else ((8, 4096), (64, 65536), (200, 1 << 20), (100, 8 << 20), (16, 64 << 20))
    for count, numel in grid:
        ps = [torch.randn(numel, device=device) for _ in range(count)]
        gs = [torch.randn(numel, device=device) for _ in range(count)]
        m1 = [torch.zeros(numel, device=device) for _ in range(count)]
        m2 = [torch.zeros(numel, device=device) for _ in range(count)]
        steps = [torch.zeros((), device=device) for _ in range(count)]

        def step() -> None:
            torch._fused_adamw_(ps, gs, m1, m2, [], steps, lr=1e-4, beta1=0.9, beta2=0.999, weight_decay=0.01,
                                eps=1e-8, amsgrad=False, maximize=False)

        r = timer(step, max_reps=50)
        rows.append({"tensors": count, "numel": count * numel, "bytes": 7 * 4 * count * numel, **r})
        del ps, gs, m1, m2, steps
    log(f"fused adamw: {len(rows)} rows")
    return rows


# ---------------------------------------------------------------------------------------------
# Second recording (--only extra): misaligned GEMMs, TensorIterator's slower paths, wide softmax,
# the bf16 grouped GEMM

MISALIGN = {"bf16": (1, 2, 4), "fp32": (1, 2)}        # elements added to one dimension: 2/4/8-byte alignment
ALIGN_M, ALIGN_N, ALIGN_K = (256, 1024, 4096, 16384), (256, 1024, 4096, 16384, 65536), (256, 1024, 4096)


def record_misaligned_gemms(timer: Timer, device: str, smoke: bool) -> list[dict]:
    """GEMMs whose leading dimension is not a multiple of 16 bytes (a vocabulary of 50257 or 30522):
    the misaligned dimension is the one each layout of a linear layer's three GEMMs has misaligned
    (nt: n, the output's columns; nn: k, the gradient's columns; tn: m, the transposed gradient's)."""
    rows = []
    grid = ((64,), (64, 128), (64,)) if smoke else (ALIGN_M, ALIGN_N, ALIGN_K)
    for name, deltas in MISALIGN.items():
        es = torch.empty((), dtype=DT[name]).element_size()
        for layout, dim in (("nt", "n"), ("nn", "k"), ("tn", "m")):
            for d in deltas[:1] if smoke else deltas:
                for m, n, k in itertools.product(*grid):
                    dims = {"m": m, "n": n, "k": k}
                    dims[dim] += d
                    flops = 2.0 * dims["m"] * dims["n"] * dims["k"]
                    if flops > GEMM_MAX_FLOPS[name] and not smoke:
                        continue
                    a, b = operands(dims["m"], dims["n"], dims["k"], layout, DT[name], device)
                    c = torch.empty(dims["m"], dims["n"], device=device, dtype=DT[name])
                    r = timer(lambda: torch.mm(a, b, out=c))
                    rows.append({"dtype": name, "layout": layout, "align_bytes": math.gcd(d * es, 16), **dims,
                                 "flops": flops, **r})
                    del a, b, c
        log(f"misaligned gemm {name}: {sum(r['dtype'] == name for r in rows)} shapes")
    return rows


def _path_kernels(numel: int, dt: torch.dtype, device: str) -> dict[str, tuple[Callable[[], Any], int]]:
    """TensorIterator's other paths (ATen/native/cuda/Loops.cuh): a broadcast operand, a type cast,
    mixed input dtypes, a non-contiguous input; and softmax over a wide last dimension."""
    es = torch.empty((), dtype=dt).element_size()
    other = torch.float32 if dt != torch.float32 else torch.bfloat16
    oes = torch.empty((), dtype=other).element_size()
    cols = 1024 if numel >= 1024 else numel
    x = torch.randn(numel, device=device, dtype=dt)
    x2 = x.view(-1, cols)
    w = torch.randn(cols, device=device, dtype=dt)
    y_other = torch.randn(numel, device=device, dtype=other)
    side = int(math.isqrt(numel))
    sq = x[: side * side].view(side, side)
    wide = 32768 if numel >= 32768 else numel
    xw = x[: numel // wide * wide].view(-1, wide)
    return {
        "broadcast": (lambda: x2 * w, 2 * numel * es + cols * es),
        "cast": (lambda: x.to(other), numel * (es + oes)),
        "mixed": (lambda: x * y_other, numel * (es + oes + 4)),      # promoted to float32
        "strided": (lambda: sq.t().contiguous(), 2 * side * side * es),
        "softmax_wide": (lambda: torch.softmax(xw, dim=-1), 2 * xw.numel() * es),
    }


def record_memory_paths(timer: Timer, device: str, smoke: bool) -> list[dict]:
    return _sweep_bytes(timer, device, smoke, _path_kernels, 1024, "memory-bound paths")


CONVS = (  # (name, N, C_in, H, C_out, kernel, stride, groups): layers of ResNet, ConvNeXt, EfficientNet, ViT
    ("dense3x3", 32, 64, 56, 64, 3, 1, 1), ("dense3x3", 32, 128, 28, 128, 3, 1, 1),
    ("dense3x3", 32, 256, 14, 256, 3, 1, 1), ("dense3x3", 32, 512, 7, 512, 3, 1, 1),
    ("dense1x1", 32, 256, 56, 64, 1, 1, 1), ("dense1x1", 32, 64, 56, 256, 1, 1, 1),
    ("dense1x1", 32, 1024, 14, 256, 1, 1, 1), ("dense1x1", 32, 512, 7, 2048, 1, 1, 1),
    ("stem", 32, 3, 224, 64, 7, 2, 1), ("patch", 32, 3, 224, 768, 16, 16, 1),
    ("depthwise", 32, 96, 56, 96, 7, 1, 96), ("depthwise", 32, 384, 14, 384, 7, 1, 384),
    ("depthwise", 32, 96, 112, 96, 3, 1, 96), ("depthwise", 32, 240, 28, 240, 5, 1, 240),
    ("depthwise", 32, 672, 14, 672, 5, 1, 672),
)


def record_convs(timer: Timer, device: str, smoke: bool, only_batch: int | None = None) -> list[dict]:
    """cuDNN convolutions (NCHW, PyTorch's defaults: benchmark off, TF32 on for float32 convs),
    forward and forward + backward, with their implicit-GEMM sizes and bytes."""
    rows = []
    for name, n, c, h, co, kk, st, g in (CONVS[:1] + CONVS[10:11] if smoke else CONVS):
        if smoke:
            n, h = 2, 16
        elif only_batch:
            n = only_batch
        for dname in ("fp32", "bf16"):
            dt = DT[dname]
            x = torch.randn(n, c, h, h, device=device, dtype=dt, requires_grad=True)
            w = torch.randn(co, c // g, kk, kk, device=device, dtype=dt, requires_grad=True)
            pad = kk // 2 if st == 1 else (3 if kk == 7 else 0)
            y = F.conv2d(x, w, stride=st, padding=pad, groups=g)
            go = torch.randn_like(y)
            fwd = timer(lambda: F.conv2d(x, w, stride=st, padding=pad, groups=g), max_reps=50)
            both = timer(lambda: torch.autograd.grad(F.conv2d(x, w, stride=st, padding=pad, groups=g), (x, w), go),
                         max_reps=30)
            m = n * y.shape[2] * y.shape[3]
            kdim = (c // g) * kk * kk
            es = x.element_size()
            rows.append({"name": name, "dtype": dname, "n": n, "c_in": c, "h": h, "c_out": co, "kernel": kk, "stride": st,
                         "groups": g, "m": m, "gemm_n": co, "gemm_k": kdim, "flops": 2.0 * m * co * kdim,
                         "bytes": float((x.numel() + w.numel() + y.numel()) * es), "fwd_s": fwd["seconds"],
                         "fwd_bwd_s": both["seconds"], "bwd_s": both["seconds"] - fwd["seconds"]})
            del x, w, y, go
    log(f"convolutions: {len(rows)} rows")
    return rows


# Convolutions as ConvNeXt runs them: channels-last after its stem (its LayerNorm permutes give every later
# activation and gradient NHWC strides), where cuDNN takes other kernels (NHWC depthwise forward, grouped
# direct or implicit-GEMM weight gradients); plus the depthwise shapes of EfficientNet and MobileNet
CONVS_CHANNELS_LAST = (
    ("depthwise", 32, 96, 56, 96, 7, 1, 96), ("depthwise", 32, 192, 28, 192, 7, 1, 192),
    ("depthwise", 32, 384, 14, 384, 7, 1, 384), ("depthwise", 32, 768, 7, 768, 7, 1, 768),
    ("dense2x2", 32, 96, 56, 192, 2, 2, 1), ("dense2x2", 32, 192, 28, 384, 2, 2, 1),
    ("dense2x2", 32, 384, 14, 768, 2, 2, 1),
    ("depthwise", 32, 96, 112, 96, 3, 1, 96), ("depthwise", 32, 240, 28, 240, 5, 1, 240),
    ("depthwise", 32, 672, 14, 672, 5, 1, 672),
)


def record_convs_channels_last(timer: Timer, device: str, smoke: bool) -> list[dict]:
    """:data:`CONVS_CHANNELS_LAST` with input, weight and output gradient in channels-last memory, at batch 32
    and 128, forward and forward + backward (as :func:`record_convs`, which times NCHW)."""
    rows = []
    for name, n0, c, h, co, kk, st, g in (CONVS_CHANNELS_LAST[:1] if smoke else CONVS_CHANNELS_LAST):
        for n in ((2,) if smoke else (n0, 128)):
            hh = 16 if smoke else h
            for dname in ("fp32", "bf16"):
                dt = DT[dname]
                cl = torch.channels_last
                x = torch.randn(n, c, hh, hh, device=device, dtype=dt).to(memory_format=cl).requires_grad_()
                w = torch.randn(co, c // g, kk, kk, device=device, dtype=dt).to(memory_format=cl).requires_grad_()
                pad = kk // 2 if st == 1 else 0
                y = F.conv2d(x, w, stride=st, padding=pad, groups=g)
                go = torch.randn_like(y).contiguous(memory_format=cl)
                fwd = timer(lambda: F.conv2d(x, w, stride=st, padding=pad, groups=g), max_reps=50)
                both = timer(lambda: torch.autograd.grad(F.conv2d(x, w, stride=st, padding=pad, groups=g), (x, w), go),
                             max_reps=30)
                m = n * y.shape[2] * y.shape[3]
                kdim = (c // g) * kk * kk
                rows.append({"name": name, "layout": "channels_last", "dtype": dname, "n": n, "c_in": c, "h": hh,
                             "c_out": co, "kernel": kk, "stride": st, "groups": g, "m": m, "gemm_n": co, "gemm_k": kdim,
                             "flops": 2.0 * m * co * kdim, "bytes": float((x.numel() + w.numel() + y.numel()) * x.element_size()),
                             "fwd_s": fwd["seconds"], "fwd_bwd_s": both["seconds"], "bwd_s": both["seconds"] - fwd["seconds"]})
                del x, w, y, go
    log(f"channels-last convolutions: {len(rows)} rows")
    return rows


BN_SHAPES = ((64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7), (32, 112), (96, 56), (240, 28), (672, 14))


def _grad_of(fn: Callable[[], torch.Tensor], inputs: tuple, go: torch.Tensor) -> Callable[[], Any]:
    return lambda: torch.autograd.grad(fn(), inputs, go)


def record_norm_index(timer: Timer, device: str, smoke: bool, kinds: tuple[str, ...] = ("batch_norm", "gather",
                      "embedding", "index_put_acc")) -> list[dict]:
    """Kernels a third recording adds, each forward and forward + backward against its bytes:
    batch norm in training (NCHW; float32, and bfloat16 input with float32 affine as under autocast),
    gather / scatter-add along the last dimension with int64 indices, embedding forward and backward,
    index_put with accumulate. (CUDA's layer norm takes one dtype only: autocast runs it in float32.)"""
    rows = []
    batches = (2,) if smoke else (32, 128)
    for n in (batches if "batch_norm" in kinds else ()):
        for c, h in (BN_SHAPES[:1] if smoke else BN_SHAPES):
            h = 8 if smoke else h
            for dname in ("fp32", "bf16"):
                x = torch.randn(n, c, h, h, device=device, dtype=DT[dname], requires_grad=True)
                w = torch.ones(c, device=device, requires_grad=True)
                b = torch.zeros(c, device=device, requires_grad=True)
                rm, rv = torch.zeros(c, device=device), torch.ones(c, device=device)
                fn = lambda: F.batch_norm(x, rm, rv, w, b, training=True)  # noqa: E731
                go = torch.randn_like(x)
                fwd = timer(fn, max_reps=50)
                both = timer(_grad_of(fn, (x, w, b), go), max_reps=30)
                rows.append({"kind": "batch_norm", "dtype": dname, "shape": [n, c, h, h],
                             "bytes": 2.0 * x.numel() * x.element_size(), "fwd_s": fwd["seconds"],
                             "bwd_s": both["seconds"] - fwd["seconds"]})
                del x, w, b, go
    for rows_, cols in (() if "gather" not in kinds else ((64, 64),) if smoke else
                        ((1024, 512), (4096, 512), (16384, 512), (65536, 512))):
        for dname in ("fp32", "bf16"):
            src = torch.randn(rows_, cols, device=device, dtype=DT[dname], requires_grad=True)
            idx = torch.randint(0, cols, (rows_, cols), device=device)
            fn = lambda: torch.gather(src, -1, idx)  # noqa: E731
            go = torch.randn(rows_, cols, device=device, dtype=DT[dname])
            fwd = timer(fn, max_reps=50)
            both = timer(_grad_of(fn, (src,), go), max_reps=30)     # backward: scatter_add
            rows.append({"kind": "gather", "dtype": dname, "shape": [rows_, cols],
                         "bytes": float(src.numel() * src.element_size() * 2 + idx.numel() * 8),
                         "fwd_s": fwd["seconds"], "bwd_s": both["seconds"] - fwd["seconds"]})
            del src, idx, go
    for tokens, vocab, hidden in (() if "embedding" not in kinds else ((64, 512, 64),) if smoke else
                                  ((4096, 32000, 768), (16384, 32000, 2048), (8192, 128256, 1024), (32768, 50257, 768))):
        for dname in ("fp32", "bf16"):
            wt = torch.randn(vocab, hidden, device=device, dtype=DT[dname], requires_grad=True)
            ids = torch.randint(0, vocab, (tokens,), device=device)
            fn = lambda: F.embedding(ids, wt)  # noqa: E731
            go = torch.randn(tokens, hidden, device=device, dtype=DT[dname])
            fwd = timer(fn, max_reps=50)
            both = timer(_grad_of(fn, (wt,), go), max_reps=20)       # embedding_dense_backward
            rows.append({"kind": "embedding", "dtype": dname, "shape": [tokens, vocab, hidden],
                         "bytes": float(2 * tokens * hidden * wt.element_size()),
                         "fwd_s": fwd["seconds"], "bwd_s": both["seconds"] - fwd["seconds"]})
            del wt, ids, go
    for tokens, hidden in (() if "index_put_acc" not in kinds else ((64, 64),) if smoke else
                           ((4096, 1024), (16384, 1024), (32768, 2048))):
        dst = torch.zeros(tokens, hidden, device=device, dtype=torch.bfloat16)
        src = torch.randn(tokens * 2, hidden, device=device, dtype=torch.bfloat16)
        idx = torch.randint(0, tokens, (tokens * 2,), device=device)
        r = timer(lambda: dst.index_put_((idx,), src, accumulate=True), max_reps=50)
        rows.append({"kind": "index_put_acc", "dtype": "bf16", "shape": [tokens * 2, hidden],
                     "bytes": float(2 * src.numel() * 2 + idx.numel() * 8), "fwd_s": r["seconds"], "bwd_s": 0.0})
        del dst, src, idx
    log(f"{', '.join(kinds)}: {len(rows)} rows")
    return rows


def record_grouped_mm(timer: Timer, device: str, smoke: bool) -> list[dict]:
    """torch._grouped_mm in bf16 (the CUTLASS grouped kernel on sm90): tokens split evenly over
    ``groups`` experts, beside one dense GEMM of the same total shape."""
    rows = []
    if device != "cuda" or not hasattr(torch, "_grouped_mm"):
        return rows
    for groups, tokens, k, n in ((8, 8192, 1024, 3584), (8, 8192, 3584, 1024), (60, 8192, 1024, 1408),
                                 (60, 8192, 1408, 1024), (8, 32768, 2048, 5632), (64, 16384, 2048, 1024),
                                 (16, 4096, 1024, 2048)):
        a = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(groups, n, k, device=device, dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * (tokens // groups)
        r = timer(lambda: torch._grouped_mm(a, b, offs=offs))
        dense_a, dense_b = a, torch.randn(n, k, device=device, dtype=torch.bfloat16).t()
        dense = timer(lambda: dense_a @ dense_b)
        rows.append({"groups": groups, "m": tokens, "k": k, "n": n, "seconds": r["seconds"],
                     "dense_seconds": dense["seconds"]})
        del a, b, offs, dense_b
    log(f"grouped mm: {len(rows)} rows")
    return rows


# ---------------------------------------------------------------------------------------------
# Attention


def record_sdpa(timer: Timer, device: str, smoke: bool, batch_heads: tuple[int, ...] | None = None) -> list[dict]:
    """Attention forward and forward+backward per backend, dtype, sequence, head dimension and causality:
    at 32k tokens x 16 heads (the base recording), or with ``batch_heads`` at these batch x heads
    products (16 heads): fewer work tiles than the GPU has SMs' worth, as small models run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    rows = []
    seqs = (32, 64) if smoke else (SDPA_SEQ if batch_heads is None else (512, 1024, 2048))
    shapes = [(seq, max(1, (32768 if not smoke else 64) // seq)) for seq in seqs] if batch_heads is None else [
        (seq, max(1, bh // 16)) for seq in seqs for bh in batch_heads]
    for (bname, backend), dname, (seq, batch), hd, causal in itertools.product(
            backends.items(), ("bf16", "fp32"), shapes, (64,) if smoke else (64, 128), (True,) if smoke else (True, False)):
        if device != "cuda" and bname != "math":
            continue
        if bname in ("flash", "cudnn") and dname == "fp32":
            continue                                      # no fp32 kernels: the dispatcher never picks them
        if batch_heads is not None and bname == "math":
            continue
        heads = 16
        if bname == "math" and seq * seq * batch * heads * 4 > 8 << 30:
            continue
        q, k, v = (torch.randn(batch, heads, seq, hd, device=device, dtype=DT[dname], requires_grad=True)
                   for _ in range(3))
        go = torch.randn(batch, heads, seq, hd, device=device, dtype=DT[dname])
        flops_fwd = 4.0 * batch * heads * seq * seq * hd   # the flop counter's formula (causal not halved)
        row = {"backend": bname, "dtype": dname, "seq": seq, "head_dim": hd, "causal": causal, "batch": batch,
               "heads": heads, "flops_fwd": flops_fwd, "flops_bwd": 2.5 * flops_fwd}
        try:
            with sdpa_kernel([backend]):
                fwd = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), max_reps=50)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                both = timer(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                         (q, k, v), go), max_reps=30)
                del out
            row.update(fwd_s=fwd["seconds"], fwd_bwd_s=both["seconds"], bwd_s=both["seconds"] - fwd["seconds"])
        except Exception as exc:  # noqa: BLE001 - a backend this shape or GPU does not support: recorded as such
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        rows.append(row)
        del q, k, v, go
    log(f"sdpa: {len(rows)} rows ({sum('error' in r for r in rows)} unsupported)")
    return rows


# ---------------------------------------------------------------------------------------------
# Host costs


def _wall_per_call(fn: Callable[[], Any], n: int, cuda: bool) -> float:
    for _ in range(min(200, n)):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def record_host(device: str, smoke: bool) -> dict[str, Any]:
    cuda = device == "cuda"
    n = 300 if smoke else 5000
    x = torch.zeros(8, device=device)
    w = torch.randn(8, 8, device=device)
    out: dict[str, Any] = {}
    out["op_inplace_s"] = _wall_per_call(lambda: x.add_(1), n, cuda)
    out["op_alloc_s"] = _wall_per_call(lambda: x + 1, n, cuda)
    out["op_linear_s"] = _wall_per_call(lambda: F.linear(x, w), n, cuda)
    out["view_s"] = _wall_per_call(lambda: x.view(-1), n, cuda)
    out["empty_s"] = _wall_per_call(lambda: torch.empty(8, device=device), n, cuda)

    class Nop(torch.nn.Module):
        def forward(self, t):
            return t

    class Add(torch.nn.Module):
        def forward(self, t):
            return t + 1

    nop, add = Nop(), Add()
    out["module_call_nop_s"] = _wall_per_call(lambda: nop(x), n, cuda)
    out["module_call_add_s"] = _wall_per_call(lambda: add(x), n, cuda)
    xr = torch.zeros(8, device=device, requires_grad=True)
    out["op_alloc_grad_s"] = _wall_per_call(lambda: xr * 1.0001, n, cuda)   # the op recording its autograd node
    chain = 50 if smoke else 200

    def fwd_bwd() -> None:
        y = xr
        for _ in range(chain):
            y = y * 1.0001
        y.sum().backward()

    total = _wall_per_call(fwd_bwd, 5 if smoke else 50, cuda)
    fwd_only = _wall_per_call(lambda: [xr * 1.0001 for _ in range(chain)], 5 if smoke else 50, cuda)
    out["autograd_chain"] = chain
    out["backward_node_s"] = max(0.0, (total - fwd_only) / chain)   # one MulBackward0 run by the engine
    out["autocast_linear_s"] = _autocast_linear(x, w, n, cuda, device)
    out["nonzero_s"] = _wall_per_call(lambda: torch.nonzero(x), n // 5, cuda)   # sizes the output: a sync
    out["item_s"] = _wall_per_call(lambda: x[0].item(), n // 5, cuda)
    log("host: " + ", ".join(f"{k}={v * 1e6:.1f}us" for k, v in out.items() if k.endswith("_s")))
    return out


def record_outer_reductions(timer: Timer, device: str, smoke: bool) -> list[dict]:
    """Sums over the outer dimension of a (rows, cols) tensor, as a linear layer's bias gradient
    reduces its output gradient over the tokens (the base recording reduces the last dimension)."""
    rows_out = []
    shapes = ((256, 64),) if smoke else [(r, c) for r in (2048, 8192, 32768) for c in (768, 1024, 3072, 4096, 16384)]
    for name in ("bf16", "fp32"):
        dt = DT[name]
        for r, c in shapes:
            x = torch.randn(r, c, device=device, dtype=dt)
            out = torch.empty(c, device=device, dtype=dt)
            t = timer(lambda: torch.sum(x, dim=0, out=out))
            es = x.element_size()
            rows_out.append({"kind": "reduce_outer", "dtype": name, "rows": r, "cols": c,
                             "bytes": (r * c + c) * es, **t})
            del x, out
    log(f"outer reductions: {len(rows_out)} rows")
    return rows_out


def _host_per_call(fn: Callable[[], Any], n: int, cycles_per_s: float) -> float:
    """The host's time to issue one call of ``fn``, the GPU held busy by a sleep meanwhile (so that
    neither its kernels' time nor a full launch queue enters: ``n`` calls stay well inside the queue);
    the median of three."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(0.2 * cycles_per_s))
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
        torch.cuda.synchronize()
    return statistics.median(out)


def record_host_ops(timer: Timer, device: str, smoke: bool) -> dict[str, Any]:
    """Host costs of the ops that launch several kernels or do host-side work beyond one launch, at the
    corpus' mixture-of-experts sizes (4096 tokens, hidden 1024, 16 experts, top-4: 16384 rows), each
    the host's issue time of one call with the GPU asleep. Keys are ATen op names."""
    if device != "cuda":
        return {}
    dt = torch.bfloat16
    t_, h, e, k, f = 4096, 1024, 16, 4, 704
    s_ = t_ * k
    x = torch.randn(t_, h, device=device, dtype=dt)
    ids = torch.randint(0, e, (s_,), device=device)
    rows = torch.randn(s_, h, device=device, dtype=dt)
    w = torch.randn(e, h, f, device=device, dtype=dt)
    offs = torch.cumsum(torch.full((e,), s_ // e, device=device, dtype=torch.int32), 0, dtype=torch.int32)
    probs = torch.rand(t_, e, device=device)
    mask = torch.rand(s_, 1, device=device) > 2
    acc = torch.zeros(t_, h, device=device, dtype=dt)
    perm = torch.randperm(s_, device=device)
    fill_idx = torch.empty_like(perm)
    ar = torch.arange(s_, device=device)
    n = 4 if smoke else 40
    ops = {
        "sort": lambda: torch.sort(ids),
        "histc": lambda: torch.histc(ids.int(), bins=e, min=0, max=e - 1),
        "cumsum": lambda: torch.cumsum(offs, 0, dtype=torch.int32),
        "topk": lambda: torch.topk(probs, k, dim=-1),
        "index": lambda: x[perm // k],
        "index_put_": lambda: fill_idx.index_put_((perm,), ar),
        "_index_put_impl_": lambda: acc.index_put_((perm // k,), rows, accumulate=True),
        "_grouped_mm": lambda: torch._grouped_mm(rows, w, offs=offs),
        "masked_fill": lambda: rows.masked_fill(mask, 0.0),
    }
    out: dict[str, Any] = {"sizes": {"tokens": t_, "hidden": h, "experts": e, "top_k": k, "rows": s_}}
    for name, fn in ops.items():
        try:
            out[name + "_s"] = _host_per_call(fn, n, timer.cycles_per_s)
        except Exception as exc:  # noqa: BLE001 - an op this build cannot run: recorded as such
            out[name + "_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    out["reference_add_s"] = _host_per_call(lambda: x + 1, n, timer.cycles_per_s)   # one plain elementwise op
    log("host ops: " + ", ".join(f"{k}={v * 1e6:.1f}us" for k, v in out.items() if k.endswith("_s")))
    return out


def _autocast_linear(x: torch.Tensor, w: torch.Tensor, n: int, cuda: bool, device: str) -> float:
    with torch.autocast(device if cuda else "cpu", dtype=torch.bfloat16):
        return _wall_per_call(lambda: F.linear(x, w), n, cuda)


# ---------------------------------------------------------------------------------------------
# Diagnosis: reference corpus steps under the profiler

KERNEL_CLASS = (("attention", re.compile(r"flash|fmha|attention|sdpa|attn", re.I)),
                ("conv", re.compile(r"conv|fprop|dgrad|wgrad|implicit", re.I)),
                ("gemm", re.compile(r"gemm|cutlass|cublas|sm\d+_xmma|nvjet|ampere_|hopper_|wgmma", re.I)),
                ("optimizer", re.compile(r"adam|multi_tensor", re.I)),
                ("norm_softmax", re.compile(r"norm|softmax", re.I)),
                ("reduce", re.compile(r"reduce|sum|mean", re.I)),
                ("copy_cast", re.compile(r"copy|cast|convert", re.I)),
                ("index", re.compile(r"index|gather|scatter|embedding", re.I)),
                ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)))


def kernel_class(name: str) -> str:
    return next((c for c, rx in KERNEL_CLASS if rx.search(name)), "other")


def profile_cases(device: str, smoke: bool, deadline: float, names: tuple[str, ...] = PROFILE_CASES) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from labkit.workloads.corpus import get_case, plain_step, prepare_plain

    rows = []
    names = tuple(f"{n}@tiny" for n in names[:2]) if smoke else names
    cuda = device == "cuda"
    for name in names:
        if time.perf_counter() > deadline:
            log(f"profile: budget spent before {name}")
            break
        case = get_case(name)
        row: dict[str, Any] = {"name": name, "split": case.split}
        if case.split != "reference":
            log(f"profile {name}: not a reference case, skipped (held-out cases choose nothing)")
            continue
        try:
            model, opt, batch = prepare_plain(case, device)
            walls = [synced_wall(lambda: plain_step(case, model, opt, batch, device_type=device), cuda)
                     for _ in range(4)][1:]
            row["median_step_s"] = statistics.median(walls)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                plain_step(case, model, opt, batch, device_type=device)
                if cuda:
                    torch.cuda.synchronize()
            kernels: dict[str, list[float]] = {}
            starts, ends = [], []
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    d = e.time_range.elapsed_us() * 1e-6
                    k = kernels.setdefault(e.name, [0, 0.0])
                    k[0] += 1
                    k[1] += d
                    starts.append(e.time_range.start)
                    ends.append(e.time_range.end)
            by_class: dict[str, list[float]] = {}
            for kname, (cnt, tot) in kernels.items():
                c = by_class.setdefault(kernel_class(kname), [0, 0.0])
                c[0] += cnt
                c[1] += tot
            row["kernel_s"] = sum(t for _, t in kernels.values())
            row["kernel_count"] = sum(c for c, _ in kernels.values())
            row["gpu_span_s"] = (max(ends) - min(starts)) * 1e-6 if starts else None
            row["by_class"] = {k: {"count": c, "seconds": t} for k, (c, t) in sorted(by_class.items())}
            row["top_kernels"] = [{"name": k[:160], "count": c, "seconds": t, "class": kernel_class(k)}
                                  for k, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:30]]
            ops = []
            for a in prof.key_averages():
                if not a.key.startswith("aten::"):
                    continue
                dev = getattr(a, "self_device_time_total", None)
                if dev is None:
                    dev = getattr(a, "self_cuda_time_total", 0)
                ops.append({"op": a.key, "count": a.count, "self_cpu_s": a.self_cpu_time_total * 1e-6,
                            "cpu_s": a.cpu_time_total * 1e-6, "self_device_s": dev * 1e-6})
            row["aten_ops"] = sorted(ops, key=lambda o: -o["self_device_s"])[:60]
            row["aten_op_calls"] = sum(o["count"] for o in ops)
            log(f"profile {name}: wall {row['median_step_s'] * 1e3:.1f} ms, kernels {row['kernel_s'] * 1e3:.1f} ms "
                f"({row['kernel_count']}), " + ", ".join(f"{k} {v['seconds'] * 1e3:.1f}" for k, v in row["by_class"].items()))
            del model, opt, batch, prof
        except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            log(f"profile {name}: {row['error']}")
        rows.append(row)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("data/measurements/advise"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a dry run of the script)")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds; the profiles stop once it is spent")
    ap.add_argument("--only", choices=("base", "extra", "extra2", "extra3", "extra4", "extra5", "extra6"), default="base",
                    help="base: kernel_rates.json (GEMM grid, memory kernels, AdamW, SDPA, host); extra: "
                         "kernel_rates_extra.json (misaligned GEMMs, TensorIterator's other paths, grouped GEMM); "
                         "extra2: kernel_rates_extra2.json (batch/layer norm, gather, embedding, index_put, convolutions "
                         "at batch 128); extra3: kernel_rates_extra3.json (convolutions in channels-last memory); extra4: "
                         "kernel_rates_extra4.json (attention at 64-512 batch x heads); extra5: kernel_rates_extra5.json (host "
                         "costs of multi-kernel ops: sort, index_put, grouped GEMM...); extra6: kernel_rates_extra6.json (sums over "
                         "the outer dimension)")
    ap.add_argument("--profile", default=",".join(PROFILE_CASES), help="comma-separated reference cases to profile")
    args = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the budget and the log are this run's: main() may be called again in one process (the tests)
    LOG.clear()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    cmd = "python3 benchmarks/gpu/record_kernels.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    print(format_header(prov), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    timer = Timer(device)
    data: dict[str, Any] = {"device": device, "method": __doc__.split("\n\n")[2].replace("\n", " ").strip(),
                            "sleep_cycles_per_s": timer.cycles_per_s}
    if args.only == "base":
        fname = "kernel_rates.json"
        parts = (("host", lambda: record_host(device, args.smoke)),
                 ("gemm", lambda: record_gemms(timer, device, args.smoke)),
                 ("memory", lambda: record_memory(timer, device, args.smoke)),
                 ("adamw", lambda: record_adamw(timer, device, args.smoke)),
                 ("sdpa", lambda: record_sdpa(timer, device, args.smoke)))
    elif args.only == "extra6":
        fname = "kernel_rates_extra6.json"
        parts = (("reduce_outer", lambda: record_outer_reductions(timer, device, args.smoke)),)
    elif args.only == "extra5":
        fname = "kernel_rates_extra5.json"
        parts = (("host_ops", lambda: record_host_ops(timer, device, args.smoke)),)
    elif args.only == "extra4":
        fname = "kernel_rates_extra4.json"
        parts = (("sdpa_small", lambda: record_sdpa(timer, device, args.smoke, batch_heads=(64, 128, 256))),)
    elif args.only == "extra3":
        fname = "kernel_rates_extra3.json"
        parts = (("conv_channels_last", lambda: record_convs_channels_last(timer, device, args.smoke)),)
    elif args.only == "extra2":
        fname = "kernel_rates_extra2.json"
        parts = tuple((f"norm_index_{k}", lambda k=k: record_norm_index(timer, device, args.smoke, (k,)))
                      for k in ("batch_norm", "gather", "embedding", "index_put_acc")) + (
                 ("conv", lambda: record_convs(timer, device, args.smoke, only_batch=128)),)
    else:
        fname = "kernel_rates_extra.json"
        parts = (("gemm_misaligned", lambda: record_misaligned_gemms(timer, device, args.smoke)),
                 ("memory_paths", lambda: record_memory_paths(timer, device, args.smoke)),
                 ("grouped_mm", lambda: record_grouped_mm(timer, device, args.smoke)),
                 ("conv", lambda: record_convs(timer, device, args.smoke)))
    for key, fn in parts:
        try:
            data[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a part that fails is recorded as failed, the rest still runs
            data[key + "_error"] = f"{type(exc).__name__}: {exc}"
            log(f"{key}: FAILED {data[key + '_error'][:300]}")
        write_measurement(args.out / fname, "kernel_rates", data, provenance=prov)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    log(f"wrote {args.out / fname}")
    names = tuple(n for n in args.profile.split(",") if n.strip("'\""))
    profiles = profile_cases(device, args.smoke, T0 + args.budget, names)
    pname = {"base": "step_profiles.json", "extra": "step_profiles_extra.json"}.get(args.only, f"step_profiles_{args.only}.json")
    write_measurement(args.out / pname, "step_profiles",
                      {"note": "diagnosis only: reference corpus steps under torch.profiler; no constant is taken "
                               "from them", "cases": profiles}, provenance=prov)
    log(f"wrote {args.out / pname}")
    (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
