"""The GPU's kernel times and eager PyTorch's host costs, as microbenchmarks recorded them on the
target GPU (``benchmarks/gpu/record_kernels.py`` -> ``data/measurements/advise/kernel_rates.json``).

The kernel times are not fitted to a training step: every figure is one kernel timed alone, and a
query between recorded points is interpolated. The host costs are one host call timed alone too,
then (``recorded_table()``, by default) scaled by one factor measured on whole reference steps issued
on the GPU's host (:mod:`labkit.advise.host_calibration`):

* GEMM: seconds on a log grid of (m, n, k) per dtype and operand layout, interpolated trilinearly in
  log space; beyond the grid's largest size the time grows linearly with that dimension (the rate has
  saturated), below its smallest it stays at the smallest kernel's time (a kernel's fixed cost);
* memory-bound kernels (copy, elementwise, reduction, softmax, normalisation, fused AdamW): seconds
  against bytes read + written, interpolated in log-log, linear beyond the largest size;
* attention: seconds per counted FLOP per backend, dtype, causal or not, head dimension, against the
  sequence length and the batch x heads product;
* sums over the outer dimension (a bias gradient reduced over the tokens): seconds on a (rows, cols)
  grid, interpolated in log space;
* host: seconds per eager op, per ``nn.Module.__call__``, per autograd node, per synchronising op; ops
  that launch several kernels (sort, the accumulating index_put of an indexing backward, grouped GEMM...)
  at their recorded multiple of a plain op's cost.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache

from labkit.advise.host_calibration import host_scale
from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement

KERNEL_FILE = "advise/kernel_rates.json"
EXTRA_FILE = "advise/kernel_rates_extra.json"     # record_kernels.py --only extra
EXTRA2_FILE = "advise/kernel_rates_extra2.json"   # record_kernels.py --only extra2
EXTRA3_FILE = "advise/kernel_rates_extra3.json"   # record_kernels.py --only extra3 (channels-last convolutions)
EXTRA4_FILE = "advise/kernel_rates_extra4.json"   # record_kernels.py --only extra4 (attention at small batch x heads)
EXTRA5_FILE = "advise/kernel_rates_extra5.json"   # record_kernels.py --only extra5 (host costs of multi-kernel ops)
EXTRA6_FILE = "advise/kernel_rates_extra6.json"   # record_kernels.py --only extra6 (sums over the outer dimension)

# The extra5 recording's calls that issue one more plain op than the op itself (``ids.int()`` before
# histc, ``perm // k`` before the index): that op's cost is taken off.
_HOST_OP_EXTRA = {"histc": 1, "index": 1}


def _interp_loglog(xs: list[float], ys: list[float], x: float) -> float:
    """y at x on the piecewise log-log line through (xs, ys); flat below, proportional above."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    i = bisect.bisect_right(xs, x) - 1
    w = (math.log(x) - math.log(xs[i])) / (math.log(xs[i + 1]) - math.log(xs[i]))
    return math.exp(math.log(ys[i]) + w * (math.log(ys[i + 1]) - math.log(ys[i])))


