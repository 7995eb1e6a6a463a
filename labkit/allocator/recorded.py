"""The allocator chapter's recorded GPU results (``benchmarks/gpu/record_allocator.py``).

Files: ``data/measurements/allocator/fid__<workload>__<config>.json`` (memory_stats of one fresh
process per configuration), ``oom__<case>.json`` (+ ``.txt`` message, ``.pickle.gz`` snapshot),
``exp__*.json``; traces ``data/traces/trace__<workload>__<config>.pickle.gz``.

:func:`fidelity` replays each workload's default-configuration trace under every recorded
configuration and puts the simulator next to the real allocator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.allocator.sim.replay import load_trace, replay
from labkit.core.errors import LabkitError
from labkit.core.paths import MEASUREMENTS_DIR, TRACES_DIR
from labkit.core.provenance import describe, load_measurement


MEAS_DIR = MEASUREMENTS_DIR / "allocator"
COMPARED = ("reserved_bytes.all.peak", "segment.all.peak", "num_device_alloc")
EXTRA = ("num_alloc_retries", "num_device_free", "num_ooms", "inactive_split_bytes.all.peak")


@dataclass
class RecordedRun:
    workload: str
    config: str
    alloc_conf: str
    stats: dict[str, Any]
    steps: list[dict]
    device_total_bytes: int
    device_name: str
    provenance: dict[str, Any]
    path: Path
    request_signature: dict | None = None
    trace_file: str | None = None
    cap_bytes: int | None = None
    oom_message: str | None = None

    @property
    def source(self) -> str:
        return describe(self.provenance)


@dataclass
class FidelityRow:
    workload: str
    config: str
    alloc_conf: str
    real: dict[str, int]
    simulated: dict[str, int]
    rel_error: dict[str, float]
    same_requests: bool | None
    source: str
    extra: dict[str, int] = field(default_factory=dict)
    cap_bytes: int | None = None

    @property
    def max_rel_error(self) -> float:
        return max(self.rel_error.values()) if self.rel_error else 0.0


def _dir(d: str | Path | None, default: Path) -> Path:
    return Path(d) if d is not None else default


def recorded_runs(meas_dir: str | Path | None = None) -> list[RecordedRun]:
    out = []
    for p in sorted(_dir(meas_dir, MEAS_DIR).glob("fid__*.json")):
        doc = load_measurement(p, "allocator.fidelity_run")
        d = doc["data"]
        out.append(RecordedRun(d["workload"], d["config"], d.get("alloc_conf", ""), d["stats"], d.get("steps", []),
                               int(d.get("device_total_bytes", 0)), d.get("device_name", ""), doc["provenance"], p,
                               d.get("request_signature"), d.get("trace_file"), d.get("cap_bytes"),
                               d.get("oom_message")))
    return out


def trace_path(workload: str, config: str = "default", traces_dir: str | Path | None = None,
               meas_dir: str | Path | None = None) -> Path:
    name = f"trace__{workload}__{config}.pickle.gz"
    for d in (_dir(traces_dir, TRACES_DIR), _dir(meas_dir, MEAS_DIR)):
        if (d / name).exists():
            return d / name
    raise LabkitError(f"no recorded trace {name} in {_dir(traces_dir, TRACES_DIR)} (run benchmarks/gpu/record_allocator.py)")


def oom_case(case: str, meas_dir: str | Path | None = None) -> dict[str, Any]:
    doc = load_measurement(_dir(meas_dir, MEAS_DIR) / f"oom__{case}.json")
    return doc


def oom_snapshot_path(case: str, meas_dir: str | Path | None = None) -> Path | None:
    p = _dir(meas_dir, MEAS_DIR) / f"oom__{case}.pickle.gz"
    if p.exists():
        return p
    p2 = TRACES_DIR / f"oom__{case}.pickle.gz"
    return p2 if p2.exists() else None


def experiment(name: str, meas_dir: str | Path | None = None) -> dict[str, Any]:
    return load_measurement(_dir(meas_dir, MEAS_DIR) / f"exp__{name}.json")


def have_recordings(meas_dir: str | Path | None = None) -> bool:
    return any(_dir(meas_dir, MEAS_DIR).glob("fid__*.json"))


def fidelity(meas_dir: str | Path | None = None, traces_dir: str | Path | None = None) -> list[FidelityRow]:
    """For each workload: replay its default trace under each recorded configuration; compare to the real stats."""
    runs = recorded_runs(meas_dir)
    by_wl: dict[str, list[RecordedRun]] = {}
    for r in runs:
        by_wl.setdefault(r.workload, []).append(r)
    rows: list[FidelityRow] = []
    for wl, rs in sorted(by_wl.items()):
        base = next((r for r in rs if r.config == "default"), None)
        if base is None:
            continue
        try:
            tr = load_trace(trace_path(wl, "default", traces_dir, meas_dir))
        except LabkitError:
            continue
        sig = (base.request_signature or {}).get("sha256")
        for r in rs:
            res = replay(tr, r.alloc_conf, cap_bytes=r.cap_bytes,
                         device_total_bytes=r.device_total_bytes or base.device_total_bytes)
            real = {k: int(r.stats.get(k, 0)) for k in COMPARED}
            sim = {"reserved_bytes.all.peak": res.reserved_peak_bytes, "segment.all.peak": res.segments_peak,
                   "num_device_alloc": res.num_device_alloc}
            err = {k: (abs(sim[k] - real[k]) / real[k] if real[k] else float(sim[k] != 0)) for k in COMPARED}
            other = (r.request_signature or {}).get("sha256")
            rows.append(FidelityRow(wl, r.config, r.alloc_conf, real, sim, err,
                                    (other == sig) if (sig and other) else None, r.source,
                                    {"allocated_peak_real": int(r.stats.get("allocated_bytes.all.peak", 0)),
                                     "allocated_peak_sim": res.allocated_peak_bytes,
                                     **{f"{k}_real": int(r.stats.get(k, 0)) for k in EXTRA},
                                     **{f"{k}_sim": int(res.stats.get(k, 0)) for k in EXTRA}}, cap_bytes=r.cap_bytes))
    return rows


def watch_capture(case: str,
                  meas_dir: str | Path | None = None) -> tuple[dict[str, Any], Path | None] | None:
    """The capture ``labkit.allocator.watch`` wrote for ``case`` on the GPU (``watch__<case>.json``, the document
    with its provenance) and its snapshot (or None), or None where it is not recorded."""
    meas_dir = _dir(meas_dir, MEAS_DIR)
    p = meas_dir / f"watch__{case}.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "allocator.watch_capture")
    if not doc["data"].get("capture"):
        return None
    snap = meas_dir / f"watch__{case}.pickle.gz"
    return doc, (snap if snap.exists() else None)


def overhead_summary(meas_dir: str | Path | None = None) -> dict | None:
    """Watch's recorded step-time change per setting, with the noise it has to be read against (percent)."""
    meas = _dir(meas_dir, MEAS_DIR)
    p = meas / "watch__overhead.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "allocator.watch_overhead")
    summ = doc["data"]["summary"]
    base = summ.get("none") or {}
    out = {"source": describe(doc["provenance"]), "workload": doc["data"]["workload"], "modes": {}}
    if "q1_s" in base:  # interleaved blocks: the baseline's own quartiles are the noise
        noise = 100 * (base["q3_s"] - base["q1_s"]) / base["median_step_s"]
    else:  # one process per run: the baseline runs' medians disagree by this much
        runs = base.get("per_run_median_s") or [base.get("median_step_s", 1)]
        noise = 100 * (max(runs) - min(runs)) / base["median_step_s"]
    out["noise_pct"] = noise
    for mode, v in summ.items():
        if mode == "none":
            continue
        change = v.get("median_paired_change_pct", v.get("overhead_pct"))
        if change is not None:
            out["modes"][mode] = {"change_pct": change, "median_step_ms": 1000 * v["median_step_s"]}
    out["baseline_step_ms"] = 1000 * base.get("median_step_s", 0)
    return out
