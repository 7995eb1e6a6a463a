"""Ground truth for the fake-GPU tracer: the corpus (``labkit.workloads.corpus``) as plain, untraced
training loops on a GPU, exactly as users write them.

Per case: ``loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``
(fused or foreach AdamW as the case says; autocast around the forward for amp-bf16;
``model.to(torch.bfloat16)`` for bf16). Four steps; before each, ``torch.cuda.reset_peak_memory_stats``;
the peak is the max of ``torch.cuda.max_memory_allocated`` over steps 2-4 (likewise
``max_memory_reserved``), the step time the median of steps 2-4 (CUDA-synchronised wall time). One more
step runs under ``torch.profiler`` to list the CUDA kernels that ran (the attention kernels tell
which SDPA backend the GPU chose). No labkit code runs during the measured steps: the model comes
from its configuration, the loop is :func:`labkit.workloads.corpus.plain_step`. After the last step each row
keeps what the allocator held: ``end_segments`` (each segment's address and size), ``end_blocks`` (their
blocks, sizes and states) and ``allocator_stats`` (segments and bytes per pool, the cached free bytes of split
blocks, ``cudaMalloc``/``cudaFree`` counts), so that a reserved miss can be traced to segments.

Then the clue experiment of issue 11: the same GPT-2 large case (the lab's HF GPT-2 spec, batch 4 x 1024,
amp-bf16, fused AdamW) run as a plain loop with the output dropped / kept, with foreach AdamW,
by labkit's TrainStep untraced, under a do-nothing TorchDispatchMode, and by ``measure_step(device="cuda")``
(the tracer attached), to isolate why the traced recording is higher than the plain loop.

    PYTHONPATH=. python3 benchmarks/gpu/record_plain.py --out DIR [--budget 330] [--only SUBSTR] [--smoke]
        [--case NAME --case NAME ...] [--variants] [--predicted FILE]

``--predicted FILE``: the cases a ``fake_predictions`` file names (its predictions made before this recording:
``benchmarks/predict_cases.py``); with ``--fresh``, their predicted reserved peaks plan how many run at once.

``--variants``: the T5 and DeBERTa configuration variants of ``corpus.TRACED_VARIANTS`` (issue 26: traced and
estimated before any recording, data/measurements/estimate/traced_variants.json) instead of ``CASES``.

``--smoke``: a few cases at CI size on the CPU (no peaks: there is no allocator to ask), to check the script.
``--no-profile``: no profiled step after a case (no kernel list). A control on the H200
(``data/measurements/measure/plain__profiler_control.json``) found the profiled step does not move the later
cases' figures: two sequences of three cases gave byte-identical peaks and reserved peaks with and without it.
``--fresh J``: every case in its own new process, as a user runs one training script, J at a time (memory
only: the step times of concurrent processes are not recorded; no profiler), admitted while the running cases'
expected reserved peaks (from the corpus recording, ``--expect-gb`` (48) where unknown) stay under
``--gpu-budget`` GB, so that
no case's ``cudaMalloc`` can fail for another's (a failure would make the allocator free its cache and retry,
lowering the reserved peak: ``num_alloc_retries`` is recorded per row). Processes are independent address
spaces: the control's sequences, run beside ``--fresh`` processes, gave to the byte the figures recorded
earlier with nothing else on the GPU.
Writes ``DIR/plain_cases.json`` (rewritten after every case, so a run cut short keeps what finished),
``DIR/clue_gpt2_large.json`` and ``DIR/log.txt`` (with ``--fresh``, each case's process writes its own under
``DIR/fresh/NAME/`` and ``DIR/plain_cases.json`` gathers them at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import re
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import header, write_measurement
from labkit.workloads.corpus import CASES, TRACED_VARIANTS, Case, plain_step, prepare_plain, tiny

T0 = time.perf_counter()
LOG: list[str] = []
ATTENTION_KERNEL = re.compile(r"flash|fmha|efficient|attention|attn|sdpa|softmax", re.IGNORECASE)
SMOKE_CASES = ("gpt2-b8-amp-bf16", "llama-gqa-b4-bf16", "t5-base-b16-amp-bf16", "tv-resnet50-b128-amp-bf16",
               "llama-gqa-b4-lora-bf16", "llama-gqa-b8-hfgc-amp-bf16", "llama-gqa-b8-hfgc-reentrant-fp32",
               "llama-gqa-b8-ckpt-amp-bf16", "llama-gqa-b4-keep-amp-bf16")
STEPS = 4          # steps per measured loop: the first warms up, the peak is the max of the others


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


def cleanup(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def base_segments() -> list[dict[str, Any]]:
    """The allocator's segments before a case: what the earlier cases left after ``empty_cache`` (the
    segments that hold the cuBLAS workspaces, with their free remainders). Reserved memory is
    path-dependent: a prediction of the case's reserved peak starts from this state
    (``measure_step(allocator_state=...)``)."""
    return [{"address": int(s["address"]), "total_size": int(s["total_size"]), "stream": int(s["stream"]),
             "segment_type": s["segment_type"], "blocks": [[int(b["size"]), b["state"]] for b in s["blocks"]]}
            for s in torch.cuda.memory_snapshot()]


def segment_addresses() -> list[list[int]]:
    """Every segment's ``[address, size]`` now (what the driver gave the allocator), without its blocks."""
    return sorted([int(s["address"]), int(s["total_size"])] for s in torch.cuda.memory_snapshot())


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mod in ("transformers", "torchvision", "peft", "timm"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed or not importable: recorded as such
            out[mod] = None
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return out


ATTENTION_OP = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|softmax|baddbmm")


def profile_step(fn: Any, cuda: bool) -> tuple[list[str], dict[str, int]]:
    """One call of ``fn`` under ``torch.profiler``: the device kernels' names (GPU only) and the count
    of each ATen op about attention (which SDPA variant ran, softmax, baddbmm)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    kernels: set[str] = set()
    ops: dict[str, int] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels.add(e.name)
        elif e.name.startswith("aten::") and ATTENTION_OP.search(e.name):
            ops[e.name] = ops.get(e.name, 0) + 1
    return sorted(kernels), dict(sorted(ops.items()))


def sdpa_backends(ops: dict[str, int]) -> list[str]:
    """The SDPA backends that ran, from the ATen ops: flash, efficient, cudnn, math; ``eager`` when
    the model computed attention itself (softmax ops and no SDPA call)."""
    found = []
    for backend, names in (("flash", ("aten::_scaled_dot_product_flash_attention",
                                      "aten::_scaled_dot_product_flash_attention_for_cpu")),
                           ("efficient", ("aten::_scaled_dot_product_efficient_attention",)),
                           ("cudnn", ("aten::_scaled_dot_product_cudnn_attention",)),
                           ("math", ("aten::_scaled_dot_product_attention_math",))):
        if any(n in ops for n in names):
            found.append(backend)
    if not found and "aten::scaled_dot_product_attention" not in ops and any("softmax" in n for n in ops):
        found.append("eager")
    return found


# what the allocator held after the last step, by pool (the small pool's 2 MiB segments, the large pool's), and the
# cached free bytes inside split blocks: where a reserved miss comes from (torch.cuda.memory_stats' keys)
ALLOCATOR_STATS = tuple(f"{what}.{pool}.{when}" for what in ("segment", "reserved_bytes", "allocated_bytes")
                        for pool in ("large_pool", "small_pool") for when in ("current", "peak")) + (
    "inactive_split_bytes.all.current", "inactive_split.all.current", "oversize_segments.peak",
    "oversize_allocations.peak", "num_device_alloc", "num_device_free", "max_split_size")


def measure_loop(step: Any, cuda: bool, steps: int | None = None) -> dict[str, Any]:
    """Run ``step()`` ``steps`` times; peaks and times of steps 2..steps."""
    peaks, reserved, times = [], [], []
    for i in range(1, (steps or STEPS) + 1):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if i >= 2:
            times.append(dt)
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated())
                reserved.append(torch.cuda.max_memory_reserved())
    st = torch.cuda.memory_stats() if cuda else {}
    return {
        "peak_allocated": max(peaks) if peaks else None,
        "peak_reserved": max(reserved) if reserved else None,
        "step_peaks_allocated": peaks, "step_peaks_reserved": reserved,
        "end_allocated": torch.cuda.memory_allocated() if cuda else None,
        "step_times_s": times, "median_step_s": statistics.median(times),
        "num_alloc_retries": int(st.get("num_alloc_retries", 0)),
        "allocator_stats": {k: int(st[k]) for k in ALLOCATOR_STATS if k in st} if cuda else None,
    }


def run_case(case: Case, device: str, profile: bool = True) -> dict[str, Any]:
    cuda = device == "cuda"
    cleanup(cuda)
    row: dict[str, Any] = {"name": case.name, "split": case.split, "case": dataclasses.asdict(case),
                           "describe": case.describe(), "device": device}
    t = time.perf_counter()
    row["base_allocated"] = torch.cuda.memory_allocated() if cuda else None   # e.g. cuBLAS workspaces kept
    row["base_reserved"] = torch.cuda.memory_reserved() if cuda else None
    row["base_segments"] = base_segments() if cuda else None
    model = opt = batch = None
    try:
        model, opt, batch = prepare_plain(case, device)
        if cuda:
            torch.cuda.synchronize()
        row["init_allocated"] = torch.cuda.memory_allocated() if cuda else None
        row["num_params"] = sum(p.numel() for p in model.parameters())
        row["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        row["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
        row["attn_implementation"] = getattr(getattr(model, "config", None), "_attn_implementation", None)

        def step() -> None:
            plain_step(case, model, opt, batch, device_type=device)

        row.update(measure_loop(step, cuda))
        row["end_segments"] = segment_addresses() if cuda else None
        row["end_blocks"] = base_segments() if cuda else None     # the same segments with their blocks and states
        if profile:
            kernels, ops = profile_step(step, cuda)
            row["attention_kernels"] = [k for k in kernels if ATTENTION_KERNEL.search(k)]
            row["attention_ops"] = ops
            row["sdpa_backends"] = sdpa_backends(ops)
            row["num_kernels"] = len(kernels)
    except torch.cuda.OutOfMemoryError as exc:  # type: ignore[attr-defined]
        row["error"] = f"OutOfMemoryError: {str(exc).splitlines()[0]}"
    except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        row["traceback_tail"] = traceback.format_exc()[-1500:]
    del model, opt, batch
    cleanup(cuda)
    row["wall_s"] = time.perf_counter() - t
    return row


# ---------------------------------------------------------------------------------------------
# The clue of issue 11: traced recording 29.39 GB vs plain loop 26.9 GB (HF GPT-2 large, b4, amp-bf16)


class _NoopMode(torch.utils._python_dispatch.TorchDispatchMode):
    """A TorchDispatchMode that only forwards each op: isolates 'a Python dispatch mode is active'."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return func(*args, **(kwargs or {}))


def clue_experiment(device: str, smoke: bool) -> dict[str, Any]:
    from labkit.memory.trace.step import measure_step
    from labkit.workloads.harness import StepPolicy, TrainStep
    from labkit.workloads.hf import HFGPT2Spec, hf_gpt2_factory, hf_lm_batch

    cuda = device == "cuda"
    spec = (HFGPT2Spec(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512) if smoke
            else HFGPT2Spec.named("gpt2-large"))
    b, s = (2, 64) if smoke else (4, 1024)
    dt = torch.bfloat16

    def setup(impl: str = "fused") -> tuple[Any, Any, dict]:
        with torch.device(device):
            model = hf_gpt2_factory(spec)()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if impl == "fused" else {"foreach": True}))
        batch = {k: v.to(device) for k, v in hf_lm_batch(spec.vocab_size, b, s).items()}
        return model, opt, batch

    def plain(model: Any, opt: Any, batch: dict, keep: bool = False, mode: Any = None) -> Any:
        def step() -> None:
            with (mode() if mode else contextlib.nullcontext()):
                out = None
                with torch.autocast(device, dtype=dt):
                    if keep:
                        out = model(**batch)
                        loss = out.loss
                    else:
                        loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del out, loss
        return step

    results: dict[str, Any] = {"spec": spec.as_dict(), "batch": b, "seq": s, "precision": "amp-bf16", "variants": {}}
    variants = {
        "plain, fused AdamW, output dropped (loss = model(**batch).loss)": dict(impl="fused"),
        "plain, fused AdamW, output kept through backward": dict(impl="fused", keep=True),
        "plain, foreach AdamW, output dropped": dict(impl="foreach"),
        "plain under a do-nothing TorchDispatchMode": dict(impl="fused", mode=_NoopMode),
        "labkit TrainStep, untraced": dict(impl="fused", harness=True),
    }
    for label, v in variants.items():
        cleanup(cuda)
        try:
            model, opt, batch = setup(v["impl"])
            if v.get("harness"):
                del opt
                ts = TrainStep(model, batch, policy=StepPolicy(precision="amp-bf16", optimizer="adamw"),
                               device_type=device, fused=True if cuda else False)
                step = ts.run
            else:
                step = plain(model, opt, batch, keep=v.get("keep", False), mode=v.get("mode"))
            r = measure_loop(step, cuda)
            del step, model, batch
            if v.get("harness"):
                del ts
            else:
                del opt
        except Exception as exc:  # noqa: BLE001
            r = {"error": f"{type(exc).__name__}: {exc}"}
        results["variants"][label] = r
        log(f"clue: {label}: peak {fmt(r.get('peak_allocated'))}, reserved {fmt(r.get('peak_reserved'))}")
    for steps in ((2,) if smoke else (2, 4)):
        label = f"measure_step(device={device!r}, steps={steps}) (the tracer attached)"
        cleanup(cuda)
        try:
            rep = measure_step(hf_gpt2_factory(spec), hf_lm_batch(spec.vocab_size, b, s),
                               StepPolicy(precision="amp-bf16", optimizer="adamw"), device=device, steps=steps)
            r = {"peak_allocated": rep.cuda["steady_peak_allocated"] if rep.cuda else None,
                 "peak_reserved": rep.reserved_bytes, "tracker_peak": rep.storage_peak_bytes,
                 "phase_peaks_allocated": rep.cuda["steady_phase_peaks"] if rep.cuda else None,
                 "by_category": rep.by_category}
            del rep
        except Exception as exc:  # noqa: BLE001
            r = {"error": f"{type(exc).__name__}: {exc}"}
        results["variants"][label] = r
        log(f"clue: {label}: peak {fmt(r.get('peak_allocated'))}, reserved {fmt(r.get('peak_reserved'))}")
    cleanup(cuda)
    return results


