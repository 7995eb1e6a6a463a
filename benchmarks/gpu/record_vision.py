"""Ground truth for the vision side of fake mode (issue 11), recorded on the GPU in one run:

1. **cuDNN convolution workspaces.** For a grid of 2-D convolution geometries (stems, 3x3, 1x1, strided,
   patchify, depthwise 3/5/7; batch 8, 32 and 64; not the corpus models themselves) in fp32 (cuDNN's
   default: TF32 allowed) and bf16, contiguous NCHW as torchvision builds them, with
   ``torch.backends.cudnn.benchmark`` False (PyTorch's default: cuDNN's heuristics pick the engine),
   the bytes each call takes beyond its outputs, for the forward, backward-data only, backward-filter
   only and the backward as autograd runs it (data and filter in one ``convolution_backward``).
   Each op runs twice and the second call is measured (the first builds and caches the plan; training
   steps 2-4 reuse it). Measured two ways: ``torch.cuda.max_memory_allocated`` above what the call
   leaves allocated (the transient peak), and the caching allocator's own trace
   (``torch.cuda.memory._record_memory_history``): the blocks allocated and freed inside the call
   (the workspaces, as ``Conv_v8.cpp`` ``run_conv_plan`` takes them from the caching allocator).
   Also the backend ``torch._C._select_conv_backend`` picks (cuDNN or PyTorch's own depthwise kernel),
   and a few geometries again with ``cudnn.benchmark = True`` (for the record; not the default).
2. **Two plain-loop corpus cases that failed to record** in the first corpus run (pure bf16 torchvision
   models were fed float32 images; ``labkit.workloads.corpus.make_batch`` now casts them as a user
   does): ``tv-resnet50-b128-bf16`` (held-out) and ``tv-vit_b_16-b64-bf16`` (reference), recorded
   exactly as ``benchmarks/gpu/record_plain.py`` records every case (its ``run_case``), in its format,
   so that the rows merge into ``data/measurements/measure/plain__corpus.json``.

    PYTHONPATH=. python3 benchmarks/gpu/record_vision.py --out DIR [--part plain,conv] [--smoke]
    PYTHONPATH=. python3 benchmarks/gpu/record_vision.py --out DIR --part batch,trace --trace-case CASE

``--part batch``: eight of the geometries again at batch 96, 128 and 256 (``conv_workspace_batch.json``);
``--part trace``: the allocator's events of one steady step of a reference corpus case
(``step_trace__CASE.json.gz``).

Writes ``DIR/conv_workspace.json`` (kind ``conv_workspace``), ``DIR/plain_bf16.json`` (kind
``measure_plain``) and ``DIR/log.txt``. ``--smoke``: one geometry at batch 2 and the bf16 case as a ResNet-18
on 2 x 32 x 32 images, on the CPU (no memory figures: there is no caching allocator to ask), to
check the script.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from dataclasses import replace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from labkit.core.provenance import header, write_measurement  # noqa: E402

T0 = time.perf_counter()
LOG: list[str] = []
PLAIN_CASES = ("tv-resnet50-b128-bf16", "tv-vit_b_16-b64-bf16")

# (label, in channels, out channels, input height = width, kernel, stride, padding, groups)
GEOMETRIES: tuple[tuple[str, int, int, int, int, int, int, int], ...] = (
    ("stem7x7s2", 3, 64, 224, 7, 2, 3, 1),
    ("stem3x3s2", 3, 32, 224, 3, 2, 1, 1),
    ("patch4", 3, 96, 224, 4, 4, 0, 1),
    ("patch16", 3, 768, 224, 16, 16, 0, 1),
    ("3x3-64-56", 64, 64, 56, 3, 1, 1, 1),
    ("3x3-128-28", 128, 128, 28, 3, 1, 1, 1),
    ("3x3-256-14", 256, 256, 14, 3, 1, 1, 1),
    ("3x3-512-7", 512, 512, 7, 3, 1, 1, 1),
    ("3x3s2-128-56", 128, 128, 56, 3, 2, 1, 1),
    ("3x3s2-256-28", 256, 256, 28, 3, 2, 1, 1),
    ("3x3s2-512-14", 512, 512, 14, 3, 2, 1, 1),
    ("3x3-96-48", 96, 160, 48, 3, 1, 1, 1),
    ("1x1-64to256-56", 64, 256, 56, 1, 1, 0, 1),
    ("1x1-256to64-56", 256, 64, 56, 1, 1, 0, 1),
    ("1x1s2-256to512-56", 256, 512, 56, 1, 2, 0, 1),
    ("1x1-512to128-28", 512, 128, 28, 1, 1, 0, 1),
    ("1x1-1024to256-14", 1024, 256, 14, 1, 1, 0, 1),
    ("1x1-512to2048-7", 512, 2048, 7, 1, 1, 0, 1),
    ("1x1-2048to512-7", 2048, 512, 7, 1, 1, 0, 1),
    ("1x1-960to160-7", 960, 160, 7, 1, 1, 0, 1),
    ("down2x2s2-96-56", 96, 192, 56, 2, 2, 0, 1),
    ("down2x2s2-384-14", 384, 768, 14, 2, 2, 0, 1),
    ("dw3x3-32-112", 32, 32, 112, 3, 1, 1, 32),
    ("dw3x3s2-96-112", 96, 96, 112, 3, 2, 1, 96),
    ("dw3x3-480-14", 480, 480, 14, 3, 1, 1, 480),
    ("dw5x5-240-28", 240, 240, 28, 5, 1, 2, 240),
    ("dw7x7-96-56", 96, 96, 56, 7, 1, 3, 96),
    ("dw7x7-384-14", 384, 384, 14, 7, 1, 3, 384),
    ("grouped3x3-g32-256-28", 256, 256, 28, 3, 1, 1, 32),
)
BATCHES = (8, 32, 64)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BENCHMARK_GEOMETRIES = ("3x3-128-28", "1x1-64to256-56", "stem7x7s2", "dw7x7-96-56")
SMOKE_GEOMETRIES = ("3x3-128-28",)
SMOKE_CASE = "tv-resnet50-b128-bf16"     # as a ResNet-18 on 2 x 32 x 32 images (bf16 convolutions are slow on a CPU)


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


class AllocTrace:
    """The caching allocator's alloc/free events during a block (``_record_memory_history``), when available."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[dict[str, Any]] | None = None

    def __enter__(self) -> "AllocTrace":
        self.skip = 0
        if self.cuda:
            kw: dict[str, Any] = dict(enabled="all", context=None, stacks="python", max_entries=100000)
            try:
                try:
                    torch.cuda.memory._record_memory_history(**kw, clear_history=True)
                except TypeError:   # no clear_history: skip the events already recorded
                    torch.cuda.memory._record_memory_history(**kw)
                    self.skip = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
            except Exception:  # noqa: BLE001 - an older/newer API: the stats figures remain
                self.cuda = False
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            dev = torch.cuda.current_device()
            self.events = [{"action": e["action"], "addr": e["addr"], "size": e["size"]}
                           for e in snap["device_traces"][dev][self.skip:] if e["action"] in ("alloc", "free_requested")]
        except Exception as exc:  # noqa: BLE001 - the trace is a second opinion: the stats figures remain
            log(f"allocator trace unavailable: {type(exc).__name__}: {exc}")
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    def transients(self) -> list[int] | None:
        """Sizes of the blocks allocated and freed inside the block, in allocation order."""
        if self.events is None:
            return None
        live: dict[int, int] = {}
        out: list[tuple[int, int]] = []
        for i, e in enumerate(self.events):
            if e["action"] == "alloc":
                live[e["addr"]] = i
            elif e["addr"] in live:
                j = live.pop(e["addr"])
                out.append((j, self.events[j]["size"]))
        return [s for _, s in sorted(out)]

    def allocs(self) -> list[int] | None:
        return None if self.events is None else [e["size"] for e in self.events if e["action"] == "alloc"]


