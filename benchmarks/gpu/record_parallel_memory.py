"""Record per-rank peak memory of real 2-GPU training steps of the reference GPT, so the analytical
estimator (``labkit.memory.estimate``) can be compared with them.

Configurations (each run in the same two NCCL ranks, one after the other, with the caching
allocator emptied and its peak counters reset in between):

* ``single``: no parallelism, every rank trains its own copy (the baseline the estimator knows best);
* ``tp``: tensor parallelism over the 2 ranks with ``torch.distributed.tensor.parallel``
  (``qkv`` and ``mlp.fc`` column-wise, ``attn.proj`` and ``mlp.proj`` row-wise; embeddings,
  norms and the tied LM head replicated), both ranks see the same batch;
* ``tp-sp``: the same plus sequence parallelism on the norms and the residual stream;
* ``fsdp``: FSDP2 ``fully_shard`` on every block and on the root (ZeRO-3: parameters resharded
  after forward), each rank its own batch;
* ``fsdp-noreshard``: FSDP2 with ``reshard_after_forward=False`` (ZeRO-2-like).

On a machine with a single GPU the two ranks share it over gloo (``mode: shared``): per-rank peaks
are per process and stay valid, but only ``single`` and ``tp`` run (gloo has no all-gather or
reduce-scatter on CUDA tensors, NCCL refuses two ranks on one GPU).

Each for precision ``fp32`` and ``amp-bf16`` (autocast; FSDP2 uses ``MixedPrecisionPolicy(bf16
params, fp32 reduce)`` instead, which keeps the fp32 sharded parameters and gathers bf16 copies).
For every step and every phase (forward, backward, optimizer step) the script records
``max_memory_allocated`` with the peak counter reset at the phase's start, the allocated bytes at
the phase's end, ``memory_stats()`` peaks (allocated, reserved, active) and the device's used
memory (``mem_get_info``) so that the CUDA context and NCCL's own buffers can be told apart.

Run on a 2-GPU machine::

    PYTHONPATH=. python3 benchmarks/gpu/record_parallel_memory.py --out DIR

On a CPU-only machine, ``--smoke`` runs the same code paths on gloo with a tiny model (no memory
figures: they need CUDA) so the script is known to work.

The training step (the "harness" the estimator models)::

    loss = model(x, y)[1]          # the logits are not kept by the caller
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)

Note on the fused QKV projection under TP: rank r holds rows [r*3h/t, (r+1)*3h/t) of the fused
weight and splits its local output into q, k, v of h/t columns each (h/t heads' worth). This is a
row permutation of a randomly initialised full weight, so memory and FLOPs are those of a
correctly split Megatron-style layer.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from labkit.core.provenance import write_measurement
from labkit.workloads.gpt import GPT, GPTConfig
from labkit.workloads.reference import get_workload

KIND = "parallel_memory"
PARALLEL = ("single", "tp", "tp-sp", "fsdp", "fsdp-noreshard")
PRECISIONS = ("fp32", "amp-bf16")


def log(msg: str) -> None:
    print(f"[record_parallel_memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- model surgery for TP

def _tp_attn_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Attention forward on the local shard: the local qkv output has 3h/t columns."""
    import torch.nn.functional as F

    B, T, _ = x.shape
    qkv = self.qkv(x)
    c_local = qkv.size(-1) // 3
    heads = self.n_head_local
    q, k, v = qkv.split(c_local, dim=2)
    q, k, v = (t.view(B, T, heads, c_local // heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, c_local)
    return self.resid_drop(self.proj(y))


_TP_CLASSES: dict = {}


def _tp_attention_class(base: type) -> type:
    if base not in _TP_CLASSES:
        _TP_CLASSES[base] = type(f"TP{base.__name__}", (base,), {"forward": _tp_attn_forward})
    return _TP_CLASSES[base]


def apply_tp(model: GPT, mesh, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    t = mesh.size()
    for block in model.blocks:
        attn = block.attn
        attn.n_head_local = attn.n_head // t
        # a subclass, not a bound method stored on the instance: that would make a reference cycle
        # and keep the model alive (on the GPU) until the garbage collector runs
        attn.__class__ = _tp_attention_class(type(attn))
        if sequence_parallel:
            plan = {
                "ln1": SequenceParallel(use_local_output=True),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                           use_local_output=True),
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                "ln2": SequenceParallel(use_local_output=True),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=True),
                "mlp.fc": ColwiseParallel(),
                "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
            }
        else:
            plan = {
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(),
                "mlp.proj": RowwiseParallel(),
            }
        parallelize_module(block, mesh, plan)
    if sequence_parallel:
        # The residual stream is sequence-sharded between the embeddings and the final norm:
        # blocks take and return local shards (B, T/t, h); the norms see them as Shard(1) DTensors.
        parallelize_module(model, mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True),
        })