def _interp_flat(xs: list[float], ys: list[float], x: float) -> float:
    """y at x on the piecewise log-log line through (xs, ys), held flat outside the recorded range."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    return _interp_loglog(xs, ys, x)


def _axis(values: tuple[float, ...] | list[float], x: float) -> tuple[int, float, float]:
    """(lower index, weight, factor beyond the top) of x on a log axis."""
    if x <= values[0]:
        return 0, 0.0, 1.0
    if x >= values[-1]:
        return len(values) - 2, 1.0, x / values[-1]
    i = bisect.bisect_right(values, x) - 1
    return i, (math.log(x) - math.log(values[i])) / (math.log(values[i + 1]) - math.log(values[i])), 1.0


@dataclass
class GemmGrid:
    ms: tuple[int, ...]
    ns: tuple[int, ...]
    ks: tuple[int, ...]
    log_s: dict[tuple[int, int, int], float]

    @classmethod
    def from_rows(cls, rows: list[dict]) -> "GemmGrid":
        ms, ns, ks = (tuple(sorted({int(r[a]) for r in rows})) for a in ("m", "n", "k"))
        measured = {(r["m"], r["n"], r["k"]): r["seconds"] for r in rows}
        best = max(r["flops"] / r["seconds"] for r in rows)   # points above the recorded FLOP cap: at the top rate
        log_s = {}
        for m in ms:
            for n in ns:
                for k in ks:
                    s = measured.get((m, n, k)) or 2.0 * m * n * k / best
                    log_s[(m, n, k)] = math.log(s)
        return cls(ms, ns, ks, log_s)

    def seconds(self, m: float, n: float, k: float, extrapolate: bool = True) -> float:
        """Seconds at (m, n, k); ``extrapolate=False`` clamps every dimension into the grid (for a
        table of ratios rather than times)."""
        (im, wm, fm), (in_, wn, fn), (ik, wk, fk) = _axis(self.ms, m), _axis(self.ns, n), _axis(self.ks, k)
        if not extrapolate:
            fm = fn = fk = 1.0
        acc = 0.0
        for dm, cm in ((0, 1 - wm), (1, wm)):
            for dn, cn in ((0, 1 - wn), (1, wn)):
                for dk, ck in ((0, 1 - wk), (1, wk)):
                    c = cm * cn * ck
                    if c:
                        acc += c * self.log_s[(self.ms[im + dm], self.ns[in_ + dn], self.ks[ik + dk])]
        return math.exp(acc) * fm * fn * fk


@dataclass
class KernelTable:
    gemm: dict[tuple[str, str], GemmGrid]
    memory: dict[tuple[str, str], tuple[list[float], list[float]]]
    adamw: tuple[list[float], list[float]]
    sdpa: dict[tuple[str, str, bool, int], list[tuple[float, list[tuple[float, float, float]]]]]
    host: dict[str, float]
    source: str
    gemm_misaligned: dict[tuple[str, str, int], GemmGrid] = field(default_factory=dict)
    grouped_per_group_s: float | None = None     # bf16 grouped GEMM: seconds per group beyond the dense GEMM
    conv: dict[tuple[str, str], tuple[list[float], list[float], list[float]]] = field(default_factory=dict)
    per_byte: dict[tuple[str, str], tuple[list[float], list[float], list[float]]] = field(default_factory=dict)
    batch_norm: list[dict] = field(default_factory=list)   # recorded rows: dtype, shape, seconds per byte
    host_op_ratio: dict[str, float] = field(default_factory=dict)   # ATen op -> its host cost / a plain op's
    reduce_outer: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # dtype -> (rows, cols, s)

    # -- GEMM ---------------------------------------------------------------------------------
    def gemm_seconds(self, m: float, n: float, k: float, dtype: str, layout: str = "nn", align: int = 16) -> float:
        """One (m x k) @ (k x n) GEMM; ``dtype`` bf16 / fp16 / fp32 / tf32; ``layout`` of a and b,
        't' = stored transposed; ``align``: the bytes every operand's leading dimension and offset are
        a multiple of (below 16 cuBLAS cannot use its fast kernels: the misaligned recording, at the
        largest recorded alignment not above it, as its recorded slowdown over the aligned GEMM at
        the nearest recorded shape; none for a GEMM smaller than every recorded one). fp16 reads bf16's table (the same tensor-core rate)."""
        if min(m, n, k) <= 0:
            return 0.0
        d = "bf16" if dtype == "fp16" else dtype
        grid = self.gemm.get((d, layout)) or self.gemm.get((d, "nn")) or next(
            g for (dd, _), g in self.gemm.items() if dd == d)
        s = grid.seconds(m, n, k)
        if align < 16:
            aligns = sorted({a for (dd, _, a) in self.gemm_misaligned if dd == d and a <= align})
            if aligns:
                a = aligns[-1]
                ratio = self.gemm_misaligned.get((d, layout, a)) or next(
                    g for (dd, _, aa), g in self.gemm_misaligned.items() if dd == d and aa == a)
                if m >= ratio.ms[0] and n >= ratio.ns[0] and k >= ratio.ks[0]:   # not below the recorded shapes
                    s *= ratio.seconds(m, n, k, extrapolate=False)
        return s

    def grouped_gemm_seconds(self, groups: int, m: float, n: float, k: float) -> float:
        """The bf16 grouped GEMM (one kernel, ``m`` rows split over ``groups``): the dense GEMM of the
        same total shape plus the recorded cost per group (the median over the recorded shapes)."""
        return self.gemm_seconds(m, n, k, "bf16", "nt") + groups * (self.grouped_per_group_s or 0.0)

    def kernel_seconds(self, kind: str, dtype: str, nbytes: float, backward: bool) -> float | None:
        """A kernel recorded forward and backward against its bytes (batch_norm, gather, embedding,
        index_put_acc): the recorded seconds per byte at the nearest size (held
        flat outside the recorded range); None without a recording."""
        key = (kind, "bf16" if dtype in ("bf16", "fp16") else "fp32")
        if key not in self.per_byte:
            key = next((k for k in self.per_byte if k[0] == kind), None)
            if key is None:
                return None
        xs, fwd, bwd = self.per_byte[key]
        per = bwd if backward else fwd
        if min(per) <= 0:
            return None
        return nbytes * _interp_flat(xs, per, max(nbytes, 1.0))

    def batch_norm_seconds(self, dtype: str, channels: int, per_channel: int, nbytes: float,
                           backward: bool) -> float | None:
        """Training batch norm (NCHW): the recorded seconds per byte of the recorded shape nearest in
        (channels, elements per channel), log scale; its kernels reduce each channel over N x H x W,
        so the rate follows that shape, not the bytes alone."""
        d = "bf16" if dtype in ("bf16", "fp16") else "fp32"
        rows = [r for r in self.batch_norm if r["dtype"] == d] or self.batch_norm
        if not rows:
            return None

        def dist(r):
            n, c, h, w = r["shape"]
            return ((math.log(c) - math.log(max(channels, 1))) ** 2
                    + (math.log(n * h * w) - math.log(max(per_channel, 1))) ** 2)

        r = min(rows, key=dist)
        return nbytes * ((r["bwd_s"] if backward else r["fwd_s"]) / r["bytes"])

    def conv_seconds(self, kind: str, dtype: str, flops: float, nbytes: float, backward: bool) -> float | None:
        """A cuDNN convolution of ``kind`` (:func:`conv_kind`): dense ones at the recorded
        seconds per FLOP of that kind at the nearest FLOP count, depthwise ones per byte; None without
        a recording."""
        key = (kind, "bf16" if dtype in ("bf16", "fp16") else "fp32")
        if key not in self.conv:
            return None
        xs, fwd, bwd = self.conv[key]
        per = bwd if backward else fwd
        x = nbytes if kind.startswith("depthwise") else flops
        return x * _interp_flat(xs, per, max(x, 1.0))

    # -- memory-bound kernels -----------------------------------------------------------------
    def memory_seconds(self, kind: str, nbytes: float, element_size: int = 4) -> float:
        d = "fp32" if element_size >= 4 else "bf16"
        xs, ys = self.memory.get((kind, d)) or self.memory[("binary", d)]
        return _interp_loglog(xs, ys, max(nbytes, 1.0))

    def adamw_seconds(self, nbytes: float) -> float:
        return _interp_loglog(*self.adamw, max(nbytes, 1.0))

    # -- reductions over the outer dimension -----------------------------------------------
    def outer_reduce_seconds(self, dtype: str, rows: float, cols: float) -> float | None:
        """A sum over ``rows`` (the outer dimension) of ``cols`` columns: the recorded grid interpolated
        bilinearly in log space (rows, cols); beyond it, linear in the dimension past its edge; None
        without a recording for this dtype or below its fewest rows."""
        pts = self.reduce_outer.get("bf16" if dtype == "fp16" else dtype)
        if not pts:
            return None
        rs, cs = sorted({p[0] for p in pts}), sorted({p[1] for p in pts})
        if rows < rs[0]:
            return None             # a reduction over a few rows: a bandwidth-bound pass, priced by bytes
        grid = {(p[0], p[1]): math.log(p[2]) for p in pts}
        i, wr, fr = _axis(rs, rows)
        j, wc, fc = _axis(cs, cols)
        acc = 0.0
        for di, a in ((0, 1 - wr), (1, wr)):
            for dj, b in ((0, 1 - wc), (1, wc)):
                acc += a * b * grid[(rs[i + di], cs[j + dj])]
        return math.exp(acc) * fr * fc

    # -- attention ----------------------------------------------------------------------------
    def sdpa_seconds(self, backend: str, dtype: str, causal: bool, head_dim: int, seq: float, flops: float,
                     backward: bool, batch_heads: float | None = None) -> float:
        """``flops`` (the flop counter's count, causal not halved) at the recorded seconds per FLOP
        of ``backend`` at this sequence length; the nearest recorded head dimension. With
        ``batch_heads`` (batch x heads), the rate at that many (b, h) pairs, interpolated in log-log
        between the recordings at this sequence length (kernel_rates_extra4.json adds 64-256 to the
        base recording's 32k tokens x 16 heads: fewer pairs run fewer tiles, at a lower rate per
        FLOP); without, or beyond the largest recorded, the largest's rate."""
        d = "bf16" if dtype == "fp16" else dtype
        for b in (backend, "efficient", "math"):     # a backend the recording lacks: the next that takes any dtype
            hds = sorted({hd for (bb, dd, c, hd) in self.sdpa if bb == b and dd == d and c == causal})
            if hds:
                backend = b
                break
        else:
            raise LabkitError(f"kernel table: no recorded attention for backend {backend!r} in {d}")
        hd = min(hds, key=lambda h: abs(math.log(h) - math.log(max(head_dim, 1))))
        rows = self.sdpa[(backend, d, causal, hd)]
        seqs = [s for s, _ in rows]
        k = 2 if backward else 1

        def at(i: int) -> float:       # seconds per FLOP at recorded sequence i, for this batch x heads
            pts = rows[i][1]
            if batch_heads is None:
                return pts[-1][k]
            return _interp_flat([p[0] for p in pts], [p[k] for p in pts], batch_heads)

        if seqs[0] < seq < seqs[-1]:
            j = bisect.bisect_right(seqs, seq) - 1
            w = (math.log(seq) - math.log(seqs[j])) / (math.log(seqs[j + 1]) - math.log(seqs[j]))
            spf = math.exp((1 - w) * math.log(at(j)) + w * math.log(at(j + 1)))
        else:
            spf = at(min(range(len(seqs)), key=lambda j: abs(math.log(seqs[j]) - math.log(max(seq, 1.0)))))
        return flops * spf


