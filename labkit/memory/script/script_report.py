"""What a faked run found: :class:`ScriptReport`, as a table and as JSON (``peak_bytes`` and
``reserved_bytes`` are the names :class:`labkit.memory.trace.step.MeasureReport` uses)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from labkit.core.table import render
from labkit.core.units import fmt_bytes
from labkit.memory.script.ranks import nccl_path, outside_allocator
from labkit.memory.trace.fake.fake_cuda import torch_versions
from labkit.memory.trace.storage import categorise


@dataclass
class StepPeak:
    """One optimizer step (``Optimizer.step`` call): its peak allocated bytes, reserved at its end."""

    step: int
    peak_bytes: int
    reserved_bytes: int
    peak_phase: str


@dataclass
class Site:
    """Bytes live at the peak that were allocated from one line of the user's code (``site``), with the
    innermost library line below it (``library``, e.g. a transformers model file)."""

    site: str
    library: str
    bytes: int


@dataclass
class ScriptReport:
    """The whole run on the fake GPU.

    ``peak_bytes``/``reserved_bytes``: the run's ``torch.cuda.max_memory_allocated()`` and
    ``max_memory_reserved()`` as the target GPU would report them after the program ends (the caching
    allocator simulated block by block); ``steps``: each optimizer step's peak (the first one holds the
    optimizer state's creation, later ones are the steady state); ``peak_phase`` / ``peak_step`` /
    ``peak_by_category``: where the whole run's peak was and what was live then (tensor storages by
    category); ``top_sites``: the lines of the user's code whose allocations were live at the peak;
    ``outcome``: ``completed``, ``stopped after N optimizer steps``, ``out of memory`` or ``failed``;
    ``notes``: every assumption the fake GPU made (placeholder values, libraries adapted, kernels chosen).
    """

    what: str
    target: str
    process: str
    outcome: str
    peak_bytes: int
    reserved_bytes: int
    peak_phase: str
    peak_step: int | None
    peak_by_category: dict[str, int]
    steps: list[StepPeak]
    first_step_peak_bytes: int | None
    steady_step_peak_bytes: int | None
    top_sites: list[Site]
    notes: list[str]
    elapsed_s: float
    device_bytes: int
    oom: dict[str, int] | None = None
    sdpa: dict[str, int] = field(default_factory=dict)
    outside_allocator: dict[str, Any] | None = None
    # a torchrun rank where NCCL's code path allocates otherwise than the fake process group (ranks.nccl_path)
    nccl_path: dict[str, Any] | None = None
    output: str = ""                     # the script's own output (its last characters), where it was kept
    source: str = "model: labkit fake GPU (fake tensors, no GPU used), validated against H200 recordings"

    @property
    def fits(self) -> bool:
        return self.oom is None


def _phase_at(tracker: Any, event: int) -> str:
    if not tracker.events:
        return "setup"
    return tracker.phases[tracker.events[min(event, len(tracker.events) - 1)][2]]


def _live_at(tracker: Any, upto: int) -> dict[int, int]:
    live: dict[int, int] = {}
    for sid, delta, _ in tracker.events[:upto + 1]:
        if delta > 0:
            live[sid] = delta
        elif delta < 0:
            live.pop(sid, None)
    return live


def _categories(gpu: Any, upto: int) -> dict[str, int]:
    """Tensor storages live at event ``upto`` by category (``categorise``: born in a forward, a loss or an
    evaluation pass and not a parameter, gradient or optimizer state: activations)."""
    tracker = gpu.tracker
    acts = tuple(i for i, name in enumerate(tracker.phases) if name in ("forward", "loss", "eval"))
    return categorise(tracker, gpu.roles, upto + 1, acts)


def _sites(gpu: Any, live: dict[int, int], top: int = 8) -> list[Site]:
    tracker = gpu.tracker
    by: dict[int, int] = {}
    for sid, n in live.items():
        s = tracker.site_of.get(sid)
        if s is not None:
            by[s] = by.get(s, 0) + n
    out = []
    for s, n in sorted(by.items(), key=lambda kv: -kv[1])[:top]:
        user, lib = tracker.sites.names[s]
        out.append(Site(site=_short(user) or "(no frame of your code)", library=_short(lib), bytes=n))
    return out


def _short(loc: str) -> str:
    if not loc:
        return ""
    path, _, line = loc.rpartition(":")
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1] + ":" + line
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if rel.startswith(".." + os.sep + ".."):
        rel = path
    return f"{rel}:{line}"


def build_report(gpu: Any, *, what: str, outcome: str | None = None) -> ScriptReport:
    live = gpu.live
    tracker = gpu.tracker
    steps = [StepPeak(step=m.step, peak_bytes=m.peak_bytes, reserved_bytes=m.reserved_bytes,
                      peak_phase=_phase_at(tracker, m.peak_event)) for m in live.steps]
    peak_step = None
    for m in live.steps:
        if m.peak_bytes == live.peak and m.peak_event == live.peak_event:
            peak_step = m.step
            break
    at_peak = _live_at(tracker, live.peak_event) if tracker.events else {}
    if outcome is None:
        outcome = ("out of memory" if live.oom is not None else
                   f"stopped after {gpu.stopped_after} optimizer steps" if gpu.stopped_after else "completed")
    elapsed = (gpu.ended or gpu.started) - gpu.started

    notes = list(gpu.notes) + list(gpu.emulator.assumptions)
    torch_note = torch_versions(gpu.target).get("note")
    if torch_note:
        notes.append(torch_note)
    for choice in getattr(gpu, "_hf_choices", None) or []:
        notes.append("transformers' mask checks: " + choice.replace(
            "(the batch's attention_mask is all ones)", "(assumed: the batches are not padded; a padded batch keeps an "
            "explicit mask on the GPU)"))
    return ScriptReport(
        what=what, target=gpu.facts.name, process="fresh" if not gpu.target.warm_process else "warm",
        outcome=outcome, peak_bytes=live.peak, reserved_bytes=live.reserved_peak,
        peak_phase=_phase_at(tracker, live.peak_event), peak_step=peak_step,
        peak_by_category={k: v for k, v in _categories(gpu, live.peak_event).items() if v} if tracker.events else {},
        steps=steps, first_step_peak_bytes=steps[0].peak_bytes if steps else None,
        steady_step_peak_bytes=steps[-1].peak_bytes if len(steps) > 1 else None,
        top_sites=_sites(gpu, at_peak), notes=notes, elapsed_s=round(elapsed, 3),
        device_bytes=gpu.facts.usable_bytes,
        oom=None if live.oom is None else {"requested": live.oom.requested, "allocated": live.oom.allocated,
                                           "reserved": live.oom.reserved, "limit": live.oom.limit},
        sdpa=dict(gpu.emulator.sdpa_choices),
        outside_allocator=_outside(gpu), nccl_path=nccl_path(gpu, live.peak))


def _outside(gpu: Any) -> dict[str, Any] | None:
    n = gpu.communicators
    if n is None:
        return None

    return outside_allocator(n)


def render_text(rep: ScriptReport) -> str:
    lines = [f"{rep.what}: {rep.outcome}, predicted for an {rep.target} (fake GPU, a {rep.process} process; "
             f"{rep.elapsed_s:.1f} s here)"]
    lines.append(f"peak allocated {fmt_bytes(rep.peak_bytes)} ({rep.peak_bytes} bytes) in phase {rep.peak_phase}"
                 + (f" of optimizer step {rep.peak_step}" if rep.peak_step else "")
                 + f"; peak reserved {fmt_bytes(rep.reserved_bytes)} ({rep.reserved_bytes} bytes)")
    if rep.oom:
        lines.append(f"OUT OF MEMORY: a request of {fmt_bytes(rep.oom['requested'])} did not fit "
                     f"({fmt_bytes(rep.oom['reserved'])} reserved of {fmt_bytes(rep.oom['limit'])} usable)")
    if rep.steps:
        lines.append("")
        lines.append(render(["optimizer step", "peak allocated", "phase of the peak", "reserved at its end"],
                            [[s.step, fmt_bytes(s.peak_bytes), s.peak_phase, fmt_bytes(s.reserved_bytes)]
                             for s in rep.steps[:3] + ([] if len(rep.steps) <= 4 else rep.steps[-1:])]))
    if rep.peak_by_category:
        lines.append("")
        lines.append(render(["category (at the peak)", "bytes"],
                            [[k, fmt_bytes(v)] for k, v in rep.peak_by_category.items()]))
    if rep.top_sites:
        lines.append("")
        lines.append(render(["live at the peak, allocated at", "bytes", "in"],
                            [[s.site, fmt_bytes(s.bytes), s.library] for s in rep.top_sites]))
    if rep.notes:
        lines.append("")
        lines.append("assumed or adapted on the fake GPU:")
        lines.extend(f"  - {n}" for n in rep.notes)
    return "\n".join(lines)


def report_from_json(doc: dict[str, Any]) -> ScriptReport:
    """A :class:`ScriptReport` from its JSON form (``labkit measure --script ... --json``)."""
    doc = dict(doc)
    doc["steps"] = [StepPeak(**s) for s in doc.get("steps", [])]
    doc["top_sites"] = [Site(**s) for s in doc.get("top_sites", [])]
    doc.pop("fits", None)
    return ScriptReport(**doc)


def render_ranks(doc: dict[str, Any]) -> str:
    """The table of a launch's traced ranks (``labkit measure --script ... --nproc-per-node N``)."""
    la = doc["launch"]
    lines = [f"{doc['ranks'][0]['what']}: rank(s) of torchrun --nnodes {la['nnodes']} --nproc-per-node "
             f"{la['nproc_per_node']} (world {la['world_size']}), each on a fake process group, predicted for an "
             f"{doc['ranks'][0]['target']}"]
    rows = []
    for r in doc["ranks"]:
        out = r.get("outside_allocator") or {}
        rows.append([r["rank"], r["outcome"], fmt_bytes(r["peak_bytes"]), r["peak_phase"], fmt_bytes(r["reserved_bytes"]),
                     fmt_bytes(out.get("total_bytes", 0)) if out else "-"])
    lines.append(render(["rank", "outcome", "peak allocated", "phase", "peak reserved", "outside the allocator"], rows))
    out = doc["ranks"][0].get("outside_allocator")
    if out:
        lines.append(f"outside the allocator: CUDA context {fmt_bytes(out['cuda_context_bytes'])} + "
                     f"{out['nccl_communicators']} NCCL communicator(s) x {fmt_bytes(out['nccl_bytes'] // max(out['nccl_communicators'], 1))} "
                     f"({out['source']})")
    for r in doc["ranks"]:
        nccl = r.get("nccl_path")
        if nccl:
            lines.append(f"rank {r['rank']} on NCCL's path: {fmt_bytes(nccl['peak_bytes_upper'])} "
                         f"({nccl['peak_bytes_upper']} bytes) beside the fake group's {fmt_bytes(nccl['peak_bytes'])}: "
                         f"{nccl['what']} ({nccl['source']})")
    notes = doc["ranks"][0].get("notes") or []
    if notes:
        lines.append("assumed or adapted on the fake GPU:")
        lines.extend(f"  - {n}" for n in notes)
    return "\n".join(lines)
