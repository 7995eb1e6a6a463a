"""Where the GPU's memory goes, autograd node by node, in a plain training step with SDPA's math path
and Hugging Face gradient checkpointing (issue 11: fake mode predicts such steps one (B, H, S, S)
float32 tensor low).

Diagnostic configurations, not corpus cases (nothing held out is run): a 2-layer Llama with GQA in
float32 (SDPA takes the math path on the H200, torch 2.11), batch 2 x 2048, fused AdamW, the plain loop
of :func:`labkit.workloads.corpus.plain_step`; with HF's non-reentrant gradient checkpointing and
without it. Two recordings per configuration, each of one step after two warm-up steps:

* ``nodes``: a pre-hook and a hook on every autograd node of the step's graph (walked from the loss
  before ``backward``) read ``torch.cuda.memory_allocated`` before and after the node and the peak
  inside it (``reset_peak_memory_stats`` in the pre-hook). The recomputation of a checkpointed layer
  runs inside the first node of that layer that unpacks a saved tensor. Hooks hold no tensors.
* ``snapshot``: ``torch.cuda.memory._record_memory_history`` (Python stacks) over the step; the blocks
  live at the step's peak, largest first, with their allocation sizes and innermost Python frames.

    PYTHONPATH=. python3 benchmarks/gpu/record_ckpt_nodes.py --out DIR [--smoke]

``--smoke``: the same code on the CPU at a tiny size, SDPA held to its math path as on the H200 (no
allocator: memory figures are 0, no snapshot).
Writes ``DIR/ckpt_nodes.json`` (with provenance).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import write_measurement
from labkit.workloads.corpus import Case, plain_step, prepare_plain

LLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)


def configs(smoke: bool) -> list[Case]:
    base = Case("diag-llama-gqa-l2-b2-fp32", "transformers", "llama", "causal-lm", dict(TINY if smoke else LLAMA),
                2, 32 if smoke else 2048, "fp32")
    return [replace(base, name=base.name + "-hfgc", recompute="full", checkpoint_impl="hf"), base]


def _graph_nodes(root: Any) -> list[Any]:
    seen: set[int] = set()
    out: list[Any] = []
    stack = [root]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        out.append(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return out


def node_trace(case: Case, model: Any, opt: Any, batch: dict, cuda: bool) -> dict[str, Any]:
    """One step with a pre-hook and a hook on every node: memory before / peak inside / after."""
    mem = torch.cuda.memory_allocated if cuda else (lambda: 0)
    rows: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}

    def pre(node: Any) -> Any:
        def hook(grad_outputs: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            open_[id(node)] = {"node": node.name(), "before": mem(), "order": len(rows) + len(open_)}
        return hook

    def post(node: Any) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            r = open_.pop(id(node), {"node": node.name(), "before": None, "order": -1})
            if cuda:
                torch.cuda.synchronize()
            r["peak_inside"] = torch.cuda.max_memory_allocated() if cuda else 0
            r["after"] = mem()
            rows.append(r)
        return hook

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loss = model(**batch).loss
    fwd_peak = torch.cuda.max_memory_allocated() if cuda else 0
    handles = []
    for n in _graph_nodes(loss.grad_fn):
        handles.append(n.register_prehook(pre(n)))
        handles.append(n.register_hook(post(n)))
    start = mem()
    loss.backward()
    del loss
    for h in handles:
        h.remove()
    opt.step()
    opt.zero_grad(set_to_none=True)
    big = sorted(rows, key=lambda r: -r["peak_inside"])[:25]
    return {"forward_peak": fwd_peak, "backward_start": start, "nodes": rows, "top_nodes": big}


def snapshot_peak(case: Case, model: Any, opt: Any, batch: dict) -> dict[str, Any]:
    """Blocks live at the peak of one plain step, from the allocator's own history."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=400000, stacks="python")
    plain_step(case, model, opt, batch)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][0] if snap.get("device_traces") else []
    live: dict[int, dict[str, Any]] = {}
    cur = base
    best = (cur, -1)
    best_live: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > best[0]:
                best = (cur, i)
                best_live = list(live.values())
        elif a in ("free_requested",):
            if e["addr"] in live:
                del live[e["addr"]]
                cur -= e["size"]
    out_live = []
    if best[1] >= 0:
        for e in sorted(best_live, key=lambda x: -x["size"])[:40]:
            frames = [f"{f.get('filename', '').split('site-packages/')[-1]}:{f.get('line')}:{f.get('name')}"
                      for f in (e.get("frames") or [])][:14]
            out_live.append({"size": e["size"], "frames": frames})
    return {"base_allocated": base, "max_memory_allocated": peak, "replayed_peak": best[0],
            "peak_event_index": best[1], "events": len(events), "live_at_peak_top40": out_live}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if cuda else "cpu"
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "smoke": args.smoke,
                               "torch": torch.__version__, "cases": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in configs(args.smoke):
        with contextlib.ExitStack() as stack:
            if not cuda:   # the CPU would take its flash kernel; the H200 takes math for fp32 + GQA by itself
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            record(case, cuda, dev, results, out)
    return 0


def record(case: Case, cuda: bool, dev: str, results: dict[str, Any], out: Path) -> None:
    """Two warm-up steps, the plain peak of a third, then the node trace and the snapshot of one step each."""
    t0 = time.perf_counter()
    model, opt, batch = prepare_plain(case, dev)
    for _ in range(2):
        plain_step(case, model, opt, batch, device_type=dev)
    rec: dict[str, Any] = {"name": case.name, "case": case.__dict__ | {"overrides": dict(case.overrides)}}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        plain_step(case, model, opt, batch)
        rec["plain_peak_allocated"] = torch.cuda.max_memory_allocated()
    rec["nodes"] = node_trace(case, model, opt, batch, cuda)
    if cuda:
        rec["snapshot"] = snapshot_peak(case, model, opt, batch)
    rec["wall_s"] = time.perf_counter() - t0
    results["cases"].append(rec)
    del model, opt, batch
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    write_measurement(out / "ckpt_nodes.json", "ckpt_nodes", results)
    print(f"{case.name}: {rec.get('plain_peak_allocated')} B plain peak, {rec['wall_s']:.1f} s", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