def _host_op_ratios(rec: dict) -> dict[str, float]:
    """Each recorded op's host issue time over a plain elementwise op's, recorded the same way in the same
    run (``reference_add_s``); ``_index_put_impl_`` is the accumulating index_put (an indexing backward)."""
    ref = rec.get("reference_add_s")
    if not ref:
        return {}
    return {k[:-2]: max(1.0, (v - _HOST_OP_EXTRA.get(k[:-2], 0) * ref) / ref) for k, v in rec.items()
            if k.endswith("_s") and k != "reference_add_s" and isinstance(v, (int, float))}


def _memory_tables(rows: list[dict]) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        out.setdefault((r["kind"], r["dtype"]), []).append((float(r["bytes"]), float(r["seconds"])))
    return {k: ([b for b, _ in sorted(v)], [s for _, s in sorted(v)]) for k, v in out.items()}


def _sdpa_tables(rows: list[dict]) -> dict:
    """(backend, dtype, causal, head_dim) -> [(seq, [(batch x heads, fwd s/FLOP, bwd s/FLOP), ...]), ...]."""
    out: dict[tuple, dict[float, dict[float, tuple[float, float, float]]]] = {}
    for r in rows:
        if "error" in r or r.get("bwd_s", 0) <= 0 or r.get("fwd_s", 0) <= 0:
            continue
        bh = float(r["batch"] * r["heads"])
        out.setdefault((r["backend"], r["dtype"], bool(r["causal"]), int(r["head_dim"])), {}).setdefault(
            float(r["seq"]), {})[bh] = (bh, r["fwd_s"] / r["flops_fwd"], r["bwd_s"] / r["flops_bwd"])
    return {k: [(s, [v[bh] for bh in sorted(v)]) for s, v in sorted(by_seq.items())] for k, by_seq in out.items()}


