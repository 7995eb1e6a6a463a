"""Issue 26, item 3: does rank 0 on PyTorch's fake process group allocate what rank 0 of a real NCCL run does?

The lab's ground truth per rank (``ranks__fake_pg.json``, ``record_scripts.py --ranks``) is rank 0 of a world-N
launch run on ONE GPU with the fake process group (``torch.testing._internal.distributed.fake_pg``): its
collectives copy the rank's own shard into the outputs on the caller's stream and return a ``FakeWork``. A real
run goes through ``ProcessGroupNCCL``. No multi-GPU machine is lent, so this script makes the fake run take
NCCL's code path for the collectives that matter, on one GPU, each case in its own new process:

* ``fake``: rank R of a world of N on the fake group (as ``record_scripts.py --ranks``: DDP's reducer gets a
  communication hook that returns the bucket, since the fake group's future has no value);
* ``nccl-path``: the same fake world of N, but FSDP2's all-gathers and reduce-scatters (the functions it calls:
  ``dist.all_gather_single`` / ``all_gather_into_tensor`` / ``_all_gather_base`` and ``dist.reduce_scatter_single``
  / ``reduce_scatter_tensor`` / ``_reduce_scatter_base``) run through a real one-rank ``ProcessGroupNCCL`` on this
  rank's chunk: NCCL's kernel on the caller's stream (sync ops) or on NCCL's own stream with the tensors stashed
  until ``wait()`` (async ops), NCCL's ``Work`` (``None`` for a sync op), its reduce ops (AVG, PREMUL_SUM), its
  communicator; the peers' chunks are filled by a copy, as the fake group fills them. DDP's reducer gets a hook
  that calls that group's ``allreduce`` on the bucket and returns NCCL's future: what DDP's default hook does
  (``_AllReduceBySumCommHook``: ``process_group->allreduce(bucket)->getFuture()``);
* ``nccl-w1``: the script unchanged, as a real one-rank ``torchrun`` launch on NCCL (world 1; compare with
  ``fake`` at world 1).

After the script ends the wrapper reads ``max_memory_allocated``/``max_memory_reserved`` and the allocator's
counters (how many allocations and cudaMallocs, so that two runs with the same peak and the same counts made the
same calls), and, at each optimizer step, the device memory in use (``mem_get_info``) minus the allocator's
reserved bytes: the memory outside the allocator (CUDA context, cuBLAS, NCCL's communicator). ``mem_get_info``
is device-wide, so the cases run one after another (``--jobs`` is not offered). ``PREDICTIONS`` below were
committed before the recording; each row carries its prediction.

    PYTHONPATH=. python benchmarks/gpu/record_fakepg_paths.py --out DIR [--only SUBSTR[,SUBSTR]] [--budget 330]
    PYTHONPATH=. python benchmarks/gpu/record_fakepg_paths.py --out DIR --smoke   # CPU: gloo stands in for NCCL
    PYTHONPATH=. python benchmarks/gpu/record_fakepg_paths.py --out DIR --only ddp --pause 0.3

``--pause S``: after each optimizer step the GPU finishes its work and the process sleeps S seconds (longer
than the 100 ms in which NCCL's watchdog looks for completed work), written to ``fakepg_paths_pause.json``.
It tests the first recording's DDP finding (NCCL's stash keeps the buckets DDP's rebuild dropped until the
watchdog has seen their allreduces end and the group enqueues another collective): with the pause, the
watchdog has seen them before step 2, and the group's next allreduce unstashes them. Predicted before
recording: ddp-gpt2-w2 on NCCL's path within 0.1% of the fake group's 18021796864 bytes (the lab's trace puts
step 2's peak after that allreduce), against 19441568768 without the pause.

Writes ``DIR/fakepg_paths.json`` (``kind`` ``fakepg_paths``), rewritten after each case, with the provenance
header (GPU, driver, torch, CUDA, NCCL, transformers). ``--smoke`` runs a small FSDP2 and a small DDP script of
its own on whatever device there is (on a CPU: a one-rank gloo group stands in for NCCL; no peaks), to check the
plumbing: each row says how many collectives took the routed path.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from script_child import run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "data" / "scripts"
OUT_NAME = "fakepg_paths.json"

# (name, script relative to data/scripts, arguments, world size, mode); the most telling first (a budget may
# stop the run before the end; the file is rewritten after each case)
CASES = [
    ("fsdp2-llama-mp-w2", "ranks/fsdp2_llama.py", ["--mp"], 2, "fake"),
    ("fsdp2-llama-mp-w2", "ranks/fsdp2_llama.py", ["--mp"], 2, "nccl-path"),
    ("fsdp2-llama-w2", "ranks/fsdp2_llama.py", [], 2, "fake"),
    ("fsdp2-llama-w2", "ranks/fsdp2_llama.py", [], 2, "nccl-path"),
    ("fsdp2-llama-mp-w1", "ranks/fsdp2_llama.py", ["--mp"], 1, "fake"),
    ("fsdp2-llama-mp-w1", "ranks/fsdp2_llama.py", ["--mp"], 1, "nccl-w1"),
    ("ddp-gpt2-w2", "ranks/ddp_gpt2.py", [], 2, "fake"),
    ("ddp-gpt2-w2", "ranks/ddp_gpt2.py", [], 2, "nccl-path"),
    ("fsdp2-llama-mp-ckpt-w2", "ranks/fsdp2_llama.py", ["--mp", "--ckpt"], 2, "fake"),
    ("fsdp2-llama-mp-ckpt-w2", "ranks/fsdp2_llama.py", ["--mp", "--ckpt"], 2, "nccl-path"),
    ("fsdp2-llama-mp-w4", "ranks/fsdp2_llama.py", ["--mp"], 4, "fake"),
    ("fsdp2-llama-mp-w4", "ranks/fsdp2_llama.py", ["--mp"], 4, "nccl-path"),
]

# Predicted before recording (bytes; torch 2.11 on the H200, transformers 5.17 as in ranks__fake_pg.json).
# fake at world 2 and 4: the fake-group recordings of ranks__fake_pg.json (the same program, so the same bytes).
# nccl-path: the same bytes and the same allocation counts as fake: since PyTorch 2.8 (pytorch/pytorch#148590)
# ProcessGroupNCCL launches a sync collective on the caller's stream with no recordStream and no stash
# (ProcessGroupNCCL.cpp, collective(): "in asyncOp=false [default] mode, we use currentStream as ncclStream"),
# FSDP2's collectives are sync, and nothing in FSDP2 branches on the backend (_fsdp_collectives.py
# _get_gradient_divide_factors: AVG for float32/bfloat16 reductions on every backend but MTIA). DDP: its
# allreduce is async (stashed until the reducer waits), on the bucket, which the reducer holds anyway.
# world 1: fake and nccl-w1 equal each other (the lab's prediction, labkit measure --nproc-per-node 1, beside).
# Outside the allocator: nccl-path and nccl-w1 hold a one-rank NCCL communicator more than fake (tens of MiB,
# not measured before: labkit.memory.estimate.buffers assumes NCCL_BYTES_PER_COMMUNICATOR).
PREDICTIONS = {
    "fsdp2-llama-mp-w2": {"peak_allocated": 16401995776, "peak_reserved": 19413336064},
    "fsdp2-llama-w2": {"peak_allocated": 37953378304, "peak_reserved": 41689284608},
    "fsdp2-llama-mp-ckpt-w2": {"peak_allocated": 8140531712, "peak_reserved": 10248781824},
    "fsdp2-llama-mp-w4": {"peak_allocated": 14422130688, "peak_reserved": 15999172608},
    "ddp-gpt2-w2": {"peak_allocated": 18021796864, "peak_reserved": 19499319296},
    "fsdp2-llama-mp-w1": {"peak_allocated": None, "peak_reserved": None,
                          "note": "fake and nccl-w1 equal to the byte; the lab predicts the value beside"},
}

SMOKE_FSDP = r'''
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group(os.environ.get("SMOKE_BACKEND", "gloo"))
dev = "cuda" if torch.cuda.is_available() else "cpu"
mesh = init_device_mesh(dev, (dist.get_world_size(),))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
for m in model:
    if isinstance(m, torch.nn.Linear):
        fully_shard(m, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    model(torch.randn(16, 64, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
'''

SMOKE_DDP = r'''
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group(os.environ.get("SMOKE_BACKEND", "gloo"))
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    model(torch.randn(16, 64, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
'''

WRAPPER = r'''
import inspect, os, sys, time
import torch
import script_child as child
mode, path = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(path))
world = int(os.environ["WORLD_SIZE"])
cuda = torch.cuda.is_available()
routed = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "passed_through": 0}
inner_pg = []
if mode in ("fake", "nccl-path"):
    import torch.distributed as dist
    child.fake_process_group(world)

    def inner():
        # a real one-rank process group of the real backend: NCCL on a GPU, gloo on a CPU (--smoke)
        if not inner_pg:
            store = dist.PrefixStore("labkit-inner", dist.HashStore())
            inner_pg.append(dist.ProcessGroupNCCL(store, 0, 1) if cuda else dist.ProcessGroupGloo(store, 0, 1))
        return inner_pg[0]

    if mode == "fake":
        child.ddp_comm_hook()
    else:
        from torch._C._distributed_c10d import AllreduceOptions
        def through_nccl(state, bucket):
            routed["all_reduce"] += 1
            fut = inner().allreduce([bucket.buffer()], AllreduceOptions()).get_future()
            return fut.then(lambda f: f.value()[0])   # a Python hook returns a tensor's future
        child.ddp_comm_hook(through_nccl)

    if mode == "nccl-path":
        from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions

        def route(name, gather):
            orig = getattr(dist, name, None)
            if orig is None:
                return
            names = list(inspect.signature(orig).parameters)
            def routed_fn(*args, **kwargs):
                a = dict(zip(names, args))
                a.update(kwargs)
                out, inp = a[names[0]], a[names[1]]
                group = a.get("group") or dist.distributed_c10d._get_default_group()
                async_op = bool(a.get("async_op", False))
                w, r = group.size(), group.rank()
                if (w == 1 or not out.is_contiguous() or not inp.is_contiguous()
                        or out.device.type != ("cuda" if cuda else "cpu")):
                    routed["passed_through"] += 1
                    return orig(*args, **kwargs)
                out1, inp1 = out.view(-1), inp.view(-1)
                if gather:
                    n = inp1.numel()
                    opts = AllgatherOptions()
                    opts.asyncOp = async_op
                    work = inner()._allgather_base(out1.narrow(0, r * n, n), inp1, opts)
                    routed["all_gather"] += 1
                else:
                    m = out1.numel()
                    opts = ReduceScatterOptions()
                    opts.reduceOp = a.get("op", dist.ReduceOp.SUM)
                    opts.asyncOp = async_op
                    work = inner()._reduce_scatter_base(out1, inp1.narrow(0, r * m, m), opts)
                    routed["reduce_scatter"] += 1
                if work is not None and (not async_op or not cuda):
                    work.wait()          # gloo's ops are async in C++; NCCL's sync ops return no work
                if gather:               # the peers' chunks: filled as the fake group fills them
                    for j in range(w):
                        if j != r:
                            out1.narrow(0, j * n, n).copy_(inp1)
                return work if async_op else None
            routed_fn.__name__ = name
            setattr(dist, name, routed_fn)
            setattr(dist.distributed_c10d, name, routed_fn)

        for name in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"):
            route(name, True)
        for name in ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"):
            route(name, False)

steps = []
outside = []
pause = float(os.environ.get("RECORD_STEP_PAUSE", "0"))
from torch.optim.optimizer import register_optimizer_step_post_hook
def on_step(o, a, k):
    if cuda:
        steps.append(torch.cuda.max_memory_allocated())
        free, total = torch.cuda.mem_get_info()
        outside.append(total - free - torch.cuda.memory_reserved())
    if pause:   # the GPU idle for longer than NCCL's watchdog period (100 ms) before the next step
        if cuda:
            torch.cuda.synchronize()
        time.sleep(pause)
register_optimizer_step_post_hook(on_step)
child.run_script(path, routed=routed, step_pause_s=pause, inner_backend=lambda: inner_pg[0].name() if inner_pg else None,
                 step_cumulative_peaks=steps, outside_allocator_at_steps=outside)
if inner_pg and hasattr(inner_pg[0], "shutdown"):
    inner_pg[0].shutdown()   # NCCL's communicator and watchdog, before the interpreter exits
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(name: str, script: Path, args: list[str], world: int, mode: str, *, timeout: float,
             extra_env: dict[str, str] | None = None) -> dict:
    if mode == "nccl-w1" and world != 1:
        raise ValueError(f"{name}: nccl-w1 runs a real one-rank launch; world must be 1, not {world}")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **(extra_env or {}))
    t0 = time.perf_counter()
    result, err, rc = run_child(WRAPPER, [mode, str(script), *args], env=env, cwd=script.parent, timeout=timeout)
    row: dict = {"name": name, "mode": mode, "script": str(script.relative_to(ROOT)) if script.is_relative_to(ROOT)
                 else script.name, "args": args, "world_size": world, "rank": 0, "returncode": rc, **result}
    if "status" not in row:
        row["status"] = f"no result (rc {rc})"
    row["stderr_tail"] = err[-1500:] if row["status"] != "ok" else ""
    row["process_wall_s"] = round(time.perf_counter() - t0, 1)
    row["predicted"] = PREDICTIONS.get(name)
    print(f"[{time.strftime('%H:%M:%S')}] {name} {mode}: {row['status']} peak={row.get('peak_allocated')} "
          f"reserved={row.get('peak_reserved')} routed={row.get('routed')} ({row['process_wall_s']} s)", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated substrings of case names (default: all)")
    ap.add_argument("--timeout", type=float, default=90, help="seconds per case")
    ap.add_argument("--budget", type=float, default=330,
                    help="seconds for the whole run: a case is cut at the budget's end, and none starts after")
    ap.add_argument("--smoke", action="store_true", help="small scripts of this file's own, any device")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds the GPU idles after each optimizer step (writes fakepg_paths_pause.json)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from labkit.core.provenance import header, write_measurement

    prov = header()
    for mod in ("transformers",):
        try:
            prov[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - recorded as missing
            prov[mod] = f"unavailable ({type(e).__name__})"
    print(json.dumps(prov, indent=1), flush=True)
    out = Path(a.out) / (OUT_NAME.replace(".json", "_pause.json") if a.pause else OUT_NAME)
    rows: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if a.smoke:
            fsdp, ddp = Path(tmp) / "smoke_fsdp2.py", Path(tmp) / "smoke_ddp.py"
            fsdp.write_text(SMOKE_FSDP)
            ddp.write_text(SMOKE_DDP)
            cases = [("smoke-fsdp2-w2", fsdp, [], 2, "fake"), ("smoke-fsdp2-w2", fsdp, [], 2, "nccl-path"),
                     ("smoke-fsdp2-w1", fsdp, [], 1, "nccl-w1"), ("smoke-ddp-w2", ddp, [], 2, "fake"),
                     ("smoke-ddp-w2", ddp, [], 2, "nccl-path")]
            env = {"SMOKE_BACKEND": "nccl" if __import__("torch").cuda.is_available() else "gloo"}
        else:
            cases = [(n, SCRIPTS / s, ar, w, m) for n, s, ar, w, m in CASES
                     if not a.only or any(part in n for part in a.only.split(","))]
            env = {}
        if a.pause:
            env["RECORD_STEP_PAUSE"] = str(a.pause)
        for name, script, args, world, mode in cases:
            left = a.budget - (time.perf_counter() - t0)
            if left < 20:
                print(f"budget of {a.budget:.0f} s spent: {name} {mode} and the rest not run", flush=True)
                break
            rows.append(run_case(name, script, args, world, mode, timeout=min(a.timeout, left), extra_env=env))
            write_measurement(out, "fakepg_paths", rows, provenance=prov)
    bad = [f"{r['name']} {r['mode']}" for r in rows if r["status"] != "ok"]
    print(f"wrote {out}: {len(rows)} cases" + (f", not ok: {', '.join(bad)}" if bad else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