# ---------------------------------------------------------------------------------------------
# --fresh: one process per case, as users run them


DROPPED_IN_FRESH = ("step_times_s", "median_step_s")     # timed while other cases' processes shared the GPU


def expected_reserved(predicted: Path | None = None) -> dict[str, int]:
    """Each case's reserved peak in the repository's corpus recording (how much GPU memory its process needs), or
    in ``predicted`` (a ``fake_predictions`` file) for the cases it names."""
    from labkit.core.provenance import load_measurement
    from labkit.memory.trace.corpus_check import plain_path

    try:
        rows = load_measurement(plain_path(), kind="measure_plain")["data"]["cases"]
    except Exception:  # noqa: BLE001 - no recording to plan by: every case gets the default
        rows = []
    if predicted is not None:
        rows = rows + load_measurement(predicted, kind="fake_predictions")["data"]["cases"]
    return {r["name"]: int(r["peak_reserved"]) for r in rows if r.get("peak_reserved")}


def predicted_names(path: Path) -> list[str]:
    """The case names of a ``fake_predictions`` file."""
    from labkit.core.provenance import load_measurement

    return [r["name"] for r in load_measurement(path, kind="fake_predictions")["data"]["cases"]]


def run_fresh(todo: list[Case], args: argparse.Namespace, smoke: bool) -> list[dict[str, Any]]:
    """Every case of ``todo`` by a child ``record_plain.py --case NAME --no-profile`` in a new process, up to
    ``args.fresh`` at a time within ``args.gpu_budget`` GB of expected reserved peaks; rows in ``todo``'s order."""
    import json
    import subprocess

    expect, budget = expected_reserved(args.predicted), args.gpu_budget * 1e9
    pending, running, spans, rows = list(todo), {}, {}, {}
    while pending or running:
        while pending and len(running) < args.fresh:
            case = pending[0]
            need = expect.get(case.name, args.expect_gb * 1e9)
            if running and sum(r[1] for r in running.values()) + need > budget:
                break
            pending.pop(0)
            out = args.out / "fresh" / case.name
            out.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, __file__, "--out", str(out), "--case", case.name, "--no-clue", "--no-profile",
                   "--budget", str(args.case_timeout)] + (["--smoke"] if smoke else []) + (
                       ["--variants"] if args.variants else [])
            with open(out / "child.log", "w") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            running[case.name] = (proc, need, out, time.perf_counter())
        for name, (proc, _, out, t) in list(running.items()):
            waited = time.perf_counter() - t
            if proc.poll() is None and waited < args.case_timeout + 30:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            del running[name]
            spans[name] = (t, time.perf_counter())
            try:
                row = json.loads((out / "plain_cases.json").read_text())["data"]["cases"][0]
            except (OSError, ValueError, IndexError, KeyError):
                tail = (out / "child.log").read_text()[-1500:] if (out / "child.log").exists() else ""
                row = {"name": name, "error": f"the case's process ended with {proc.returncode} and no row",
                       "traceback_tail": tail}
            for key in DROPPED_IN_FRESH:
                row.pop(key, None)
            row["process"] = "fresh"
            rows[name] = row
            log(f"fresh {name}: peak {fmt(row.get('peak_allocated'))}, reserved {fmt(row.get('peak_reserved'))}, "
                f"retries {row.get('num_alloc_retries')}, {time.perf_counter() - t:.1f} s"
                + (f", {row['error']}" if "error" in row else ""))
        time.sleep(0.1)
    for name, (a, b) in spans.items():      # the cases' processes (this one included) that overlapped its run
        rows[name]["concurrent_processes"] = sum(1 for x, y in spans.values() if x < b and a < y)
    return [rows[c.name] for c in todo]