def conv_kind(c_in: int, groups: int, kernel_area: int, channels_last: bool = False) -> str:
    """depthwise (grouped), narrow (input channels per group not a multiple of 8, as an RGB stem or
    patch embedding: no vectorised tensor-core path), dense1x1, dense. In channels-last memory cuDNN takes
    other kernels (NHWC depthwise, grouped-direct or implicit-GEMM weight gradients whose speed depends on
    the filter size: a 7x7 float32 depthwise backward 2.3x its NCHW time, a 3x3 one a sixth): its
    depthwise kinds are per filter area (``depthwise_cl_k49``), its dense ones ``dense_cl``."""
    if channels_last:
        return f"depthwise_cl_k{kernel_area}" if groups > 1 else "dense_cl"
    if groups > 1:
        return "depthwise"
    if c_in % 8:
        return "narrow"
    return "dense1x1" if kernel_area == 1 else "dense"


def _conv_tables(rows: list[dict]) -> dict:
    out: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in rows:
        if r.get("fwd_s", 0) <= 0 or r.get("bwd_s", 0) <= 0:
            continue
        kind = conv_kind(r["c_in"], r["groups"], r["kernel"] ** 2, r.get("layout") == "channels_last")
        x = r["bytes"] if kind.startswith("depthwise") else r["flops"]
        out.setdefault((kind, r["dtype"]), []).append((x, r["fwd_s"] / x, r["bwd_s"] / x))
    return {k: tuple(list(c) for c in zip(*sorted(v))) for k, v in out.items()}


