"""Ground truth for ``labkit measure --script``: users' training scripts, unmodified, on a real GPU.

Each case runs in its own new Python process (``python -c WRAPPER SCRIPT ARGS``, ``script_child.py``): the
wrapper runs the script as ``__main__`` with ``runpy`` and, after it ends, reads
``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` (the whole run's peaks) and the cumulative ``max_memory_allocated()`` after each
``Optimizer.step`` (a global post-hook; it allocates nothing). No labkit code runs in that process.

Rank cases (``--ranks``): a torchrun script run as rank 0 of a world of N on ONE GPU, on PyTorch's fake
process group (``torch.testing._internal.distributed.fake_pg``: collectives do nothing and no peers exist;
the rank's own allocations are real). That is not a real multi-GPU run: it has no NCCL communicator, no
buffers a real collective fills on its own stream. DDP's reducer waits on its allreduce's future, which the
fake group leaves empty, so the wrapper registers a communication hook that returns the bucket itself
(what an allreduce leaves in place, with no allocation).

LoRA cases (``--lora``, issue 27): peft LoRA scripts of ``data/scripts/lora/`` on a TinyLlama-sized bf16 base,
each a user's own loop that differs from the others in one thing (the batch, the loss, the attention, the
way the model is built or loaded); run only with ``--lora``.

Users' cases (``--users``, issue 27): the scripts of ``data/scripts/users/``, written the way engineers write them
(``torch.compile``, fp16 ``GradScaler`` with clipping after ``unscale_``, accumulation with ``set_to_none=False``,
evaluation under ``no_grad`` or ``inference_mode``, SWA, custom ``autograd.Function``s, ``checkpoint_sequential``,
hand-kept fp32 master weights, Lightning, Hugging Face ``Trainer`` and accelerate variants), predicted here before
they were recorded; run only with ``--users``. ``--users2``: the second batch, ``data/scripts/users2/`` (WGAN-GP's
double backward, a spectral-norm GAN, distillation with the deprecated ``torch.cuda.amp`` spellings, SimCLR,
``generate()`` between training steps, ``empty_cache`` and ``reset_peak_memory_stats`` between phases,
``nn.Embedding(sparse=True)`` with ``SparseAdam``, ``weight_norm``, ``torch.func`` per-sample gradients, timm, a GRU
with truncated BPTT from a pinned ``DataLoader``, a checkpointed diffusion U-Net), also predicted before recording.
``--users3``: the third batch, ``data/scripts/users3/`` (the kinds of issue 27 written as scripts, see
``USER_BATCHES``), predicted before any recording (``users3__predicted.json``).

``--segments``: each case's child also records the caching allocator's history
(``torch.cuda.memory._record_memory_history``) and writes ``DIR/memory_trace__NAME.json`` after the script ends: the
events with their sizes and innermost Python frames, the segments live when reserved bytes peaked (a replay of the
segment events) and those at the end (``script_child.write_memory_trace``). Recording the history does not change
what the allocator does.

    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR [--jobs 4] [--only SUBSTR[,SUBSTR...]] [--smoke]
    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR --lora --no-scripts --no-ranks --jobs 3
    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR --users --no-scripts --no-ranks --jobs 4
    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR --users2 --no-scripts --no-ranks --jobs 3
    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR --users3 --no-scripts --no-ranks --jobs 3
    PYTHONPATH=. python3 benchmarks/gpu/record_scripts.py --out DIR --no-ranks --only cnn_dataloader --segments --jobs 1

Writes ``DIR/scripts.json``, ``DIR/ranks.json``, (``--lora``) ``DIR/lora.json``, (``--users``)
``DIR/users.json``, (``--users2``) ``DIR/users2.json`` and (``--users3``) ``DIR/users3.json`` (``kind``
``script_peaks``; one row per case with its
script, arguments, world size, peaks, per-step peaks, wall time and status) with the provenance header (GPU, driver,
torch, CUDA, and the versions of transformers, accelerate, lightning, peft, torchvision and timm).
``--smoke``: two cases, on whatever device there is (no peaks on a CPU), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from script_child import run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "data" / "scripts"

# (name, script relative to data/scripts, arguments)
SCRIPT_CASES = [(p.stem, p.name, []) for p in sorted(SCRIPTS.glob("*.py"))]
# (name, script relative to data/scripts, arguments): peft LoRA on a TinyLlama-sized bf16 base (issue 27)
LORA_CASES = [
    *[(f"lora-{p.stem}", f"lora/{p.name}", []) for p in sorted((SCRIPTS / "lora").glob("*.py"))],
    ("lora-base-s2048", "lora/base.py", ["--seq", "2048"]),
    ("lora-base-b8-s2048", "lora/base.py", ["--batch", "8", "--seq", "2048"]),
    ("lora-pretrained-device-map", "lora/pretrained.py", ["--device-map"]),
    ("lora-trainer-no-bf16-flag", "lora/trainer.py", ["--no-bf16-flag"]),
]
# (name, script relative to data/scripts, arguments) by batch: users' scripts the lab had not seen (issue 27); the
# second batch (users2/): GANs, distillation, contrastive, generate(), sparse embeddings, torch.func; the third
# (users3/): nn.Transformer with masks and an eval pass, MultiheadAttention's weights, packed bidirectional LSTMs and
# CTC, a GRU under a GradScaler, 3-D and transposed convolutions, FCN's auxiliary head, EmbeddingBag, adaptive
# softmax, torch.distributions, FFTs, grid_sample
USER_BATCHES = {b: [(p.stem, f"{b}/{p.name}", []) for p in sorted((SCRIPTS / b).glob("*.py"))]
                for b in ("users", "users2", "users3")}
# (name, script, arguments, world size[, rank])
RANK_CASES = [
    *[(f"fsdp2-llama-w{w}", "ranks/fsdp2_llama.py", [], w) for w in (2, 4, 8)],
    *[(f"fsdp2-llama-mp-w{w}", "ranks/fsdp2_llama.py", ["--mp"], w) for w in (2, 4, 8)],
    *[(f"fsdp2-llama-mp-ckpt-w{w}", "ranks/fsdp2_llama.py", ["--mp", "--ckpt"], w) for w in (2, 8)],
    *[(f"ddp-gpt2-w{w}", "ranks/ddp_gpt2.py", [], w) for w in (2, 8)],
    *[(f"tp-mlp-w{w}", "ranks/tp_mlp.py", [], w) for w in (2, 4, 8)],
    ("tp-llama-s1024-w2", "ranks/tp_llama.py", ["--seq", "1024"], 2), ("tp-llama-w2", "ranks/tp_llama.py", [], 2),
    ("tp-llama-w4", "ranks/tp_llama.py", [], 4), ("ddp-llama-w2", "ranks/ddp_llama.py", [], 2),
    ("fsdp2-llama7b-w8", "ranks/fsdp2_llama7b.py", [], 8),
    # both stages of a 2-rank pipeline (the rank is the fifth field; rank 0 where there is none)
    *[(f"pp-gpipe-w2-r{r}", "ranks/pp_gpipe.py", [], 2, r) for r in (0, 1)],
    *[(f"pp-1f1b-w2-r{r}", "ranks/pp_gpipe.py", ["--1f1b"], 2, r) for r in (0, 1)],
]

WRAPPER = r'''
import os, sys
import torch
import script_child as child
path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(path))
world = int(os.environ.get("RECORD_FAKE_WORLD", "0"))
if world:
    child.fake_process_group(world)
    child.ddp_comm_hook()
    try:  # pipelining's warm-up vote needs the peers' answers: every stage votes as this rank's (labkit's rule)
        from torch.distributed.pipelining.schedules import _PipelineSchedule
        from torch.distributed.pipelining._utils import InferenceMode
        def warmup(self, stages, has_backward, p2p_done):
            assert not any(InferenceMode.needs_dynamic(st._user_meta, has_backward) for st in stages)
            for st in stages:
                st._inference_mode = InferenceMode.STATIC
        if "_warmup_p2p" in _PipelineSchedule.__dict__:
            _PipelineSchedule._warmup_p2p = warmup
    except ImportError:
        pass
steps, extra = [], {}
if torch.cuda.is_available():
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda o, a, k: steps.append(torch.cuda.max_memory_allocated()))
    trace = os.environ.get("RECORD_MEMORY_TRACE")
    if trace:   # --segments: the allocator's history, written after the script ends
        child.record_memory_history()
        extra["memory_trace_file"] = lambda: child.write_memory_trace(trace)
child.run_script(path, step_cumulative_peaks=steps, **extra)
'''


def run_case(name: str, script: str, args: list[str], world: int, rank: int = 0, *, timeout: float,
             trace_dir: str = "") -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if trace_dir:
        env["RECORD_MEMORY_TRACE"] = str(Path(trace_dir).resolve() / f"memory_trace__{name}.json")
    if world:
        # LOCAL_RANK 0 whatever the rank: one GPU records every rank
        env.update(RECORD_FAKE_WORLD=str(world), RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    t0 = time.perf_counter()
    result, err, rc = run_child(WRAPPER, [str(SCRIPTS / script), *args], env=env, cwd=SCRIPTS, timeout=timeout)
    row: dict = {"name": name, "script": script, "args": args, "world_size": world or 1, "rank": rank,
                 "fake_process_group": bool(world), "returncode": rc, **result}
    row["stderr_tail"] = err[-1500:] if row["status"] != "ok" else ""
    row["process_wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {row['status']} peak={row.get('peak_allocated')} "
          f"reserved={row.get('peak_reserved')} ({row['process_wall_s']} s)", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--no-scripts", action="store_true")
    ap.add_argument("--no-ranks", action="store_true")
    ap.add_argument("--lora", action="store_true", help="also the LoRA scripts of data/scripts/lora/")
    for b in USER_BATCHES:
        ap.add_argument(f"--{b}", action="store_true", help=f"also the users' scripts of data/scripts/{b}/")
    ap.add_argument("--segments", action="store_true",
                    help="each case also writes OUT/memory_trace__NAME.json: the allocator's history, the segments "
                         "at the peak of reserved bytes and at the end")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from labkit.core.provenance import header, write_measurement

    prov = header()
    for mod in ("transformers", "accelerate", "lightning", "peft", "torchvision", "timm"):
        try:
            prov[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - recorded as missing
            prov[mod] = f"unavailable ({type(e).__name__})"
    print(json.dumps(prov, indent=1), flush=True)
    groups = []
    if not a.no_scripts:
        groups.append(("scripts", [(n, s, ar, 0) for n, s, ar in SCRIPT_CASES]))
    if not a.no_ranks:
        groups.append(("ranks", RANK_CASES))
    if a.lora:
        groups.append(("lora", [(n, s, ar, 0) for n, s, ar in LORA_CASES]))
    groups += [(b, [(n, s, ar, 0) for n, s, ar in cases]) for b, cases in USER_BATCHES.items() if getattr(a, b)]
    for kind, cases in groups:
        cases = [c for c in cases if any(part in c[0] for part in a.only.split(","))]
        if a.smoke:
            cases = cases[:1]
        rows: list[dict | None] = [None] * len(cases)
        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            futures = {pool.submit(run_case, *c, timeout=a.timeout, trace_dir=a.out if a.segments else ""): i
                       for i, c in enumerate(cases)}
            for fut in as_completed(futures):   # written after each case: a run cut short keeps what it recorded
                rows[futures[fut]] = fut.result()
                write_measurement(Path(a.out) / f"{kind}.json", "script_peaks", [r for r in rows if r],
                                  provenance=prov)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
