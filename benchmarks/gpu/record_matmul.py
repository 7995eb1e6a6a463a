"""Record dense matmul throughput per dtype and size on this GPU: the compute rate behind the
step-time model of `labkit advise` (labkit/advise/steptime.py).

Square GEMMs (n x n times n x n) for n from 256 to 8192, in bf16, fp16 and fp32 (PyTorch's default:
TF32 off for matmul), and tf32 on; each the median of CUDA-event-timed repeats after warm-up.
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
    cmd = "python3 benchmarks/gpu/record_matmul.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = write_measurement(args.out / "matmul_rates.json", "matmul_rates",
                             {"device": device, "method": "median of CUDA-event-timed n^3 GEMMs after 3 warm-ups; "
                                                          "fp32 with TF32 off (PyTorch's default), tf32 with it on",
                              "rows": rows}, provenance=header(cmd))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