def _slowdown_grid(rows: list[dict], aligned_rows: dict[tuple[str, str], list[dict]]) -> GemmGrid:
    """Misaligned / aligned seconds at each misaligned recording's shape (a grid of ratios, >= 1)."""
    r0 = rows[0]
    aligned = GemmGrid.from_rows(aligned_rows[(r0["dtype"], r0["layout"])])
    ratios = [dict(r, seconds=max(1.0, r["seconds"] / aligned.seconds(r["m"], r["n"], r["k"]))) for r in rows]
    g = GemmGrid.from_rows(ratios)
    missing = {(m, n, k) for m in g.ms for n in g.ns for k in g.ks} - {(r["m"], r["n"], r["k"]) for r in rows}
    if missing:   # grid points above the recorded FLOP cap: the largest recorded slowdown on that layout
        top = math.log(max(r["seconds"] for r in ratios))
        for key in missing:
            g.log_s[key] = top
    return g


def _per_byte_tables(rows: list[dict]) -> dict:
    out: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in rows:
        if r.get("fwd_s", 0) <= 0:
            continue
        out.setdefault((r["kind"], r["dtype"]), []).append(
            (r["bytes"], r["fwd_s"] / r["bytes"], max(r.get("bwd_s", 0.0), 0.0) / r["bytes"]))
    return {k: tuple(list(c) for c in zip(*sorted(v))) for k, v in out.items()}