def fmt(n: Any) -> str:
    return "-" if n is None else f"{n / 1e9:.3f} GB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget", type=float, default=320.0, help="seconds; cases past it are skipped (default 320)")
    ap.add_argument("--only", help="run only cases whose name contains one of these (comma-separated)")
    ap.add_argument("--case", action="append", metavar="NAME",
                    help="run only the case of exactly this name (repeat it for several)")
    ap.add_argument("--no-clue", action="store_true", help="skip the clue experiment")
    ap.add_argument("--no-profile", action="store_true", help="no profiled step after each case (see above)")
    ap.add_argument("--fresh", type=int, default=0, metavar="J",
                    help="every case in its own new process, J at a time (memory only; implies --no-clue)")
    ap.add_argument("--gpu-budget", type=float, default=120.0,
                    help="GB of expected reserved peaks that --fresh runs at once (default 120)")
    ap.add_argument("--expect-gb", type=float, default=48.0,
                    help="GB a --fresh case without a recording is expected to reserve (default 48)")
    ap.add_argument("--case-timeout", type=float, default=240.0, help="seconds for one --fresh case (default 240)")
    ap.add_argument("--smoke", action="store_true", help="a few cases at CI size on the CPU (checks the script)")
    ap.add_argument("--variants", action="store_true",
                    help="corpus.TRACED_VARIANTS (T5 and DeBERTa configurations) instead of the corpus's CASES")
    ap.add_argument("--predicted", type=Path, metavar="FILE",
                    help="run the cases this fake_predictions file names (and plan --fresh by their predictions)")
    args = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the budget and the log are this run's: main() may be called again in one process (the tests)
    LOG.clear()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cmd = "python3 benchmarks/gpu/record_plain.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    prov.update(versions())
    log(f"device {device}; torch {torch.__version__}; {prov.get('gpu_name')}; transformers {prov.get('transformers')}")
    if not cuda:
        log("no CUDA GPU (or --smoke): CI-size cases on the CPU, no peaks (a script check, not GPU numbers)")
    if args.smoke:
        global STEPS
        STEPS = 2
        pool = TRACED_VARIANTS if args.variants else CASES
        todo = [tiny(c) for c in pool if c.name in SMOKE_CASES or f"{c.name}@tiny" in (args.case or ())]
    else:
        todo = list(TRACED_VARIANTS if args.variants else CASES)
    if args.predicted:
        names = [f"{n}@tiny" if args.smoke else n for n in predicted_names(args.predicted)]
        todo = [c for c in (TRACED_VARIANTS if args.variants else CASES) if c.name in names
                or f"{c.name}@tiny" in names]
        todo = [tiny(c) for c in todo] if args.smoke else todo
    if args.only:
        todo = [c for c in todo if any(part in c.name for part in args.only.split(","))]
    if args.case:
        known = {c.name for c in todo}
        unknown = [n for n in args.case if n not in known]
        if unknown:
            ap.error(f"--case {unknown[0]!r}: no corpus case of that name")
        todo = [c for c in todo if c.name in args.case]
    method = __doc__.split("\n\n")[1]
    if args.fresh:
        prov["fresh_note"] = (f"each case in its own new process (record_plain.py --case NAME --no-profile), up to "
                              f"{args.fresh} at a time; rows carry concurrent_processes; no step times")
        rows = run_fresh(todo, args, args.smoke)
        write_measurement(args.out / "plain_cases.json", "measure_plain",
                          {"device": device, "smoke": args.smoke, "method": method, "process": "fresh",
                           "cases": rows}, provenance=prov)
        log(f"done: {sum('peak_allocated' in r for r in rows)} of {len(todo)} cases ran")
        (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
        return 0
    clue = None
    if not args.no_clue:
        clue = clue_experiment(device, args.smoke)
        write_measurement(args.out / "clue_gpt2_large.json", "measure_plain_clue", clue, provenance=prov)
    rows: list[dict] = []
    for i, case in enumerate(todo):
        left = args.budget - (time.perf_counter() - T0)
        if left < 8:
            log(f"budget: skipping {case.name}")
            rows.append({"name": case.name, "split": case.split, "case": dataclasses.asdict(case),
                         "skipped": "time budget"})
            continue
        row = run_case(case, device, profile=not args.no_profile)
        rows.append(row)
        if "error" in row:
            log(f"[{i + 1}/{len(todo)}] {case.name}: {row['error']}")
        else:
            log(f"[{i + 1}/{len(todo)}] {case.name} ({case.split}): peak {fmt(row['peak_allocated'])}, reserved "
                f"{fmt(row['peak_reserved'])}, step {row['median_step_s'] * 1e3:.1f} ms, sdpa {row.get('sdpa_backends', '-')}"
                f", {row['wall_s']:.1f} s")
        write_measurement(args.out / "plain_cases.json", "measure_plain",
                          {"device": device, "smoke": args.smoke, "method": method, "cases": rows},
                          provenance=prov)
        (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    log(f"done: {sum('peak_allocated' in r or 'median_step_s' in r for r in rows)} of {len(todo)} cases ran")
    (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
