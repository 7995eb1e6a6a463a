"""Record ``labkit.allocator.watch`` on a real GPU: three real OOMs caught with their verdict, the script form under
torchrun, and the overhead on a real training step.

    PYTHONPATH=. python3 benchmarks/gpu/record_watch.py --out DIR [--smoke] [--budget-s 280] [--parts all|cases,torchrun,overhead]

Writes at most 7 files into DIR (each well under 16 MiB), all with provenance:

* ``watch__fragmentation.json`` (+ ``.pickle.gz``, the captured snapshot reduced to what the doctor reads): a
  variable-length GPT training loop (labkit.allocator.experiments.varlen_train) under a memory fraction that the
  default allocator cannot meet and expandable segments can (chosen from the simulator's replay of the recorded
  varlen trace: default OOMs from 9.2 GiB down, expandable fits down to 8.7 GiB). The same loop is then run,
  unwatched, under ``expandable_segments:True`` at the same cap: the ground truth for the verdict.
* ``watch__too_large.json`` (+ ``.pickle.gz``): the same model with a batch that cannot fit under the cap.
* ``watch__leak.json`` (+ ``.pickle.gz`` with ``--snapshots ...,leak``): losses kept with their graph (experiments.leak_loop), steps marked with
  ``w.step()``.
* ``watch__torchrun.json``: ``labkit watch -- torchrun --standalone --nproc-per-node 2 THIS --child rank``, two
  ranks on one GPU, the script unedited (no labkit.watch in it): rank 1 trains a few steps and finishes, rank 0
  then runs into the fragmentation OOM.
* ``watch__overhead.json``: GPT-2 small (124M, seq 1024, batch 8, bf16 autocast, fused AdamW): step time without
  watch and with each detail setting, in blocks interleaved in one process (two processes), the paired change
  against the baseline block of the same round; peak memory; a full ring buffer's host memory and the cost of
  dumping it at an OOM.

Each case runs in a fresh process (PYTORCH_ALLOC_CONF is read once; a memory fraction stays set). Without CUDA
(``--smoke``) the same orchestration runs at tiny sizes on the CPU: watch is a no-op there and the CUDA-only
results say so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GiB = 1024**3
MiB = 1024**2
FRAG_CAPS_GIB = (9.1, 8.9)  # tried in order until the default allocator runs out (see the docstring)
MODES = ("none", "trace", "stats", "stacks")
RANK_DESIGN = ("rank 1 trains 2 steps, meets rank 0 at a barrier and exits 0 (no OOM by design); rank 0 then runs "
               "into the fragmentation OOM, uncaught, and torchrun reports the failure (exit 1)")
MAX_FILE = 15 * MiB


def log(msg: str) -> None:
    print(f"[record_watch {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _dev():
    import torch

    return torch.device("cuda", 0) if _cuda() else torch.device("cpu")


def _set_cap(cap_bytes: int) -> dict:
    import torch

    if not _cuda():
        return {"cap_bytes": None, "memory_fraction": None}
    _, total = torch.cuda.mem_get_info(0)
    frac = cap_bytes / total
    torch.cuda.set_per_process_memory_fraction(frac, 0)
    return {"cap_bytes": int(frac * total), "memory_fraction": frac}


def _peaks() -> dict:
    import torch

    if not _cuda():
        return {}
    s = torch.cuda.memory_stats(0)
    return {k: int(s.get(k, 0)) for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_ooms",
                                          "num_alloc_retries")}


def _rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _result(work: Path, name: str, data: dict) -> None:
    (work / f"{name}.result.json").write_text(json.dumps(data, default=str))


# ------------------------------------------------------------------------------------------ children

def child_case(args) -> int:
    """One OOM case in this process, watched (or, with --plain, the unwatched ground-truth run)."""
    import torch

    from labkit.allocator import watch
    from labkit.allocator.experiments import _model_and_optimizer, _train_step, leak_loop, varlen_train

    work = Path(args.work)
    dev = _dev()
    case = args.case
    cap = int(args.cap_gib * GiB)
    info = {"case": case, "cuda": _cuda(), "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", ""), **_set_cap(cap)}
    exc_text = None
    t0 = time.perf_counter()

    def body(w):
        if case == "fragmentation":
            varlen_train(dev, steps=20 if not args.smoke else 3, batch=8, smoke=args.smoke)
        elif case == "too_large":
            model, opt = _model_and_optimizer(dev, args.smoke, 0)
            gen = torch.Generator(device=dev).manual_seed(0)
            for _ in range(2):
                _train_step(model, opt, 64 if not args.smoke else 2, model.config.seq_len, dev, gen)
        elif case == "leak":
            leak_loop(dev, max_steps=200 if not args.smoke else 4, batch=2, smoke=args.smoke,
                      on_step=lambda s: w.step() if w is not None else None)
        else:
            raise SystemExit(f"unknown case {case}")

    try:
        if args.plain:
            body(None)
        else:
            with watch(work / f"capture_{case}") as w:
                info["capture_folder"] = str(w.folder) if w.folder else None
                body(w)
    except torch.OutOfMemoryError as exc:
        exc_text = str(exc)
    info.update(oom=exc_text is not None, oom_message=exc_text, wall_s=time.perf_counter() - t0, **_peaks())
    _result(work, f"{case}{'_plain' if args.plain else ''}", info)
    log(f"case {case}{' (plain)' if args.plain else ''}: {'OOM' if exc_text else 'no OOM'} in {info['wall_s']:.1f} s"
        + (f": {exc_text[:120]}" if exc_text else ""))
    return 0


def child_rank(args) -> int:
    """The unedited training script under torchrun: no labkit.watch in it; two ranks share GPU 0."""
    import torch
    import torch.distributed as dist

    from labkit.allocator.experiments import varlen_train

    rank = int(os.environ.get("RANK", "0"))
    dev = _dev()
    if _cuda():
        torch.cuda.set_device(0)
    dist.init_process_group("gloo")  # NCCL refuses two ranks on one GPU; the ranks only meet at a barrier
    if rank == 1:
        varlen_train(dev, steps=2, batch=8, smoke=args.smoke)  # trains, finishes cleanly
        dist.barrier()
        dist.destroy_process_group()
        return 0
    dist.barrier()
    dist.destroy_process_group()
    _set_cap(int(args.cap_gib * GiB))
    varlen_train(dev, steps=20 if not args.smoke else 2, batch=8, smoke=args.smoke)  # OOMs on the GPU, uncaught
    return 0


def child_overhead(args) -> int:
    """GPT-2 small steps in blocks, the modes interleaved in one process (rotated each round, so drift and order
    fall on every mode alike); then a full ring buffer's host memory and what dumping it at an OOM costs."""
    import pickle as _pickle

    import torch

    from labkit.allocator import Watch
    from labkit.workloads import GPT, GPTConfig

    dev = _dev()
    cfg = (GPTConfig(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab_size=512) if args.smoke else
           GPTConfig(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab_size=50304))
    batch = 2 if args.smoke else 8
    rounds, block, warm = (1, 1, 1) if args.smoke else (6, 10, 5)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev)
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    gen = torch.Generator(device=dev).manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), device=dev, generator=gen)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    work = Path(args.work) / f"overhead_{args.rep}"

    def steps(n):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                _, loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t)
        return times

    steps(warm)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(0)
    blocks = []
    for rnd in range(rounds):
        order = MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]
        for mode in order:
            w = Watch(work, detail=mode, quiet=True).start() if mode != "none" else None
            ts = steps(block)
            if w is not None:
                w.stop()
            blocks.append({"mode": mode, "round": rnd, "step_s": ts, "median_s": statistics.median(ts)})
    peaks = _peaks()
    # a full ring buffer: host memory, entries per step, and the snapshot that an OOM would dump
    ring = {}
    if dev.type == "cuda":
        rss0 = _rss()
        w = Watch(work, quiet=True).start()
        n = 8 if args.smoke else 40
        steps(n)
        rss1 = _rss()
        t = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        raw = _pickle.dumps(snap, protocol=4)
        gz = gzip.compress(raw, compresslevel=6)
        dump_s = time.perf_counter() - t
        events = sum(len(tr) for tr in snap.get("device_traces", []))
        w.stop()
        ring = {"steps": n, "trace_entries": events, "entries_per_step": events / n, "max_entries": w.max_entries,
                "rss_growth_bytes": rss1 - rss0, "snapshot_pickle_bytes": len(raw), "snapshot_gz_bytes": len(gz),
                "snapshot_and_gzip_s": dump_s}
    _result(Path(args.work), f"overhead_{args.rep}", {
        "rep": args.rep, "cuda": dev.type == "cuda", "batch": batch, "seq": cfg.seq_len, "block_steps": block,
        "rounds": rounds, "blocks": blocks, "ring": ring, **peaks})
    med = {m: statistics.median([t for b in blocks if b["mode"] == m for t in b["step_s"]]) for m in MODES}
    log(f"overhead #{args.rep}: " + ", ".join(f"{m} {1000 * v:.2f} ms" for m, v in med.items()))
    return 0