def table_from_doc(doc: dict, extra: dict | None = None, extra2: dict | None = None,
                   extra3: dict | None = None, extra4: dict | None = None, extra5: dict | None = None,
                   extra6: dict | None = None) -> KernelTable:
    data, prov = doc["data"], doc["provenance"]
    src = f"kernel microbenchmarks recorded on {prov.get('gpu_count')} x {prov.get('gpu_name')}, {str(prov.get('date'))[:10]}"
    missing = [k for k in ("gemm", "memory", "adamw", "sdpa", "host") if not data.get(k)]
    if missing:
        raise LabkitError(f"kernel table: the recording lacks {missing} (benchmarks/gpu/record_kernels.py records them)")
    gemm_rows: dict[tuple[str, str], list[dict]] = {}
    for r in data["gemm"]:
        gemm_rows.setdefault((r["dtype"], r["layout"]), []).append(r)
    adamw = sorted((float(r["bytes"]), float(r["seconds"])) for r in data["adamw"])
    x = (extra or {}).get("data", {})
    mis: dict[tuple[str, str, int], list[dict]] = {}
    for r in x.get("gemm_misaligned", []):
        mis.setdefault((r["dtype"], r["layout"], int(r["align_bytes"])), []).append(r)
    if x:
        xp = extra["provenance"]
        src += f"; misaligned GEMMs, kernel paths, grouped GEMM, convolutions {str(xp.get('date'))[:10]}"
    x2 = (extra2 or {}).get("data", {})
    if x2:
        src += f"; norms, gather, embedding, index_put {str(extra2['provenance'].get('date'))[:10]}"
    x3 = (extra3 or {}).get("data", {})
    if x3:
        src += f"; channels-last convolutions {str(extra3['provenance'].get('date'))[:10]}"
    x5 = (extra5 or {}).get("data", {}).get("host_ops", {})
    if x5:
        src += f"; host costs of multi-kernel ops {str(extra5['provenance'].get('date'))[:10]}"
    x6 = (extra6 or {}).get("data", {}).get("reduce_outer", [])
    if x6:
        src += f"; sums over the outer dimension {str(extra6['provenance'].get('date'))[:10]}"
    x4 = (extra4 or {}).get("data", {})
    if x4:
        src += f"; attention at small batch x heads {str(extra4['provenance'].get('date'))[:10]}"
    return KernelTable(gemm={k: GemmGrid.from_rows(v) for k, v in gemm_rows.items()},
                       memory=_memory_tables(data["memory"] + x.get("memory_paths", [])),
                       adamw=([b for b, _ in adamw], [s for _, s in adamw]),
                       sdpa=_sdpa_tables(data["sdpa"] + x4.get("sdpa_small", [])), host=dict(data["host"]), source=src,
                       gemm_misaligned={k: _slowdown_grid(v, gemm_rows) for k, v in mis.items()},
                       grouped_per_group_s=statistics.median(
                           [max(0.0, r["seconds"] - r["dense_seconds"]) / r["groups"] for r in x["grouped_mm"]])
                       if x.get("grouped_mm") else None,
                       conv=_conv_tables(x.get("conv", []) + x2.get("conv", []) + x3.get("conv_channels_last", [])),
                       per_byte=_per_byte_tables([r for k, v in x2.items()
                                                  if k.startswith("norm_index") and isinstance(v, list) for r in v]),
                       batch_norm=[r for r in x2.get("norm_index_batch_norm", []) if r.get("fwd_s", 0) > 0
                                   and r.get("bwd_s", 0) > 0],
                       host_op_ratio=_host_op_ratios(x5),
                       reduce_outer={dt: sorted((float(r["rows"]), float(r["cols"]), float(r["seconds"]))
                                            for r in x6 if r["dtype"] == dt) for dt in {r["dtype"] for r in x6}})


@lru_cache(maxsize=2)
def recorded_table(host_calibrated: bool = True) -> KernelTable:
    """The table recorded under ``data/measurements/advise/kernel_rates.json`` (and ``kernel_rates_extra*.json``);
    with ``host_calibrated`` its host costs scaled to whole steps issued on the GPU's host
    (:mod:`labkit.advise.host_calibration`)."""
    p = paths.DATA_DIR / "measurements" / KERNEL_FILE
    if not p.exists():
        raise LabkitError(f"{p}: no kernel recording (benchmarks/gpu/record_kernels.py on the target GPU writes it)")
    extras = [paths.DATA_DIR / "measurements" / f for f in (EXTRA_FILE, EXTRA2_FILE, EXTRA3_FILE, EXTRA4_FILE,
                                                            EXTRA5_FILE, EXTRA6_FILE)]
    t = table_from_doc(load_measurement(p, "kernel_rates"),
                       *(load_measurement(x, "kernel_rates") if x.exists() else None for x in extras))
    scale = host_scale() if host_calibrated else 1.0
    if scale != 1.0:
        t.host = {k: v * scale if k.endswith("_s") else v for k, v in t.host.items()}
        t.source += f"; host costs x{scale:.2f} (whole steps issued on the H200's host, host_scale.json)"
    return t
