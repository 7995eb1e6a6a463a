"""Host and GPU apart: for each corpus case, how long the host takes to issue one plain training step,
and how long the GPU takes to run its kernels back to back, measured separately on the GPU server.

A step's wall time is neither: the GPU waits where the host falls behind, the host waits where a
kernel queue is full or an op synchronises. To take them apart, each measured step is issued while
the GPU is held busy by ``torch.cuda._sleep`` (a spin kernel queued just before the step):

* ``host_s``: the wall time of the step's Python call (``plain_step``), ended before any
  synchronisation, so every kernel is issued while the GPU still sleeps;
* ``gpu_s``: CUDA events recorded after the sleep and after the step: the step's kernels ran with no
  gaps, because all were queued when the sleep ended.

The sleep is at least three times the step's plain wall time. Where the host could not issue the whole
step during the sleep (an op that synchronises, or a full launch queue), ``host_blocked`` is true and
neither figure is a clean split. Each case also gets its plain step time (synchronised wall time, as
``record_plain.py`` measures it) in the same process. Three steps warm up; the figures are medians
of three.

    PYTHONPATH=. python3 benchmarks/gpu/record_host.py --out DIR [--budget 300] [--only A,B] [--smoke]

Writes ``DIR/host_split.json`` (rewritten after every case) and ``DIR/log.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import header, write_measurement
from labkit.workloads.corpus import CASES, Case, plain_step, prepare_plain, tiny

sys.path.insert(0, str(Path(__file__).parent))
from record_plain import LOG, SMOKE_CASES, cleanup, log, versions  # noqa: E402

T0 = time.perf_counter()
WARMUP, REPEATS = 3, 3


def sleep_cycles_per_s() -> float:
    """Clock cycles ``torch.cuda._sleep`` spins per second, timed by CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    a.record()
    torch.cuda._sleep(50_000_000)
    b.record()
    torch.cuda.synchronize()
    return 50_000_000 / (a.elapsed_time(b) * 1e-3)


def split_step(step: Any, cycles_per_s: float, sleep_s: float) -> dict[str, float]:
    """One step issued behind a ``sleep_s`` spin kernel: host issue time and GPU time apart."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_s * cycles_per_s))
    start.record()
    t = time.perf_counter()
    step()
    host = time.perf_counter() - t
    end.record()
    torch.cuda.synchronize()
    return {"host_s": host, "gpu_s": start.elapsed_time(end) * 1e-3}


def run_case(case: Case, device: str, cycles_per_s: float) -> dict[str, Any]:
    cuda = device == "cuda"
    cleanup(cuda)
    row: dict[str, Any] = {"name": case.name, "split": case.split, "case": dataclasses.asdict(case),
                           "describe": case.describe()}
    t0 = time.perf_counter()
    model = opt = batch = None
    try:
        model, opt, batch = prepare_plain(case, device)

        def step() -> None:
            plain_step(case, model, opt, batch, device_type=device)

        walls = []
        for i in range(WARMUP + REPEATS):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            if i >= WARMUP:
                walls.append(time.perf_counter() - t)
        row["step_times_s"] = walls
        row["median_step_s"] = statistics.median(walls)
        if cuda:
            sleep_s = max(0.25, 3 * max(walls))
            splits = [split_step(step, cycles_per_s, sleep_s) for _ in range(REPEATS)]
            row["sleep_s"] = sleep_s
            row["host_times_s"] = [s["host_s"] for s in splits]
            row["gpu_times_s"] = [s["gpu_s"] for s in splits]
            row["host_s"] = statistics.median(row["host_times_s"])
            row["gpu_s"] = statistics.median(row["gpu_times_s"])
            row["host_blocked"] = max(row["host_times_s"]) > 0.8 * sleep_s
    except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        row["traceback_tail"] = traceback.format_exc()[-1500:]
    del model, opt, batch
    cleanup(cuda)
    row["wall_s"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; cases past it are skipped (default 300)")
    ap.add_argument("--only", help="run only cases whose name contains one of these (comma-separated)")
    ap.add_argument("--smoke", action="store_true", help="a few cases at CI size on the CPU (checks the script)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cmd = "python3 benchmarks/gpu/record_host.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    prov.update(versions())
    todo = [tiny(c) for c in CASES if c.name in SMOKE_CASES] if args.smoke else list(CASES)
    if args.only:
        todo = [c for c in todo if any(part in c.name for part in args.only.split(","))]
    cps = sleep_cycles_per_s() if cuda else 0.0
    log(f"device {device}; {prov.get('gpu_name')}; {len(todo)} cases; sleep {cps:.3g} cycles/s")
    note = ("host_s: wall time of issuing one plain step while the GPU sleeps; gpu_s: CUDA-event time of the "
            "step's kernels run back to back after the sleep; median_step_s: the synchronised plain step, same "
            "process. host_blocked: the host could not issue the step within the sleep (a sync or a full queue).")
    rows: list[dict] = []
    for case in todo:
        if args.budget - (time.perf_counter() - T0) < 8:
            rows.append({"name": case.name, "split": case.split, "skipped": "time budget"})
            continue
        row = run_case(case, device, cps)
        rows.append(row)
        if "error" in row:
            log(f"{case.name}: {row['error']}")
        else:
            log(f"{case.name}: step {row['median_step_s'] * 1e3:.1f} ms"
                + (f", host {row['host_s'] * 1e3:.1f} ms, gpu {row['gpu_s'] * 1e3:.1f} ms"
                   + (" (host blocked)" if row["host_blocked"] else "") if cuda else ""))
        write_measurement(args.out / "host_split.json", "host_split",
                          {"note": note, "sleep_cycles_per_s": cps, "cases": rows}, provenance=prov)
    (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
