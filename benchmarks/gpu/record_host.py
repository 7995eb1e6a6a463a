"""Host and GPU apart: for each corpus case, how long the host takes to issue one plain training step,
and how long the GPU takes to run its kernels back to back, measured separately on the GPU server.

A step's wall time is neither: the GPU waits where the host falls behind, the host waits where the
launch queue is full (about a thousand kernels ahead) or an op synchronises. Two measurements:

* whole step (``host_s``, ``host_blocked``): the step issued while the GPU is held busy by one spin
  kernel (``torch.cuda._sleep``, at least 0.25 s and three plain steps): the wall time of the step's
  Python call, before any synchronisation. Where the step fits the launch queue, that is the host's
  issue time with no waiting; where it does not (``host_blocked``: the call outlasted 80% of the
  sleep), it is not a host time.
* chunks (``gpu_s``, ``chunks``, ``chunks_blocked``): the step issued in chunks of about 400 kernels
  (the step's launches counted once by ``torch.profiler``; boundaries before every few blocks, a block
  being a child of an ``nn.ModuleList``/``nn.Sequential``, and when a block's output gradient arrives,
  by a tensor hook), each behind its own sleep after a synchronisation: the chunks' CUDA-event times
  summed are the GPU's kernel time with no gaps. The chunked issue does not measure the host: each
  synchronised boundary slows the host after it (two chunks added 17 ms to a 28 ms issue in the
  recording of 2026-12-01).

Each case also gets its plain step time (synchronised wall time, as ``record_plain.py`` measures it)
in the same process. Three steps warm up; the figures are medians of three.

``--shrink B,S``: every (``transformers``) case at batch B and sequence S instead, its layers and widths kept:
the same ops, module calls and autograd nodes on tensors so small that the GPU runs each kernel faster than
the host issues the next, so the launch queue never fills and the synchronised step time is the host's issue
time, for steps of any number of kernels (the whole-step method above only holds within the queue). Rows keep
the case's name and add ``shrink``. With ``--pair`` the case's own step and its shrunk step alternate on one
model in one process (``PAIR_ROUNDS`` rounds after a warm-up), so the host's drift over minutes cancels
between them: ``median_step_s`` is the full step, ``shrunk_step_s`` the shrunk one (no sleeps, no chunks).

    PYTHONPATH=. python3 benchmarks/gpu/record_host.py --out DIR [--budget 300] [--only A,B] [--shrink 1,64 [--pair]]
                                                       [--smoke]

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
from record_kernels import Timer, synced_wall  # noqa: E402
from record_plain import LOG, SMOKE_CASES, cleanup, log, versions  # noqa: E402

T0 = time.perf_counter()
WARMUP, REPEATS = 3, 3
PAIR_ROUNDS = 7
CHUNK_KERNELS = 400


def kernel_launches(step: Any) -> int:
    """CUDA kernels (and memcpys/memsets) one step launches, counted by ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def whole_step(step: Any, cycles_per_s: float, sleep_s: float) -> float:
    """The host's wall time issuing ``step`` behind one ``sleep_s`` spin kernel."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_s * cycles_per_s))
    t = time.perf_counter()
    step()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host


class Chunker:
    """Issues a step in chunks, each behind a sleep (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module, cycles_per_s: float, sleep_s: float = 0.04) -> None:
        self.cycles = int(sleep_s * cycles_per_s)
        self.sleep_s = sleep_s
        self.every, self.calls, self.counting = 1, 0, False
        self.handles = []
        for parent in model.modules():
            if isinstance(parent, (torch.nn.ModuleList, torch.nn.Sequential)):
                for child in parent.children():
                    self.handles.append(child.register_forward_pre_hook(self._pre))
                    self.handles.append(child.register_forward_hook(self._post))

    def _pre(self, module: Any, args: Any) -> None:
        self.boundary()

    def _post(self, module: Any, args: Any, out: Any) -> None:
        t = _first_grad_tensor(out)
        if t is not None:
            t.register_hook(self._grad)

    def _grad(self, grad: torch.Tensor) -> None:
        self.boundary()

    def begin(self, every: int = 1) -> None:
        self.host, self.chunks, self.blocked, self.pairs = 0.0, 0, 0, []
        self.every, self.calls = every, 0
        torch.cuda.synchronize()
        self._open()

    def _open(self) -> None:
        torch.cuda._sleep(self.cycles)
        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record()
        self.t = time.perf_counter()

    def _close(self) -> None:
        dt = time.perf_counter() - self.t
        self.host += dt
        self.chunks += 1
        self.blocked += dt > 0.8 * self.sleep_s
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pairs.append((self.start, end))
        torch.cuda.synchronize()

    def boundary(self) -> None:
        self.calls += 1
        if self.counting or self.calls % self.every:
            return
        self._close()
        self._open()

    def finish(self) -> dict[str, float]:
        self._close()
        return {"host_s": self.host, "gpu_s": sum(a.elapsed_time(b) for a, b in self.pairs) * 1e-3,
                "chunks": self.chunks, "chunks_blocked": self.blocked}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _first_grad_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    return None


