"""Notebook 07 (your script): a training script, unmodified, predicted on a fake GPU; its ranks under torchrun;
each prediction beside the H200's recording of the same script."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from labkit.core.paths import DATA_DIR
from labkit.core.units import GiB, fmt_bytes
from labkit.memory.script.run import trace_launch, trace_script
from labkit.viz.trace import predicted_vs_recorded
from labkit.viz.section import Section
from labkit.workloads.corpus import split_of

__all__ = ["Recorded", "recorded", "example", "validation", "ranks", "commands"]

SCRIPTS = DATA_DIR / "scripts"
RECORDINGS = DATA_DIR / "measurements" / "script"
#: scripts small enough for a smoke run (seconds each here), then the larger ones the full profile adds
SMOKE_SCRIPTS = ("nanogpt_sdpa",)
FULL_SCRIPTS = ("nanogpt_sdpa", "lion_custom", "bf16_ema", "lightning_accum", "train_eval", "zero_sharding")


@dataclass(frozen=True)
class Recorded:
    """The H200 recordings of the lab's scripts (``benchmarks/gpu/record_scripts.py``)."""

    scripts: dict[str, dict]
    ranks: dict[str, dict]
    label: str


def recorded() -> Recorded:
    docs = [json.loads((RECORDINGS / f).read_text()) for f in ("scripts.json", "ranks__fake_pg.json")]
    p = docs[0]["provenance"]
    label = (f"recorded on {p['gpu_name']}, {p['date'][:10]} (torch {p['torch']}, transformers "
             f"{p.get('transformers')}; each script unmodified in its own process)")
    return Recorded({r["name"]: r for r in docs[0]["data"]}, {r["name"]: r for r in docs[1]["data"]}, label)


def split(name: str) -> str:
    """Held out or reference, by the corpus's rule (:func:`labkit.workloads.corpus.split_of`)."""
    return split_of(name)


def _predict(rec: dict, world: int = 0) -> Any:
    return _predicted(rec["script"], tuple(rec["args"]), world)


@functools.cache
def _predicted(script: str, args: tuple[str, ...], world: int) -> Any:
    """One prediction per script, arguments and world size in a session (the example and the validation table
    show the same run of the example script)."""
    if world:
        return _predict_rank({"script": script, "args": list(args)}, world)
    return trace_script(str(SCRIPTS / script), list(args))


def _predict_rank(rec: dict, world: int) -> dict:
    return trace_launch(str(SCRIPTS / rec["script"]), rec["args"], nproc_per_node=world)["ranks"][0]


def _err(pred: int, truth: int) -> float:
    return round(100 * (pred / truth - 1), 2)


def example(rec: Recorded, name: str = "nanogpt_sdpa") -> Section:
    """One bundled script predicted here, beside the H200's run of the same file."""
    r = rec.scripts[name]
    rep = _predict(r)
    sec = Section(f"One script, unmodified: data/scripts/{r['script']}", source="model: labkit fake GPU, run here now")
    sec.claim("Predicted peak allocated (torch.cuda.max_memory_allocated at the end)", round(rep.peak_bytes / GiB, 3),
              "GiB", name="script_example_peak", digits=2)
    sec.claim("Recorded on the H200", round(r["peak_allocated"] / GiB, 3), "GiB", source=rec.label, digits=2)
    sec.claim("Prediction error, peak", _err(rep.peak_bytes, r["peak_allocated"]), "%", digits=2,
              name="script_example_peak_error", tolerance=3.0)
    sec.claim("Prediction error, peak reserved", _err(rep.reserved_bytes, r["peak_reserved"]), "%", digits=2,
              name="script_example_reserved_error", tolerance=10.0)
    sec.claim("Seconds to predict it here, without a GPU", round(rep.elapsed_s, 1), "s", name="script_example_seconds",
              direction="lower", source="measured here")
    sec.table(["live at the peak, allocated at (your code)", "bytes", "inside"],
              [[s.site, fmt_bytes(s.bytes), s.library or "-"] for s in rep.top_sites[:6]],
              caption=f"Peak in phase {rep.peak_phase} of optimizer step {rep.peak_step}; categories: "
                      + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rep.peak_by_category.items()))
    for n in rep.notes:
        sec.note("Assumed: " + n)
    return sec


