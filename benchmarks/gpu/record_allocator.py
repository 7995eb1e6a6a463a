"""Record the CUDA caching allocator's real behaviour: traces, stats, experiments, real OOMs.

    PYTHONPATH=. python3 benchmarks/gpu/record_allocator.py --out DIR [--smoke] [--budget-s 170]
        [--parts all|fidelity|capped|experiments|imbalance] [--fid workload:config,...]

Every allocator configuration runs in a FRESH process (``PYTORCH_ALLOC_CONF`` is read once, at CUDA
initialisation). Parts, in order of importance:

1. fidelity: each workload of ``labkit.allocator.experiments.WORKLOADS`` under each configuration of
   ``RECORDED_CONFIGS``; each run saves its ``memory_stats()`` and a step timeline
   (``fid__<workload>__<config>.json``); the default (and expandable) runs also save their gzip'd
   ``_snapshot()`` trace (``trace__<workload>__<config>.pickle.gz``, recorded with context=None).
2. OOMs provoked honestly under ``set_per_process_memory_fraction`` (genuinely too large,
   fragmentation under default vs expandable segments, a leak that grows across steps), and a
   request blocked by memory another process caches; each saves the real OOM message text,
   ``memory_stats()`` and a small snapshot (``oom__<case>.json`` / ``.pickle.gz``).
3. what ``empty_cache()`` frees and what it cannot (``exp__empty_cache.json``).
4. imbalance across ranks: stray CUDA contexts on GPU 0 (needs 2 GPUs; ``exp__imbalance.json``).

On a machine without CUDA (``--smoke``) the workloads run on the CPU at tiny sizes to check the
orchestration, and every CUDA-only part prints why it is skipped.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GiB = 1024**3
MiB = 1024**2
TRACED_CONFIGS = ("default", "expandable")


def log(msg: str) -> None:
    print(f"[record_allocator {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------- child side

def _cuda():
    import torch

    return torch.cuda.is_available()


def _start_history(max_entries: int) -> None:
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=max_entries)
    except TypeError:  # older signature
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=max_entries)


def _save_snapshot(path: Path) -> dict:
    import torch

    snap = torch.cuda.memory._snapshot()
    with gzip.open(path, "wb", compresslevel=9) as f:
        pickle.dump(snap, f, protocol=4)
    traces = snap.get("device_traces") or [[]]
    return {"trace_file": path.name, "trace_events": sum(len(t) for t in traces),
            "trace_bytes_gz": path.stat().st_size}


def _device_info() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    return {"device_name": p.name, "device_total_bytes": int(p.total_memory), "mem_get_info_total_bytes": int(total),
            "mem_get_info_free_bytes": int(free)}


def _write(out: Path, name: str, kind: str, data: dict) -> None:
    from labkit.core.provenance import write_measurement

    write_measurement(out / name, kind, data, command=" ".join(sys.argv))


def _request_signature(snapshot_path: Path) -> dict:
    """Address-free digest of the program's requests (alloc sizes and which alloc each free frees)."""
    import hashlib

    with gzip.open(snapshot_path, "rb") as f:
        snap = pickle.load(f)
    h = hashlib.sha256()
    live: dict[int, int] = {}
    n = 0
    for e in (snap.get("device_traces") or [[]])[0]:
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = n
            h.update(f"a{e['size']}s{e.get('stream', 0)};".encode())
            n += 1
        elif a == "free_requested":
            h.update(f"f{live.pop(e['addr'], -1)};".encode())
    return {"requests": n, "sha256": h.hexdigest()}