# ------------------------------------------------------------------------------------------ parent

def _run(cmd: list[str], env: dict, timeout: float) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(5.0, timeout))
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out
    text = (r.stdout or "") + (r.stderr or "")
    for line in text.strip().splitlines()[-6:]:
        print(f"    | {line[:220]}", flush=True)
    return r.returncode, text


def _env(conf: str = "") -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["PYTORCH_ALLOC_CONF"] = conf
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def _child(args, *extra: str) -> list[str]:
    return [sys.executable, str(HERE), "--out", args.out, "--work", args.work] + (["--smoke"] if args.smoke else []) \
        + list(extra)


def _load_result(work: Path, name: str) -> dict | None:
    p = work / f"{name}.result.json"
    return json.loads(p.read_text()) if p.exists() else None


def _write(out: Path, name: str, kind: str, data: dict) -> None:
    from labkit.core.provenance import write_measurement

    write_measurement(out / name, kind, data, command=" ".join(sys.argv))


def _save_snapshot(folder: Path, dest: Path) -> dict:
    """The capture's snapshot reduced to what the doctor reads, gzip'd, if it stays under the file limit."""
    from labkit.allocator.capture import SNAPSHOT
    from labkit.allocator.snapshot import _load_bytes
    from labkit.allocator.watcher import reduce_snapshot

    src = folder / SNAPSHOT
    if not src.exists():
        return {"snapshot_file": None, "why": "no snapshot in the capture"}
    snap = _load_bytes(src.read_bytes(), str(src), 1 << 34)
    raw = gzip.compress(pickle.dumps(reduce_snapshot(snap), protocol=4), compresslevel=9)
    info = {"captured_snapshot_bytes": src.stat().st_size, "reduced_gz_bytes": len(raw),
            "trace_events": sum(len(t) for t in snap.get("device_traces", []))}
    if len(raw) > MAX_FILE:
        return {**info, "snapshot_file": None, "why": f"reduced snapshot {len(raw)} B is over the file limit"}
    dest.write_bytes(raw)
    return {**info, "snapshot_file": dest.name}