# ---------------------------------------------------------------- one configuration

def _mem(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    st = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "max_allocated": torch.cuda.max_memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "max_reserved": torch.cuda.max_memory_reserved(device),
        "allocated_peak_stat": st.get("allocated_bytes.all.peak"),
        "reserved_peak_stat": st.get("reserved_bytes.all.peak"),
        "active_peak_stat": st.get("active_bytes.all.peak"),
        "inactive_split_peak_stat": st.get("inactive_split_bytes.all.peak"),
        "num_alloc_retries": st.get("num_alloc_retries"),
        "device_used": total - free,
        "device_total": total,
    }


def run_config(workload_name: str, cfg: GPTConfig, batch: int, parallel: str, precision: str, steps: int,
               rank: int, world: int, device: torch.device) -> dict:
    import torch.distributed as dist

    torch.manual_seed(1234)  # same weights on every rank (TP needs it; FSDP broadcasts nothing)
    cuda = device.type == "cuda"
    gc.collect()  # whatever an earlier (failed) configuration left in reference cycles
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = _mem(device)
    with torch.device(device):
        model = GPT(cfg)
    mp_policy = None
    if parallel in ("tp", "tp-sp"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        apply_tp(model, mesh, sequence_parallel=parallel == "tp-sp")
    elif parallel.startswith("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        if precision == "amp-bf16":
            mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kw = {"mesh": mesh, "reshard_after_forward": parallel == "fsdp"}
        if mp_policy is not None:
            kw["mp_policy"] = mp_policy
        for block in model.blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
    # foreach AdamW (the CUDA default) cannot mix DTensor and plain parameters in one list: under TP
    # the blocks' weights are DTensors and the embeddings/norms plain, so they go in two groups.
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    groups = [g for g in ([p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]) if g]
    opt = torch.optim.AdamW([{"params": g} for g in groups], lr=1e-4, weight_decay=0.1, foreach=True)
    # Autocast for the single and TP runs; FSDP2's mixed precision policy plays that role there.
    use_autocast = precision == "amp-bf16" and mp_policy is None
    after_setup = _mem(device)
    local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())

    gen = torch.Generator().manual_seed(99 + (rank if parallel.startswith("fsdp") or parallel == "single" else 0))
    x, y = model.example_batch(batch, generator=gen)
    x, y = x.to(device), y.to(device)
    step_records = []
    losses = []
    for step in range(steps):
        rec = {"step": step}
        for phase in ("forward", "backward", "optimizer"):
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            start = _mem(device)
            t0 = time.perf_counter()
            if phase == "forward":
                if use_autocast:
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = model(x, y)[1]
                else:
                    loss = model(x, y)[1]
            elif phase == "backward":
                loss.backward()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(device)
            end = _mem(device)
            rec[phase] = {"start_allocated": start.get("allocated"), "end_allocated": end.get("allocated"),
                          "peak_allocated": end.get("max_allocated"), "peak_reserved": end.get("max_reserved"),
                          "end_reserved": end.get("reserved"), "seconds": time.perf_counter() - t0}
        losses.append(float(loss.detach().float().item()) if not hasattr(loss, "full_tensor") else float(loss.full_tensor().item()))
        del loss
        rec["memory_stats_end"] = _mem(device)
        step_records.append(rec)
    steady = step_records[-1]
    out = {
        "workload": workload_name,
        "config": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd, "seq_len": cfg.seq_len,
                   "vocab_size": cfg.vocab_size, "dropout": cfg.dropout, "bias": cfg.bias, "tie_weights": cfg.tie_weights},
        "micro_batch": batch,
        "parallel": parallel,
        "world_size": world,
        "tp": world if parallel.startswith("tp") else 1,
        "sequence_parallel": parallel == "tp-sp",
        "dp": world if parallel.startswith("fsdp") else 1,
        "fsdp_reshard_after_forward": parallel == "fsdp" if parallel.startswith("fsdp") else None,
        "precision": precision,
        "mixed_precision": ("FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)" if mp_policy is not None
                            else ("torch.autocast(bf16)" if use_autocast else "none")),
        "optimizer": "AdamW(lr=1e-4, weight_decay=0.1, foreach=True), one param group per tensor type",
        "optimizer_groups": [sum(p.numel() for p in g) for g in groups],
        "harness": "loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)",
        "steps": steps,
        "rank": rank,
        "param_count": cfg.num_params,
        "local_param_elements": local_params,
        "baseline": base,
        "after_setup": after_setup,
        "step_records": step_records,
        "losses": losses,
        "peak_allocated_steady": (max(steady[p]["peak_allocated"] for p in ("forward", "backward", "optimizer"))
                                  if cuda else None),
        "peak_phase_steady": (max(("forward", "backward", "optimizer"), key=lambda p: steady[p]["peak_allocated"])
                              if cuda else None),
        "peak_allocated_first_step": (max(step_records[0][p]["peak_allocated"] for p in ("forward", "backward", "optimizer"))
                                      if cuda else None),
    }
    del model, opt, x, y, params, groups
    gc.collect()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    dist.barrier()
    return out