def _case_row(case: Case, shrink: tuple[int, int] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"name": case.name, "split": case.split, "case": dataclasses.asdict(case),
                           "describe": case.describe()}
    if shrink:
        row["shrink"] = list(shrink)
    return row


def _failed(row: dict[str, Any], exc: Exception) -> None:
    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    row["traceback_tail"] = traceback.format_exc()[-1500:]


def run_case(case: Case, device: str, cycles_per_s: float, shrink: tuple[int, int] | None = None) -> dict[str, Any]:
    cuda = device == "cuda"
    cleanup(cuda)
    row = _case_row(case, shrink)
    t0 = time.perf_counter()
    model = opt = batch = None
    try:
        model, opt, batch = prepare_plain(case, device)

        def step() -> None:
            plain_step(case, model, opt, batch, device_type=device)

        walls = [synced_wall(step, cuda) for _ in range(WARMUP + REPEATS)][WARMUP:]
        row["step_times_s"] = walls
        row["median_step_s"] = statistics.median(walls)
        if cuda:
            row["kernels"] = kernel_launches(step)
            chunker = Chunker(model, cycles_per_s)
            try:
                chunker.counting = True
                step()
                chunker.counting = False
                row["blocks"] = chunker.calls      # hook calls per step, forward and backward
                # about CHUNK_KERNELS kernels a chunk (block boundaries spread the kernels roughly evenly)
                every = max(1, round(chunker.calls * CHUNK_KERNELS / max(row["kernels"], 1)))
                splits = []
                for _ in range(REPEATS):
                    chunker.begin(every)
                    step()
                    splits.append(chunker.finish())
            finally:
                chunker.remove()
            row["gpu_times_s"] = [x["gpu_s"] for x in splits]
            row["gpu_s"] = statistics.median(row["gpu_times_s"])
            row["chunks"] = splits[0]["chunks"]
            row["chunks_blocked"] = max(x["chunks_blocked"] for x in splits)
            sleep_s = max(0.25, 3 * max(walls))
            row["sleep_s"] = sleep_s
            row["host_times_s"] = [whole_step(step, cycles_per_s, sleep_s) for _ in range(REPEATS)]
            row["host_s"] = statistics.median(row["host_times_s"])
            row["host_blocked"] = max(row["host_times_s"]) > 0.8 * sleep_s
    except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
        _failed(row, exc)
    del model, opt, batch
    cleanup(cuda)
    row["wall_s"] = time.perf_counter() - t0
    return row