def _pack_case(args, out: Path, work: Path, case: str, res: dict | None, with_snapshot: bool) -> dict:
    from labkit.allocator.capture import pack

    data: dict = {"case": case, "run": res}
    folder = Path(res["capture_folder"]) if res and res.get("capture_folder") else None
    if folder is None or not folder.exists():
        data["capture"] = None
        data["why"] = "watch recorded nothing (no CUDA: watch is a no-op)" if res and not res.get("cuda") else \
            "the child did not finish"
        return data
    data["capture"] = pack(folder)
    if with_snapshot:
        data.update(_save_snapshot(folder, out / f"watch__{case}.pickle.gz"))
    v = (data["capture"].get("verdict") or {}).get("findings") or [{}]
    data["verdict"] = v[0].get("kind")
    data["verified"] = v[0].get("verified")
    return data


def part_cases(args, out: Path, work: Path, deadline: float) -> None:
    if "fragmentation" in args.cases.split(","):
        part_fragmentation(args, out, work, deadline)
    part_others(args, out, work, deadline)


def part_fragmentation(args, out: Path, work: Path, deadline: float) -> None:
    # the first cap under which the default allocator runs out; then the truth under expandable segments
    frag = None
    for cap in FRAG_CAPS_GIB:
        if time.time() > deadline - 30:
            break
        _run(_child(args, "--child", "case", "--case", "fragmentation", "--cap-gib", str(cap)), _env(""),
             deadline - time.time())
        frag = _load_result(work, "fragmentation")
        if not frag or frag.get("oom") or not frag.get("cuda"):
            break
        shutil.rmtree(work / "capture_fragmentation", ignore_errors=True)
    d = _pack_case(args, out, work, "fragmentation", frag, "fragmentation" in args.snapshots.split(","))
    if frag and frag.get("oom") and time.time() < deadline - 25:
        _run(_child(args, "--child", "case", "--case", "fragmentation", "--plain", "--cap-gib",
                    str(frag["cap_bytes"] / GiB)), _env("expandable_segments:True"), deadline - time.time())
        d["expandable_truth"] = _load_result(work, "fragmentation_plain")
    _write(out, "watch__fragmentation.json", "allocator.watch_capture", d)
    log(f"fragmentation: verdict {d.get('verdict')} (simulator {d.get('verified')}); under expandable segments "
        f"for real: {'OOM' if (d.get('expandable_truth') or {}).get('oom') else 'no OOM'}")