# ---------------------------------------------------------------- the ranks

def worker(rank: int, world: int, port: int, tmpdir: str, plan: list, steps: int, deadline: float, mode: str) -> None:
    """``mode``: "nccl" (one GPU per rank), "shared" (both ranks on cuda:0 over gloo), "cpu" (gloo)."""
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    results: dict = {"rank": rank, "configs": [], "skipped": [], "errors": []}
    timeout = datetime.timedelta(seconds=120)  # a rank that fails alone must not hang the other for 30 min
    use_cuda = mode != "cpu"
    if mode == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the CUDA context
        free, total = torch.cuda.mem_get_info(device)
        results["context_only_device_used"] = total - free
        results["context_only_reserved"] = torch.cuda.memory_reserved(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device, timeout=timeout)
    elif mode == "shared":
        device = torch.device("cuda", 0)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        for turn in range(world):  # one context at a time, so rank 0 sees its own context alone
            if turn == rank:
                torch.cuda.set_device(device)
                torch.zeros(1, device=device)
                free, total = torch.cuda.mem_get_info(device)
                if rank == 0:
                    results["context_only_device_used"] = total - free
                    results["context_only_reserved"] = torch.cuda.memory_reserved(device)
            dist.barrier()
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    t = torch.ones(1 << 20, device=device)
    dist.all_reduce(t)  # the first collective creates the communicator and its buffers
    del t
    if mode == "nccl":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        results["after_nccl_init_device_used"] = total - free
        results["after_nccl_init_reserved"] = torch.cuda.memory_reserved(device)
    for item in plan:
        name = f"{item['workload']}/{item['parallel']}/{item['precision']}"
        if time.time() > deadline:
            results["skipped"].append({"config": name, "reason": "time budget spent"})
            if rank == 0:
                log(f"skip {name}: time budget spent")
            continue
        if rank == 0:
            log(f"run {name}")
        try:
            w = get_workload(item["workload"])
            cfg = GPTConfig(**{**w.config.__dict__, **item.get("overrides", {})})
            res = run_config(item["workload"], cfg, item.get("batch", w.batch_size), item["parallel"],
                             item["precision"], steps, rank, world, device)
            results["configs"].append(res)
            if rank == 0 and use_cuda:
                log(f"  rank0 peak allocated {res['peak_allocated_steady'] / 2**30:.3f} GiB in {res['peak_phase_steady']}")
        except Exception as exc:  # record and continue with the next configuration
            results["errors"].append({"config": name, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-3000:]})
            log(f"rank {rank}: {name} failed: {type(exc).__name__}: {exc}")
            gc.collect()
            if use_cuda:
                torch.cuda.empty_cache()
    if use_cuda:
        free, total = torch.cuda.mem_get_info(device)
        results["end_device_used"] = total - free
    Path(tmpdir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def build_plan(smoke: bool, parallel_modes: tuple = PARALLEL, precisions: tuple = PRECISIONS) -> list:
    if smoke:
        return [{"workload": "tiny", "parallel": p, "precision": pr} for p in parallel_modes for pr in precisions]
    plan = []
    for workload in ("gpt2-124m", "gpt-small-ref"):
        for parallel in parallel_modes:
            for precision in precisions:
                plan.append({"workload": workload, "parallel": parallel, "precision": precision})
    return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON results")
    ap.add_argument("--smoke", action="store_true", help="tiny model; on a machine without 2 GPUs run on CPU/gloo")
    ap.add_argument("--steps", type=int, default=3, help="training steps per configuration (default 3)")
    ap.add_argument("--budget-s", type=float, default=110.0, help="stop starting configurations after this (default 110)")
    ap.add_argument("--parallel", nargs="+", choices=PARALLEL, default=list(PARALLEL),
                    help="which configurations to run (default all)")
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                    help="which precisions to run (default all)")
    args = ap.parse_args(argv)
    t_start = time.time()
    command = "PYTHONPATH=. python3 " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = 2
    parallel_modes = tuple(args.parallel)
    if n_gpu >= 2:
        mode = "nccl"
    elif n_gpu == 1 and not args.smoke:
        mode = "shared"
        log("one GPU here: both ranks share cuda:0 over gloo (per-rank peaks are per process, so they stay valid); "
            "gloo has no all-gather/reduce-scatter on CUDA tensors and NCCL refuses two ranks on one GPU, "
            "so tp-sp and fsdp are skipped")
        skipped_modes = [p for p in parallel_modes if p not in ("single", "tp")]
        for p in skipped_modes:
            log(f"skip {p}: needs 2 GPUs (NCCL all-gather/reduce-scatter)")
        parallel_modes = tuple(p for p in parallel_modes if p in ("single", "tp"))
    elif args.smoke:
        mode = "cpu"
        log("no GPU here: smoke run on CPU with gloo (code paths only, no memory figures)")
    else:
        log(f"skip: needs CUDA GPUs, found {n_gpu}; use --smoke to exercise the code paths on CPU (gloo)")
        return 0
    use_cuda = mode != "cpu"
    plan = build_plan(args.smoke, parallel_modes, tuple(args.precisions))
    deadline = t_start + args.budget_s
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        log(f"spawning {world} ranks ({mode}), {len(plan)} configurations")
        mp.spawn(worker, args=(world, port, tmp, plan, args.steps, deadline, mode), nprocs=world, join=True)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    # One file per configuration, holding both ranks.
    by_name: dict = {}
    for r in ranks:
        for c in r["configs"]:
            by_name.setdefault((c["workload"], c["parallel"], c["precision"]), []).append(c)
    written = []
    for (wl, par, prec), per_rank in sorted(by_name.items()):
        per_rank.sort(key=lambda c: c["rank"])
        data = {"workload": wl, "parallel": par, "precision": prec, "smoke": args.smoke, "device": "cuda" if use_cuda else "cpu",
                "world_size": world, "mode": mode, "shared_gpu": mode == "shared",
                "collective_backend": "nccl" if mode == "nccl" else "gloo", "ranks": per_rank,
                "context": {k: [r.get(k) for r in ranks] for k in ("context_only_device_used", "context_only_reserved",
                                                                  "after_nccl_init_device_used", "after_nccl_init_reserved")}}
        path = write_measurement(out / f"{wl}__{par}__{prec}.json", KIND, data, command=command)
        written.append(path.name)
    summary = {"smoke": args.smoke, "device": "cuda" if use_cuda else "cpu", "world_size": world, "mode": mode,
               "shared_gpu": mode == "shared",
               "files": written, "skipped": ranks[0]["skipped"], "errors": [e for r in ranks for e in r["errors"]],
               "context": [{k: r.get(k) for k in ("context_only_device_used", "context_only_reserved",
                                                   "after_nccl_init_device_used", "after_nccl_init_reserved", "end_device_used")}
                           for r in ranks],
               "seconds": time.time() - t_start}
    write_measurement(out / "summary.json", KIND + "_summary", summary, command=command)
    log(f"wrote {len(written)} configurations to {out} in {time.time() - t_start:.1f} s; "
        f"{len(summary['errors'])} errors, {len(summary['skipped'])} skipped")
    for e in summary["errors"]:
        log(f"error: {e['config']}: {e['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