def child_fidelity(args) -> int:
    import torch

    from labkit.allocator.experiments import get_workload

    out = Path(args.out)
    name = f"fid__{args.workload}__{args.config}"
    conf = os.environ.get("PYTORCH_ALLOC_CONF", "")
    if not _cuda():
        dev = torch.device("cpu")
        run = get_workload(args.workload)(dev, smoke=True)
        log(f"{name}: no CUDA here; ran the workload on the CPU ({len(run.steps)} steps), no allocator stats to save")
        return 0
    dev = torch.device("cuda", 0)
    max_entries = 400_000
    _start_history(max_entries)
    cap_info = {}
    if os.environ.get("LABKIT_ALLOC_CAP_BYTES"):
        cap_info = _set_cap(int(os.environ["LABKIT_ALLOC_CAP_BYTES"]))  # before any allocation
    t0 = time.perf_counter()
    oom = None
    try:
        run = get_workload(args.workload)(dev, smoke=args.smoke)
        steps, description = run.steps, run.description
    except torch.OutOfMemoryError as exc:  # under a cap: keep what happened
        oom, steps, description = str(exc), [], "stopped by an out-of-memory error"
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    data = {"workload": args.workload, "config": args.config, "alloc_conf": conf, "description": description,
            "steps": steps, "wall_s": wall, "max_entries": max_entries, "oom_message": oom, **cap_info,
            **_device_info()}
    tmp = out / f"_tmp_{name}.pickle.gz"
    trace_path = out / f"trace__{args.workload}__{args.config}.pickle.gz"
    info = _save_snapshot(tmp)
    data["stats"] = {k: v for k, v in torch.cuda.memory_stats(0).items()}
    data["trace_events"] = info["trace_events"]
    data["trace_complete"] = info["trace_events"] < max_entries
    data["request_signature"] = _request_signature(tmp)
    if args.config in TRACED_CONFIGS:
        tmp.replace(trace_path)
        data["trace_file"] = trace_path.name
        data["trace_bytes_gz"] = trace_path.stat().st_size
    else:
        tmp.unlink()
    _write(out, name + ".json", "allocator.fidelity_run", data)
    s = data["stats"]
    log(f"{name}: reserved peak {s.get('reserved_bytes.all.peak', 0)/GiB:.2f} GiB, allocated peak "
        f"{s.get('allocated_bytes.all.peak', 0)/GiB:.2f} GiB, segments peak {s.get('segment.all.peak')}, "
        f"device allocs {s.get('num_device_alloc')}, {info['trace_events']} trace events, {wall:.1f} s")
    return 0


def _oom_record(out: Path, case: str, exc: BaseException | None, extra: dict, snap: bool = True) -> None:
    import torch

    data = {"case": case, "oom_message": str(exc) if exc is not None else None, "oom": exc is not None,
            "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", ""), **_device_info(), **extra}
    if snap:
        info = _save_snapshot(out / f"oom__{case}.pickle.gz")
        data.update(info)
    data["stats"] = dict(torch.cuda.memory_stats(0))
    _write(out, f"oom__{case}.json", "allocator.oom_case", data)
    if exc is not None:
        (out / f"oom__{case}.txt").write_text(str(exc) + "\n")
    log(f"oom case {case}: {'OOM: ' + str(exc)[:160] if exc is not None else 'no OOM'}")


def _set_cap(cap_bytes: int) -> dict:
    import torch

    _, total = torch.cuda.mem_get_info(0)
    frac = cap_bytes / total
    torch.cuda.set_per_process_memory_fraction(frac, 0)
    return {"memory_fraction": frac, "cap_bytes": int(frac * total)}


