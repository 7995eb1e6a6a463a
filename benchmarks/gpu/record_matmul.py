"""Record dense matmul throughput per dtype and size on this GPU: the compute rate behind the
step-time model of `labkit advise` and `labkit estimate --plan` (labkit/memory/estimate/rates.py).

Square GEMMs (n x n times n x n) for n from 256 to 8192, in bf16, fp16 and fp32 (PyTorch's default:
TF32 off for matmul), and tf32 on; each the median of CUDA-event-timed repeats after warm-up. Also
the device copy bandwidth (a 2 GiB tensor copied, bytes read + written over the median time) and the
host cost of one eager op (10,000 in-place adds on a one-element tensor, wall time / count, the GPU
synchronised once at the end: eager PyTorch's dispatch and launch path).
Writes data/measurements/advise/matmul_rates.json (with --out DIR: DIR/matmul_rates.json).

    PYTHONPATH=. python3 benchmarks/gpu/record_matmul.py --out DIR [--smoke]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

import torch

from labkit.core.provenance import header, write_measurement

SIZES = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


def time_matmul(n: int, dtype: torch.dtype, device: str, repeats: int, tf32: bool) -> float:
    """Median seconds of one n x n x n matmul."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        for _ in range(3):
            a @ b
        times = []
        if device == "cuda":
            torch.cuda.synchronize()
            for _ in range(repeats):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                a @ b
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1e3)
        else:
            import time

            for _ in range(repeats):
                t0 = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def copy_bandwidth(device: str, nbytes: int, repeats: int) -> float:
    """Bytes read + written per second of a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 2):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            t = s.elapsed_time(e) / 1e3
        else:
            import time

            t0 = time.perf_counter()
            dst.copy_(src)
            t = time.perf_counter() - t0
        if i >= 2:
            times.append(t)
    return 2 * src.numel() * 4 / statistics.median(times)


def launch_cost(device: str, n: int) -> float:
    """Host seconds per eager op: n tiny in-place adds issued back to back, one sync at the end."""
    import time

    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("data/measurements/advise"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a dry run of the script)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    sizes = (64, 128) if args.smoke else SIZES
    rows = []
    for name, dt in DTYPES.items():
        if device == "cpu" and name in ("fp16", "tf32"):
            continue
        for n in sizes:
            t = time_matmul(n, dt, device, 3 if args.smoke else 20, tf32=name == "tf32")
            rows.append({"dtype": name, "n": n, "flops": 2 * n ** 3, "seconds": t, "flops_per_s": 2 * n ** 3 / t})
            print(f"{name:5s} n={n:5d} {2 * n ** 3 / t / 1e12:8.1f} TFLOP/s", flush=True)
    bw = copy_bandwidth(device, (64 << 20) if args.smoke else (2 << 30), 3 if args.smoke else 10)
    launch = launch_cost(device, 500 if args.smoke else 10000)
    print(f"copy {bw / 1e12:.2f} TB/s (read + write); eager op {launch * 1e6:.1f} us", flush=True)
    cmd = "python3 benchmarks/gpu/record_matmul.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = write_measurement(args.out / "matmul_rates.json", "matmul_rates",
                             {"device": device, "method": "median of CUDA-event-timed n^3 GEMMs after 3 warm-ups; "
                                                          "fp32 with TF32 off (PyTorch's default), tf32 with it on",
                              "rows": rows, "bandwidth_Bps": bw, "launch_s": launch}, provenance=header(cmd))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