def part_others(args, out: Path, work: Path, deadline: float) -> None:
    for case, cap in (("too_large", FRAG_CAPS_GIB[0]), ("leak", 6.0)):
        snap = case in args.snapshots.split(",")
        if case not in args.cases.split(","):
            continue
        if time.time() > deadline - 20:
            log(f"{case}: skipped, out of time budget")
            continue
        _run(_child(args, "--child", "case", "--case", case, "--cap-gib", str(cap)), _env(""), deadline - time.time())
        d = _pack_case(args, out, work, case, _load_result(work, case), snap)
        _write(out, f"watch__{case}.json", "allocator.watch_capture", d)
        log(f"{case}: verdict {d.get('verdict')} (simulator {d.get('verified')})")


def part_torchrun(args, out: Path, work: Path, deadline: float) -> None:
    from labkit.allocator.capture import pack, rank_folders

    if time.time() > deadline - 40:
        log("torchrun: skipped, out of time budget")
        return
    root = work / "torchrun"
    cmd = [sys.executable, "-m", "labkit", "watch", "--out", str(root), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE), "--out", args.out, "--work", args.work, "--child", "rank", "--cap-gib", str(FRAG_CAPS_GIB[0])] \
        + (["--smoke"] if args.smoke else [])
    t0 = time.perf_counter()
    rc, text = _run(cmd, _env(""), deadline - time.time() - 5)
    runs = [p for p in root.iterdir() if p.is_dir()] if root.exists() else []
    ranks = [pack(f) for r in runs for f in rank_folders(r)]
    for r in ranks:
        r["steps"] = r["steps"][-3:]  # the series is in the case files; keep the end here
    data = {"command": cmd[2:], "design": RANK_DESIGN, "returncode": rc, "wall_s": time.perf_counter() - t0,
            "watch_lines": [ln for ln in text.splitlines() if ln.startswith(("labkit watch", "  rank"))],
            "run_folders": [p.name for p in runs], "ranks": ranks,
            "pids": [r["manifest"].get("pid") for r in ranks],
            "files_per_rank": {r["folder"]: sorted(r["files"]) for r in ranks}}
    _write(out, "watch__torchrun.json", "allocator.watch_torchrun", data)
    log(f"torchrun: rc {rc}, rank folders {[r['folder'] for r in ranks]}, verdicts "
        f"{[((r.get('verdict') or {}).get('findings') or [{}])[0].get('kind') for r in ranks]}")