def validation(rec: Recorded, smoke: bool) -> Section:
    """Several recorded scripts predicted here, reference and held-out apart (the full set:
    ``benchmarks/bench_script.py --validate``)."""
    names = SMOKE_SCRIPTS if smoke else FULL_SCRIPTS
    rows, worst, points = [], 0.0, []
    for name in names:
        r = rec.scripts[name]
        rep = _predict(r)
        points.append((name, r["peak_allocated"], rep.peak_bytes))
        pe, re_ = _err(rep.peak_bytes, r["peak_allocated"]), _err(rep.reserved_bytes, r["peak_reserved"])
        worst = max(worst, abs(pe))
        rows.append([name, split(name), fmt_bytes(r["peak_allocated"]), fmt_bytes(rep.peak_bytes), f"{pe:+.2f}%",
                     f"{re_:+.2f}%", f"{rep.elapsed_s:.0f} s"])
    sec = Section("Scripts recorded on the H200, predicted here", source=rec.label)
    sec.claim(f"Scripts predicted now ({'smoke' if smoke else 'full'} profile; all of them: bench_script.py)",
              len(rows), "scripts")
    sec.claim("Worst peak error among them", round(worst, 2), "%", digits=2, name="script_worst_peak_error",
              tolerance=3.0, direction="lower", source="model vs recording, computed here now")

    sec.figure(predicted_vs_recorded(points, title="Peak of each script: predicted here vs recorded on the H200",
                                     source="model (run here now) vs " + rec.label))
    return sec.table(["script", "split", "recorded peak", "predicted", "peak error", "reserved error", "time here"],
                     rows, caption=rec.label)


def ranks(rec: Recorded, smoke: bool) -> Section:
    """Rank 0 of torchrun launches (DTensor TP, DDP, FSDP2) predicted here, beside rank 0 recorded on the H200
    with a fake process group (its own allocations are real; no peers exist)."""
    cases = ("tp-mlp-w2",) if smoke else ("tp-mlp-w2", "tp-mlp-w8", "ddp-gpt2-w2", "fsdp2-llama-mp-ckpt-w8")
    rows, worst = [], 0.0
    for name in cases:
        r = rec.ranks[name]
        rep = _predict(r, world=r["world_size"])
        worst = max(worst, abs(_err(rep["peak_bytes"], r["peak_allocated"])))
        rows.append([name, r["world_size"], fmt_bytes(r["peak_allocated"]), fmt_bytes(rep["peak_bytes"]),
                     f"{_err(rep['peak_bytes'], r['peak_allocated']):+.2f}%",
                     fmt_bytes((rep.get("outside_allocator") or {}).get("total_bytes", 0))])
    sec = Section("Every rank of a launch: rank 0 traced on a fake process group",
                  source="rank 0 of a world-N launch on ONE H200 with PyTorch's fake process group (not a real "
                         "multi-GPU run: no NCCL buffers), " + rec.label)
    sec.claim("Launches compared", len(rows), "launches")
    sec.claim("Worst rank-0 peak error among them", round(worst, 2), "%", digits=2, name="script_rank0_worst_peak_error",
              tolerance=3.0, direction="lower", source="model vs recording, computed here now")
    sec.table(["launch", "world", "recorded rank 0", "predicted rank 0", "error", "outside the allocator (model)"],
              rows, caption="The last column is a model (CUDA context measured on the H200, NCCL buffers assumed): "
                            "a real multi-GPU run holds it beside the allocator's bytes")
    return sec


def commands() -> Section:
    """The commands to run on your own script (each one is executed by the tests)."""
    sec = Section("Your own script", source="the commands")
    return sec.table(["what", "command"], [
        ["predict a script, no GPU needed", "labkit measure --script data/scripts/lion_custom.py --steps 2"],
        ["the same as JSON", "labkit measure --script data/scripts/lion_custom.py --steps 2 --json"],
        ["ranks 0 and 1 of a 2-GPU torchrun launch",
         "labkit measure --script data/scripts/ranks/tp_mlp.py --nproc-per-node 2 --ranks 0,1"],
        ["the real run on a GPU, with a snapshot at an OOM", "labkit watch -- python data/scripts/lion_custom.py"],
    ])