def run_pair(case: Case, device: str, shrink: tuple[int, int]) -> dict[str, Any]:
    """The case's step and its shrunk step (batch and sequence ``shrink``), alternating on one model."""
    from labkit.workloads.corpus import make_batch

    cuda = device == "cuda"
    cleanup(cuda)
    small = dataclasses.replace(case, micro_batch=shrink[0], seq=shrink[1])
    row = {**_case_row(case, shrink), "paired": True}
    t0 = time.perf_counter()
    model = opt = batch = tiny_batch = None
    try:
        model, opt, batch = prepare_plain(case, device)
        tiny_batch = {k: v.to(device) for k, v in make_batch(small).items()}

        def timed(b: dict) -> float:
            return synced_wall(lambda: plain_step(case, model, opt, b, device_type=device), cuda)

        for _ in range(WARMUP):
            timed(batch), timed(tiny_batch)
        full, shrunk = [], []
        for _ in range(PAIR_ROUNDS):
            full.append(timed(batch))
            shrunk.append(timed(tiny_batch))
        row.update(step_times_s=full, shrunk_step_times_s=shrunk, median_step_s=statistics.median(full),
                   shrunk_step_s=statistics.median(shrunk))
    except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
        _failed(row, exc)
    del model, opt, batch, tiny_batch
    cleanup(cuda)
    row["wall_s"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; cases past it are skipped (default 300)")
    ap.add_argument("--only", help="run only cases whose name contains one of these (comma-separated)")
    ap.add_argument("--shrink", help="B,S: run each transformers case at batch B, sequence S (see above)")
    ap.add_argument("--pair", action="store_true", help="with --shrink: the full and the shrunk step alternate")
    ap.add_argument("--smoke", action="store_true", help="a few cases at CI size on the CPU (checks the script)")
    args = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the budget and the log are this run's: main() may be called again in one process (the tests)
    LOG.clear()
    shrink = None
    if args.shrink:
        try:
            shrink = tuple(int(x) for x in args.shrink.split(","))
            if len(shrink) != 2 or min(shrink) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--shrink {args.shrink!r}: expected two positive integers B,S (e.g. 1,64)")
    if args.pair and not shrink:
        ap.error("--pair needs --shrink B,S")
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cmd = "python3 benchmarks/gpu/record_host.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    prov.update(versions())
    todo = [tiny(c) for c in CASES if c.name in SMOKE_CASES] if args.smoke else list(CASES)
    todo.sort(key=lambda c: c.precision == "fp32")    # host time matters most where the GPU is fast: those first
    if args.only:
        todo = [c for c in todo if any(part in c.name for part in args.only.split(","))]
    if shrink:
        todo = [c for c in todo if c.family == "transformers"]
        if not args.pair:
            todo = [dataclasses.replace(c, micro_batch=shrink[0], seq=shrink[1]) for c in todo]
    cps = Timer(device).cycles_per_s      # torch.cuda._sleep's cycles per second (0 on the CPU)
    log(f"device {device}; {prov.get('gpu_name')}; {len(todo)} cases; sleep {cps:.3g} cycles/s")
    note = ("host_s: the host's time issuing one plain step whole behind a sleep of the GPU (a host time only where "
            "host_blocked is false); gpu_s: the step issued in chunks, each behind a sleep, the chunks' CUDA-event "
            "times summed (kernels back to back); median_step_s: the synchronised plain step, same process")
    rows: list[dict] = []
    for case in todo:
        if args.budget - (time.perf_counter() - T0) < 8:
            rows.append({"name": case.name, "split": case.split, "skipped": "time budget"})
            continue
        row = run_pair(case, device, shrink) if args.pair else run_case(case, device, cps, shrink)
        rows.append(row)
        if "error" in row:
            log(f"{case.name}: {row['error']}")
        elif args.pair:
            log(f"{case.name}: step {row['median_step_s'] * 1e3:.1f} ms, shrunk to {shrink[0]} x {shrink[1]} "
                f"{row['shrunk_step_s'] * 1e3:.1f} ms")
        else:
            log(f"{case.name}: step {row['median_step_s'] * 1e3:.1f} ms"
                + (f", host {row['host_s'] * 1e3:.1f} ms, gpu {row['gpu_s'] * 1e3:.1f} ms in {row['chunks']} chunks"
                   + (" (host blocked)" if row["host_blocked"] else "") if cuda else ""))
        write_measurement(args.out / "host_split.json", "host_split",
                          {"note": note, "sleep_cycles_per_s": cps, "cases": rows}, provenance=prov)
    (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