def _overhead_summary(runs: list[dict]) -> dict:
    """Per mode: the median step, and the paired change against the baseline block of the same round."""
    out = {}
    for mode in MODES:
        steps = [t for r in runs for b in r["blocks"] if b["mode"] == mode for t in b["step_s"]]
        if not steps:
            continue
        paired = []
        for r in runs:
            for rnd in sorted({b["round"] for b in r["blocks"]}):
                bm = [b for b in r["blocks"] if b["round"] == rnd and b["mode"] == mode]
                bn = [b for b in r["blocks"] if b["round"] == rnd and b["mode"] == "none"]
                if bm and bn:
                    paired.append(100 * (bm[0]["median_s"] / bn[0]["median_s"] - 1))
        q = statistics.quantiles(steps, n=4) if len(steps) >= 4 else [min(steps), statistics.median(steps), max(steps)]
        out[mode] = {"median_step_s": statistics.median(steps), "steps": len(steps), "q1_s": q[0], "q3_s": q[-1],
                     "paired_change_pct": paired, "median_paired_change_pct": statistics.median(paired) if paired
                     else None}
    base = out.get("none", {}).get("median_step_s")
    for s in out.values():
        if base:
            s["overhead_pct"] = 100 * (s["median_step_s"] / base - 1)
    return out


def part_overhead(args, out: Path, work: Path, deadline: float) -> None:
    runs = []
    for rep in range(1 if args.smoke else 2):
        if time.time() > deadline - 25:
            log(f"overhead #{rep}: skipped, out of time budget")
            continue
        _run(_child(args, "--child", "overhead", "--rep", str(rep)), _env(""), deadline - time.time())
        r = _load_result(work, f"overhead_{rep}")
        if r:
            runs.append(r)
    summary = _overhead_summary(runs)
    data = {"workload": "GPT-2 small (124M), seq 1024, batch 8, bf16 autocast, fused AdamW" if not args.smoke else
            "tiny GPT on the CPU (smoke)", "cuda": bool(runs and runs[0]["cuda"]), "summary": summary,
            "method": "blocks of steps per mode, interleaved in one process and rotated each round; the paired "
                      "change compares each block with the baseline block of its round",
            "ring": [r.get("ring") for r in runs],
            "peak_memory": [{k: r.get(k) for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak")} for r in runs],
            "runs": runs,
            "modes": {"none": "no watch", "trace": "watch() defaults: history without stacks, 200,000 entries",
                      "stats": "watch(detail='stats'): per-step memory_stats() only",
                      "stacks": "watch(detail='stacks'): history with Python stacks"}}
    _write(out, "watch__overhead.json", "allocator.watch_overhead", data)
    log("overhead: " + ", ".join(f"{m} {1000 * s['median_step_s']:.2f} ms (paired {s['median_paired_change_pct']:+.1f}%)"
                                 for m, s in summary.items() if s.get("median_paired_change_pct") is not None))


def parent(args) -> int:
    t0 = time.time()
    deadline = t0 + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="record_watch_")
    work = Path(args.work)
    parts = set(args.parts.split(","))
    unknown = parts - {"all", "cases", "torchrun", "overhead"}
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}")
    log(f"CUDA: {_cuda()}; budget {args.budget_s:.0f} s; out {out}; work {work}")
    if parts & {"all", "cases"}:
        part_cases(args, out, work, deadline)
    if parts & {"all", "torchrun"}:
        part_torchrun(args, out, work, deadline)
    if parts & {"all", "overhead"}:
        part_overhead(args, out, work, deadline)
    files = sorted(out.iterdir())
    log(f"done in {time.time() - t0:.0f} s: {len(files)} files, largest "
        f"{max((p.stat().st_size for p in files), default=0) / MiB:.2f} MiB")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; on a CPU-only machine, check the orchestration")
    ap.add_argument("--budget-s", type=float, default=280.0, help="stop starting new runs after this many seconds")
    ap.add_argument("--parts", default="all", help="comma list of: all, cases, torchrun, overhead")
    ap.add_argument("--cases", default="fragmentation,too_large,leak", help="which OOM cases (with --parts cases)")
    ap.add_argument("--snapshots", default="fragmentation,too_large",
                    help="cases whose reduced snapshot is written too (the default keeps a full run at 7 files)")
    ap.add_argument("--work", default=None, help="scratch folder for the capture folders (default: a temp folder)")
    ap.add_argument("--child", choices=["case", "rank", "overhead"])
    ap.add_argument("--case")
    ap.add_argument("--cap-gib", type=float, default=FRAG_CAPS_GIB[0])
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--rep", type=int, default=0)
    args = ap.parse_args(argv)
    if args.child:
        return {"case": child_case, "rank": child_rank, "overhead": child_overhead}[args.child](args)
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