def _fresh_case() -> None:
    """Between OOM cases in one process: nothing live, cache empty, stats and history reset."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    torch.cuda.reset_accumulated_memory_stats(0)
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except TypeError:
        torch.cuda.memory._record_memory_history(False)


def _oom_case(case: str, out: Path, dev, smoke: bool) -> None:
    import torch

    _fresh_case()
    if case == "too_large":
        _start_history(10_000)
        extra = _set_cap(4 * GiB)
        keep = torch.empty(1 * GiB, dtype=torch.uint8, device=dev)
        exc = None
        try:
            big = torch.empty(5 * GiB, dtype=torch.uint8, device=dev)
            del big
        except torch.OutOfMemoryError as e:
            exc = e
        extra["request_bytes"] = 5 * GiB
        _oom_record(out, case, exc, extra)
        del keep
    elif case.startswith("fragmentation"):
        _start_history(10_000)
        extra = _set_cap(6 * GiB)
        blocks = [torch.empty(1 * GiB, dtype=torch.uint8, device=dev) for _ in range(5)]
        del blocks
        big = [torch.empty(1000 * MiB, dtype=torch.uint8, device=dev) for _ in range(5)]
        keepers = [torch.empty(20 * MiB, dtype=torch.uint8, device=dev) for _ in range(5)]
        del big
        exc = None
        try:
            x = torch.empty(2 * GiB, dtype=torch.uint8, device=dev)
            del x
        except torch.OutOfMemoryError as e:
            exc = e
        extra["request_bytes"] = 2 * GiB
        extra["pattern"] = ("5 x 1 GiB allocated and freed; 5 x 1000 MiB allocated; 5 x 20 MiB allocated (they land in "
                            "the 24 MiB tails); the 1000 MiB tensors freed; then 2 GiB requested under a 6 GiB cap")
        _oom_record(out, case, exc, extra)
        del keepers
    elif case == "leak":
        from labkit.allocator.experiments import leak_loop

        _start_history(3_000)  # deliberately small: the ring buffer overflows (an incomplete trace sample)
        extra = _set_cap(3 * GiB)
        per_step: list[int] = []
        exc = None
        try:
            leak_loop(dev, max_steps=200, batch=2, smoke=smoke,
                      on_step=lambda s: per_step.append(int(torch.cuda.memory_allocated(dev))))
        except torch.OutOfMemoryError as e:
            exc = e
        extra["allocated_after_step_bytes"] = per_step
        extra["history_max_entries"] = 3_000
        _oom_record(out, case, exc, extra)
    else:
        raise SystemExit(f"unknown case {case}")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)


def child_oom(args) -> int:
    """One or more OOM cases (comma-separated) in this process, one after the other, reset in between."""
    import torch

    if not _cuda():
        log(f"oom case(s) {args.case}: skipped, needs CUDA (set_per_process_memory_fraction and real OOM messages)")
        return 0
    out = Path(args.out)
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    for case in args.case.split(","):
        t0 = time.perf_counter()
        try:
            _oom_case(case, out, dev, args.smoke)
        except Exception as exc:  # one case failing must not lose the others
            log(f"oom case {case}: failed: {type(exc).__name__}: {exc}")
        log(f"oom case {case}: {time.perf_counter() - t0:.1f} s")
    return 0


def child_holder(args) -> int:
    """Holds a large cached (freed, not released) block until told to empty_cache, then exits."""
    import torch

    dev = torch.device("cuda", 0)
    _, total = torch.cuda.mem_get_info(0)
    x = torch.empty(int(total * 0.6), dtype=torch.uint8, device=dev)
    small = torch.empty(1 * GiB, dtype=torch.uint8, device=dev)
    del x
    print(json.dumps({"phase": "holding", "reserved": torch.cuda.memory_reserved(dev),
                      "allocated": torch.cuda.memory_allocated(dev), "pid": os.getpid()}), flush=True)
    sys.stdin.readline()
    torch.cuda.empty_cache()
    print(json.dumps({"phase": "emptied", "reserved": torch.cuda.memory_reserved(dev),
                      "allocated": torch.cuda.memory_allocated(dev)}), flush=True)
    sys.stdin.readline()
    del small
    return 0


def child_victim(args) -> int:
    import torch

    dev = torch.device("cuda", 0)
    _, total = torch.cuda.mem_get_info(0)
    want = int(total * 0.5)
    res = {"request_bytes": want}
    try:
        y = torch.empty(want, dtype=torch.uint8, device=dev)
        res["first_try"] = "ok"
        del y
    except torch.OutOfMemoryError as e:
        res["first_try"] = "oom"
        res["oom_message"] = str(e)
        res["stats_at_oom"] = dict(torch.cuda.memory_stats(0))
    print(json.dumps(res), flush=True)
    sys.stdin.readline()
    try:
        y = torch.empty(want, dtype=torch.uint8, device=dev)
        res2 = {"second_try": "ok"}
        del y
    except torch.OutOfMemoryError as e:
        res2 = {"second_try": "oom", "oom_message_2": str(e)}
    print(json.dumps(res2), flush=True)
    return 0


def child_empty_cache(args) -> int:
    import torch

    if not _cuda():
        log("empty_cache experiment: skipped, needs CUDA")
        return 0
    from labkit.allocator.experiments import varlen_train

    dev = torch.device("cuda", 0)
    torch.cuda.init()

    def state(label: str) -> dict:
        s = torch.cuda.memory_stats(0)
        return {"label": label, "allocated_bytes": s.get("allocated_bytes.all.current", 0),
                "reserved_bytes": s.get("reserved_bytes.all.current", 0),
                "inactive_split_bytes": s.get("inactive_split_bytes.all.current", 0),
                "segments": s.get("segment.all.current", 0)}

    rows = []
    run = varlen_train(dev, steps=6, smoke=args.smoke)
    rows.append(state("after 6 training steps (model + optimizer state alive)"))
    torch.cuda.empty_cache()
    rows.append(state("after empty_cache()"))
    a = torch.empty(1 * GiB, dtype=torch.uint8, device=dev)
    del a
    rows.append(state("a 1 GiB tensor allocated and freed"))
    b = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
    rows.append(state("a 100 MiB tensor allocated"))
    torch.cuda.empty_cache()
    rows.append(state("empty_cache() while the 100 MiB tensor lives"))
    del b
    torch.cuda.empty_cache()
    rows.append(state("the 100 MiB tensor freed, then empty_cache()"))
    _write(Path(args.out), "exp__empty_cache.json", "allocator.empty_cache",
           {"rows": rows, "workload_steps": run.steps, **_device_info()})
    for r in rows:
        log(f"empty_cache: {r['label']}: reserved {r['reserved_bytes']/MiB:.0f} MiB, allocated "
            f"{r['allocated_bytes']/MiB:.0f} MiB, inactive split {r['inactive_split_bytes']/MiB:.0f} MiB")
    return 0


def child_rank(args) -> int:
    """A 'rank' that touches CUDA before set_device (a stray context on GPU 0), then works on its GPU."""
    import torch

    r = args.rank
    if args.stray:
        torch.zeros(1).cuda()  # the bug: creates a context (and a caching allocator) on GPU 0
    torch.cuda.set_device(r)
    x = torch.empty(2 * GiB, dtype=torch.uint8, device=f"cuda:{r}")
    stats = dict(torch.cuda.memory_stats(r))
    print(json.dumps({"rank": r, "pid": os.getpid(), "stats": stats}), flush=True)
    sys.stdin.readline()
    del x
    return 0


# ---------------------------------------------------------------------------------------- parent side

def _env(conf: str, gpu: int | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # it has priority over PYTORCH_ALLOC_CONF in torch's reader
    env.pop("LABKIT_ALLOC_CAP_BYTES", None)
    env["PYTORCH_ALLOC_CONF"] = conf
    if not conf:
        env.pop("PYTORCH_ALLOC_CONF")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _child_cmd(args, *extra: str) -> list[str]:
    cmd = [sys.executable, str(HERE), "--out", str(args.out), *extra]
    if args.smoke:
        cmd.append("--smoke")
    return cmd


def _run(cmd: list[str], env: dict, timeout: float) -> int:
    try:
        p = subprocess.run(cmd, env=env, timeout=max(5.0, timeout), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired:
        log(f"timed out: {' '.join(cmd[-6:])}")
        return 124
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    if p.returncode:
        log(f"child failed ({p.returncode}): {' '.join(cmd[-6:])}")
    return p.returncode


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return int(n)
    except Exception:
        try:
            import torch

            return torch.cuda.device_count()
        except Exception:
            return 0


def _nvml_snapshot() -> list[dict]:
    import pynvml

    pynvml.nvmlInit()
    rows = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = [{"pid": p.pid, "used_bytes": p.usedGpuMemory} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        rows.append({"gpu": i, "used_bytes": int(mem.used), "total_bytes": int(mem.total), "processes": procs})
    pynvml.nvmlShutdown()
    return rows


def parent_other_process(args, deadline: float) -> None:
    if args.smoke or _gpu_count() == 0:
        log("other-process cache experiment: skipped, needs a GPU")
        return
    env = _env("", 0)
    holder = subprocess.Popen(_child_cmd(args, "--child", "holder"), env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    victim = None
    try:
        h1 = json.loads(holder.stdout.readline())
        victim = subprocess.Popen(_child_cmd(args, "--child", "victim"), env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        v1 = json.loads(victim.stdout.readline())
        nvml = _nvml_snapshot()
        holder.stdin.write("go\n"); holder.stdin.flush()
        h2 = json.loads(holder.stdout.readline())
        victim.stdin.write("go\n"); victim.stdin.flush()
        v2 = json.loads(victim.stdout.readline())
        holder.stdin.write("go\n"); holder.stdin.flush()
        data = {"holder_before": h1, "holder_after_empty_cache": h2, "victim": v1, "victim_after": v2,
                "nvml_while_holding": nvml}
        if v1.get("oom_message"):
            (Path(args.out) / "oom__other_process.txt").write_text(v1["oom_message"] + "\n")
        _write(Path(args.out), "oom__other_process.json", "allocator.other_process", data)
        log(f"other process: holder reserved {h1['reserved']/GiB:.1f} GiB; victim first try {v1.get('first_try')}; "
            f"after holder's empty_cache (reserved {h2['reserved']/GiB:.1f} GiB) second try {v2.get('second_try')}")
    finally:
        for p in (holder, victim):
            if p is not None:
                try:
                    p.wait(timeout=max(1.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    p.kill()


def parent_imbalance(args, deadline: float) -> None:
    if args.smoke or _gpu_count() < 2:
        log("imbalance experiment: skipped, needs 2 GPUs")
        return
    env = _env("", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = []
    try:
        for r in range(2):
            procs.append(subprocess.Popen(_child_cmd(args, "--child", "rank", "--rank", str(r), "--stray"),
                                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        ranks = [json.loads(p.stdout.readline()) for p in procs]
        time.sleep(0.5)
        nvml = _nvml_snapshot()
        for p in procs:
            p.stdin.write("go\n"); p.stdin.flush()
        _write(Path(args.out), "exp__imbalance.json", "allocator.imbalance",
               {"ranks": ranks, "nvml": nvml,
                "bug": "each rank ran torch.zeros(1).cuda() before torch.cuda.set_device(rank)"})
        log("imbalance: " + ", ".join(f"GPU {g['gpu']} used {g['used_bytes']/GiB:.2f} GiB by {len(g['processes'])} processes"
                                      for g in nvml))
    finally:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()


def parent(args) -> int:
    from labkit.allocator.experiments import CAPPED_CONFIGS, RECORDED_CONFIGS, WORKLOADS

    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ngpu = _gpu_count()
    # memory statistics do not depend on timing (no cross-stream frees in these workloads), so several
    # children may share a GPU; the other-process experiment runs alone afterwards
    slots = max(1, args.concurrency if ngpu else 1)
    log(f"{ngpu} GPU(s) visible; {slots} run(s) at a time; budget {args.budget_s:.0f} s; out {out}")

    parts = set(args.parts.split(","))
    jobs: list[tuple[str, str, str]] = []
    if args.fid:
        for item in args.fid.split(","):
            w, _, c = item.partition(":")
            if w not in WORKLOADS or (c not in RECORDED_CONFIGS and c not in CAPPED_CONFIGS):
                raise SystemExit(f"--fid {item!r}: expected workload:config from {list(WORKLOADS)} x "
                                 f"{list(RECORDED_CONFIGS) + list(CAPPED_CONFIGS)}")
            jobs.append(("fid", w, c))
    elif "fidelity" in parts or "all" in parts:
        jobs = [("fid", w, c) for w in WORKLOADS for c in RECORDED_CONFIGS]
        if args.smoke:
            jobs = [("fid", w, c) for w in WORKLOADS for c in list(RECORDED_CONFIGS)[:2]]
    if "capped" in parts or "all" in parts:
        jobs += [("fid", w, c) for c, (_, caps) in CAPPED_CONFIGS.items() for w in caps]
    if "experiments" in parts or "all" in parts:
        # several OOM cases share one process (reset between them): process start-up is most of the cost
        jobs = [("oom", "too_large,fragmentation,leak", ""),
                ("oom", "fragmentation_expandable", "expandable_segments:True"),
                ("empty_cache", "", "")] + jobs

    def run_job(i: int, job) -> int:
        gpu = (i % ngpu) if ngpu else None
        remaining = deadline - time.time()
        if remaining < 8:
            log(f"skipped {job}: out of time budget")
            return 0
        kind, a, b = job
        if kind == "fid":
            if b in CAPPED_CONFIGS:
                conf, caps = CAPPED_CONFIGS[b]
                env = _env(conf, gpu)
                env["LABKIT_ALLOC_CAP_BYTES"] = str(caps[a])
            else:
                env = _env(RECORDED_CONFIGS[b], gpu)
            return _run(_child_cmd(args, "--child", "fidelity", "--workload", a, "--config", b), env, remaining)
        if kind == "oom":
            return _run(_child_cmd(args, "--child", "oom", "--case", a), _env(b, gpu), remaining)
        return _run(_child_cmd(args, "--child", "empty_cache"), _env("", gpu), remaining)

    # the OOM cases run first and alone: their messages list the processes on the GPU
    alone = [j for j in jobs if j[0] == "oom"]
    jobs = [j for j in jobs if j[0] != "oom"]
    codes = [run_job(0, j) for j in alone]
    with cf.ThreadPoolExecutor(max_workers=slots) as ex:
        futs = []
        for i, job in enumerate(jobs):
            futs.append(ex.submit(run_job, i, job))
            if slots > 1:
                time.sleep(0.05)
        codes += [f.result() for f in futs]
    if not ("experiments" in parts or "all" in parts):
        pass
    elif time.time() < deadline - 20:
        parent_other_process(args, deadline)
    else:
        log("other-process experiment: skipped, out of time budget")
    if not ("experiments" in parts or "all" in parts or "imbalance" in parts):
        pass
    elif time.time() < deadline - 15:
        parent_imbalance(args, deadline)
    else:
        log("imbalance experiment: skipped, out of time budget")
    failed = sum(1 for c in codes if c)
    log(f"done in {time.time() - t_start:.0f} s; {failed} child run(s) failed")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON results and gzip'd traces")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; on a CPU-only machine, check the orchestration")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop starting new runs after this many seconds")
    ap.add_argument("--concurrency", type=int, default=3, help="children running at once (they may share a GPU)")
    ap.add_argument("--parts", default="all", help="comma list of: all, fidelity, capped, experiments, imbalance (default all)")
    ap.add_argument("--fid", default="", help="only these fidelity runs: workload:config,... (overrides --parts fidelity)")
    ap.add_argument("--child", choices=["fidelity", "oom", "holder", "victim", "empty_cache", "rank"])
    ap.add_argument("--workload")
    ap.add_argument("--config")
    ap.add_argument("--case")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--stray", action="store_true")
    args = ap.parse_args(argv)
    child = {"fidelity": child_fidelity, "oom": child_oom, "holder": child_holder, "victim": child_victim,
             "empty_cache": child_empty_cache, "rank": child_rank}
    if args.child:
        return child[args.child](args)
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
