"""Speed of the allocator replay: trace events per second (target: >= 500,000 on the 2-core CPU machine).

    PYTHONPATH=. python benchmarks/bench_allocator.py [--trace FILE] [--repeat 7] [--baseline REV] [--json]

The trace is a recorded H200 snapshot from data/traces/ when present (else a modelled recording of a
training-shaped stream). "events" are the snapshot's trace entries (alloc, free_requested,
free_completed, segment_*), the unit the target is stated in; reading and compiling the file is timed
separately. Medians over --repeat runs.

``--baseline REV`` also times the simulator as it was at git revision REV (its
``labkit/allocator/sim/simulator.py`` loaded from ``git show`` into a temporary module for this run only),
interleaved run by run with the current one, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.allocator import compile_trace, parse_alloc_conf, read_snapshot, replay  # noqa: E402
from labkit.allocator.sim import simulator as current_simulator  # noqa: E402
from labkit.allocator.sim.synthetic import to_snapshot, training_like  # noqa: E402
from labkit.core.paths import TRACES_DIR  # noqa: E402
from labkit.core.provenance import format_header, header  # noqa: E402

CONFS = ("", "roundup_power2_divisions:4", "max_split_size_mb:128", "expandable_segments:True")
TARGET = 500_000


def load_baseline(rev: str):
    """The simulator module of git revision ``rev``, imported from a temporary file (never written to the tree)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:labkit/allocator/sim/simulator.py"],
                         capture_output=True, text=True, check=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="bench_alloc_")) / "baseline_simulator.py"
    tmp.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_simulator", tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_simulator"] = mod
    spec.loader.exec_module(mod)
    return mod


def timed_run(module, tr, conf: str) -> tuple[float, dict]:
    """CPU seconds of ``module.run_ops`` over the trace (the work ``replay`` times; CPU time, because other work on
    the machine stretches wall-clock time unevenly), and the statistics it gave."""
    cfg = parse_alloc_conf(conf)
    # the recorded addresses are used when replaying under the recording's own configuration, as replay() does
    oracle = tr.recorded_conf is not None and replace(parse_alloc_conf(tr.recorded_conf), text="") == replace(cfg, text="")
    sim = module.CachingAllocatorSim(cfg, address_oracle=tr.segment_oracle if oracle else None,
                                     map_oracle=tr.map_oracle if oracle else None)
    t0 = time.process_time()
    module.run_ops(sim, tr.ops, tr.n_ids)
    return time.process_time() - t0, sim.memory_stats()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="snapshot file (default: the largest recorded trace in data/traces/)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--baseline", metavar="REV", help="also time the simulator of this git revision, interleaved")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    print(format_header(header()), flush=True)
    try:
        print(f"# load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (other work slows the wall-clock rate)")
    except OSError:
        pass
    path = Path(args.trace) if args.trace else None
    if path is None:
        found = sorted(TRACES_DIR.glob("trace__*__default.pickle.gz"), key=lambda p: p.stat().st_size)
        path = found[-1] if found else None
    t0 = time.perf_counter()
    if path is not None:
        snap = read_snapshot(path)
        source = f"recorded trace {path.name}"
    else:
        snap = read_snapshot(to_snapshot(training_like(steps=60), ""))
        source = "model: synthetic training-shaped stream recorded by the simulator"
    t1 = time.perf_counter()
    tr = compile_trace(snap)
    t2 = time.perf_counter()
    print(f"# trace: {source}: {tr.events} events, {tr.n_ids} requests; read {t1 - t0:.3f} s, "
          f"compile {t2 - t1:.3f} s ({tr.events / (t2 - t1):,.0f} events/s)")
    rows = []
    for conf in CONFS:
        runs = [replay(tr, conf) for _ in range(args.repeat)]
        rates = [r.events_per_s for r in runs]
        cpu_rates = [r.events_per_cpu_s for r in runs]
        med = statistics.median(rates)
        cmed = statistics.median(cpu_rates)
        rows.append({"config": conf or "default", "median_events_per_s": med, "min": min(rates), "max": max(rates),
                     "median_events_per_cpu_s": cmed, "best_events_per_cpu_s": max(cpu_rates),
                     "meets_target": med >= TARGET})
        print(f"{conf or 'default':32s} median {med:10,.0f} events/s wall (min {min(rates):,.0f}, max {max(rates):,.0f});"
              f" per CPU-second median {cmed:,.0f}, best {max(cpu_rates):,.0f}  "
              f"{'OK' if med >= TARGET else 'below target'}", flush=True)
    doc = {"trace": source, "events": tr.events, "target": TARGET, "results": rows}
    if args.baseline:
        base = load_baseline(args.baseline)
        print(f"# current simulator vs the one at {args.baseline}: events per CPU-second of run_ops, interleaved, "
              f"median of {args.repeat}")
        doc["baseline"] = {"rev": args.baseline, "results": []}
        for conf in CONFS:
            cur, old = [], []
            same = True
            for _ in range(args.repeat):
                s_new, st_new = timed_run(current_simulator, tr, conf)
                s_old, st_old = timed_run(base, tr, conf)
                cur.append(tr.events / s_new)
                old.append(tr.events / s_old)
                same = same and st_new == st_old
            mc, mo = statistics.median(cur), statistics.median(old)
            doc["baseline"]["results"].append({"config": conf or "default", "current_events_per_cpu_s": mc,
                                               "baseline_events_per_cpu_s": mo, "same_memory_stats": same})
            print(f"{conf or 'default':32s} current {mc:10,.0f}  baseline {mo:10,.0f}  ratio {mc / mo:4.2f}  "
                  f"memory_stats {'identical' if same else 'DIFFER'}", flush=True)
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