def measure_call(fn: Any, cuda: bool) -> dict[str, Any]:
    """Run ``fn`` twice; for the second call: bytes it leaves allocated, its transient peak above that,
    and the allocator trace's transient blocks."""
    fn()                         # builds and caches the cuDNN plan (as a training loop's first step)
    if cuda:
        torch.cuda.synchronize()
    before = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with AllocTrace(cuda) as tr:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    row: dict[str, Any] = {}
    if cuda:
        after = torch.cuda.memory_allocated()
        row["kept_bytes"] = after - before
        row["transient_peak_bytes"] = torch.cuda.max_memory_allocated() - after
    row["transient_blocks"] = tr.transients()
    row["alloc_blocks"] = tr.allocs()
    del out
    return row


def conv_probe(geom: tuple, n: int, dtype_name: str, device: str, benchmark: bool = False,
               channels_last: bool = False) -> dict[str, Any]:
    label, cin, cout, hw, k, s, p, g = geom
    dt = DTYPES[dtype_name]
    cuda = device == "cuda"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, cin, hw, hw, device=device, dtype=dt).contiguous(memory_format=fmt)
    w = torch.randn(cout, cin // g, k, k, device=device, dtype=dt).contiguous(memory_format=fmt)
    b = torch.randn(cout, device=device, dtype=dt)
    stride, pad, dil = [s, s], [p, p], [1, 1]
    row: dict[str, Any] = {"geometry": label, "batch": n, "dtype": dtype_name, "in_channels": cin,
                           "out_channels": cout, "height": hw, "width": hw, "kernel": k, "stride": s, "padding": p,
                           "dilation": 1, "groups": g, "memory_format": "channels_last" if channels_last else "contiguous",
                           "cudnn_benchmark": benchmark,
                           "input_shape": list(x.shape), "weight_shape": list(w.shape)}
    try:
        row["backend"] = str(torch._C._select_conv_backend(x, w, b, stride, pad, dil, False, [0, 0], g))
    except Exception as exc:  # noqa: BLE001 - the private helper may change: recorded as unknown
        row["backend"] = f"unknown ({type(exc).__name__})"
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        y = torch.nn.functional.conv2d(x, w, b, stride, pad, dil, g)
        row["output_shape"] = list(y.shape)
        gy = torch.randn_like(y).contiguous(memory_format=fmt)
        conv = torch.nn.functional.conv2d
        bwd = torch.ops.aten.convolution_backward

        def fwd() -> Any:
            return conv(x, w, b, stride, pad, dil, g)

        def data() -> Any:
            return bwd(gy, x, w, [cout], stride, pad, dil, False, [0, 0], g, [True, False, False])

        def filt() -> Any:
            return bwd(gy, x, w, [cout], stride, pad, dil, False, [0, 0], g, [False, True, False])

        def both() -> Any:
            return bwd(gy, x, w, [cout], stride, pad, dil, False, [0, 0], g, [True, True, True])

        for name, fn in (("forward", fwd), ("backward_data", data), ("backward_filter", filt), ("backward", both)):
            row[name] = measure_call(fn, cuda)
        del y, gy
    except Exception as exc:  # noqa: BLE001 - one failing geometry must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        torch.backends.cudnn.benchmark = old
    del x, w, b
    if cuda:
        torch.cuda.empty_cache()
    return row


def conv_section(device: str, smoke: bool) -> dict[str, Any]:
    geoms = [g for g in GEOMETRIES if not smoke or g[0] in SMOKE_GEOMETRIES]
    batches = (2,) if smoke else BATCHES
    rows = []
    for geom in geoms:
        for dtype_name in DTYPES:
            for n in batches:
                r = conv_probe(geom, n, dtype_name, device)
                rows.append(r)
                ws = {k: (r.get(k) or {}).get("transient_peak_bytes") for k in ("forward", "backward")}
                log(f"conv {geom[0]} n={n} {dtype_name} {r.get('backend')}: transient fwd {ws['forward']}, "
                    f"bwd {ws['backward']}{' ' + r['error'] if 'error' in r else ''}")
    for label in BENCHMARK_GEOMETRIES if not smoke else ():
        geom = next(g for g in GEOMETRIES if g[0] == label)
        for dtype_name in DTYPES:
            rows.append(conv_probe(geom, 32, dtype_name, device, benchmark=True))
    return {
        "device": device, "smoke": smoke,
        "settings": {"cudnn_benchmark_default": torch.backends.cudnn.benchmark,
                     "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                     "cudnn_deterministic": torch.backends.cudnn.deterministic,
                     "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None},
        "method": __doc__.split("\n\n")[1],
        "rows": rows,
    }


def plain_section(device: str, smoke: bool) -> dict[str, Any]:
    import record_plain
    from labkit.workloads.corpus import CASES, tiny

    if smoke:
        record_plain.STEPS = 2
        todo = [replace(tiny(c), name="tv-resnet18-bf16@smoke", arch="resnet18", seq=32)
                for c in CASES if c.name == SMOKE_CASE]
    else:
        todo = [c for c in CASES if c.name in PLAIN_CASES]
    rows = []
    for case in todo:
        row = record_plain.run_case(case, device)
        rows.append(row)
        log(f"{case.name} ({case.split}): " + (row["error"] if "error" in row else
            f"peak {record_plain.fmt(row['peak_allocated'])}, reserved {record_plain.fmt(row['peak_reserved'])}, "
            f"sdpa {row['sdpa_backends']}, {row['wall_s']:.1f} s"))
    return {"device": device, "smoke": smoke, "method": record_plain.__doc__.split("\n\n")[1], "cases": rows}


BATCH_GEOMETRIES = ("stem7x7s2", "3x3-64-56", "3x3s2-128-56", "1x1s2-256to512-56", "1x1-2048to512-7", "3x3-512-7",
                    "down2x2s2-96-56", "patch16")


def batch_section(device: str, smoke: bool) -> dict[str, Any]:
    """``--part batch``: some geometries again at larger batches (96, 128, 256): does the workspace scale
    with the batch as it does from 8 to 64?"""
    labels = SMOKE_GEOMETRIES if smoke else BATCH_GEOMETRIES
    rows = []
    for geom in (g for g in GEOMETRIES if g[0] in labels):
        for dtype_name in DTYPES:
            for n in ((2,) if smoke else (96, 128, 256)):
                r = conv_probe(geom, n, dtype_name, device)
                rows.append(r)
                log(f"conv {geom[0]} n={n} {dtype_name}: transient fwd {(r.get('forward') or {}).get('transient_peak_bytes')}"
                    f", bwd {(r.get('backward') or {}).get('transient_peak_bytes')}{' ' + r['error'] if 'error' in r else ''}")
    return {"device": device, "smoke": smoke, "method": "as conv_workspace.json, at larger batches", "rows": rows}


def trace_section(name: str, device: str, smoke: bool) -> dict[str, Any]:
    """``--part trace``: the caching allocator's events (alloc, free, segment alloc/free, with the top Python
    frames) of one steady-state step of a reference corpus case as the plain loop runs it: where the
    GPU's workspaces fall in the stream, and how reserved memory grows."""
    import record_plain
    from labkit.workloads.corpus import get_case, plain_step, prepare_plain, tiny

    case = get_case(name)
    if case.split != "reference":
        raise SystemExit(f"--trace-case {name}: a held-out case; trace reference cases only")
    if smoke:
        case = replace(tiny(case), name=f"{name}@smoke", arch="resnet18", seq=32) if case.family == "torchvision" else tiny(case)
    cuda = device == "cuda"
    record_plain.cleanup(cuda)
    model, opt, batch = prepare_plain(case, device)
    for _ in range(2):
        plain_step(case, model, opt, batch, device_type=device)
    out: dict[str, Any] = {"case": name, "events": None}
    if cuda:
        torch.cuda.synchronize()
        out["allocated_before"] = torch.cuda.memory_allocated()
        out["reserved_before"] = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=200000)
    try:
        plain_step(case, model, opt, batch, device_type=device)
        if cuda:
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            ev = snap["device_traces"][torch.cuda.current_device()]
            keep = ("alloc", "free_requested", "segment_alloc", "segment_free")
            out["events"] = [{"action": e["action"], "addr": e["addr"], "size": e["size"],
                              "frames": [f"{Path(f['filename']).name}:{f['line']}:{f['name']}"
                                         for f in (e.get("frames") or [])[:4]]} for e in ev if e["action"] in keep]
            out["peak_allocated"] = torch.cuda.max_memory_allocated()
            out["peak_reserved"] = torch.cuda.max_memory_reserved()
    finally:
        if cuda:
            torch.cuda.memory._record_memory_history(enabled=None)
    log(f"trace {name}: {len(out['events'] or [])} events, peak {record_plain.fmt(out.get('peak_allocated'))}, "
        f"reserved {record_plain.fmt(out.get('peak_reserved'))}")
    del model, opt, batch
    record_plain.cleanup(cuda)
    return out


def channels_last_section(device: str, smoke: bool) -> dict[str, Any]:
    """``--part cl``: the geometry grid with input, weight and output gradient in channels-last memory (as
    ConvNeXt runs after its stem), batch 8, 32, 64 and 128."""
    geoms = [g for g in GEOMETRIES if not smoke or g[0] in SMOKE_GEOMETRIES]
    rows = []
    for geom in geoms:
        for dtype_name in DTYPES:
            for n in ((2,) if smoke else BATCHES + (128,)):
                r = conv_probe(geom, n, dtype_name, device, channels_last=True)
                rows.append(r)
                log(f"conv channels-last {geom[0]} n={n} {dtype_name}: transient fwd "
                    f"{(r.get('forward') or {}).get('transient_peak_bytes')}, bwd "
                    f"{(r.get('backward') or {}).get('transient_peak_bytes')}{' ' + r['error'] if 'error' in r else ''}")
    return {"device": device, "smoke": smoke, "method": "as conv_workspace.json, in channels-last memory", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="a few geometries and the cases at CI size on the CPU")
    ap.add_argument("--part", default="plain,conv",
                    help="comma-separated: plain (the bf16 corpus cases), conv (the geometry grid), batch (some "
                         "geometries at batch 96-256), cl (the grid in channels-last memory), trace (one step of "
                         "--trace-case, allocator events)")
    ap.add_argument("--trace-case", default="tv-resnet50-b128-amp-bf16", help="a reference corpus case (--part trace)")
    args = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the log is this run's: main() may be called again in one process (the tests)
    LOG.clear()
    parts = set(args.part.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    import record_plain

    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cmd = "python3 benchmarks/gpu/record_vision.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    prov.update(record_plain.versions())
    log(f"device {device}; torch {torch.__version__}; {prov.get('gpu_name')}; cudnn {prov.get('cudnn')}")
    try:
        if "plain" in parts:
            plain = plain_section(device, args.smoke)
            write_measurement(args.out / "plain_bf16.json", "measure_plain", plain, provenance=prov)
        if "conv" in parts:
            conv = conv_section(device, args.smoke)
            write_measurement(args.out / "conv_workspace.json", "conv_workspace", conv, provenance=prov)
        if "cl" in parts:
            write_measurement(args.out / "conv_workspace_channels_last.json", "conv_workspace",
                              channels_last_section(device, args.smoke), provenance=prov)
        if "batch" in parts:
            write_measurement(args.out / "conv_workspace_batch.json", "conv_workspace",
                              batch_section(device, args.smoke), provenance=prov)
        if "trace" in parts:
            import gzip
            import json

            from labkit.core.provenance import to_jsonable

            doc = {"provenance": prov, "kind": "alloc_trace_plain_step",
                   "data": to_jsonable(trace_section(args.trace_case, device, args.smoke))}
            with gzip.open(args.out / f"step_trace__{args.trace_case}.json.gz", "wt") as fh:
                json.dump(doc, fh)
        log("done: " + ", ".join(sorted(parts)))
    finally:
        (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
