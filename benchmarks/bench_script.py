"""``labkit measure --script`` against users' scripts recorded on the H200, and its speed and memory.

    PYTHONPATH=. python benchmarks/bench_script.py --validate [--only NAME] [--jobs 2]
    PYTHONPATH=. python benchmarks/bench_script.py --ranks [--only NAME]
    PYTHONPATH=. python benchmarks/bench_script.py --lora [--only NAME]
    PYTHONPATH=. python benchmarks/bench_script.py --users [--only NAME]
    PYTHONPATH=. python benchmarks/bench_script.py --users --predict-to data/measurements/script/users__predicted.json
    PYTHONPATH=. python benchmarks/bench_script.py --users2 --predict-to data/measurements/script/users2__predicted.json
    PYTHONPATH=. python benchmarks/bench_script.py --users3 --predict-to data/measurements/script/users3__predicted.json
    PYTHONPATH=. python benchmarks/bench_script.py --script data/scripts/llama7b_bf16.py
    PYTHONPATH=. python benchmarks/bench_script.py --script data/scripts/ranks/fsdp2_llama7b.py --nproc-per-node 8

``--validate``: every script of ``data/measurements/script/scripts.json`` (recorded by
``benchmarks/gpu/record_scripts.py``: each script unmodified, in its own process, whole-run peaks read after it
ends) predicted from ``labkit measure --script PATH --json``, each in its own new process as a user runs it;
reference and held-out scripts apart (a third held out by a hash of the name: ``labkit.workloads.corpus``'s
rule); targets: peak within 3%, reserved within 10%, each in under 2 minutes. ``--ranks``: the rank cases of
``ranks__fake_pg.json`` (a rank, 0 unless the case names another, of a world-N launch on a fake process group, on
the H200 and here). ``--lora``: the peft LoRA scripts of ``lora.json`` (``data/scripts/lora/``: a TinyLlama-sized
bf16 base, each script differing from the issue-27 loop in one thing; recorded by ``record_scripts.py --lora``).
``--users``: the scripts of ``users.json`` (``data/scripts/users/``: engineers' own habits, predicted before they
were recorded by ``record_scripts.py --users``); with ``--predict-to FILE`` it predicts every script of that folder
and writes the predictions (no recording needed: what was committed before the H200 ran them). ``--users2``,
``--users3``: the same for the second and third batches, ``data/scripts/users2/`` (``users2.json``) and
``data/scripts/users3/`` (``users3.json``).
``--script``: one script's wall time and the process's maximum resident memory (``resource.getrusage``), against
the 2-minute target; with ``--nproc-per-node N`` as rank 0 of a world-N launch (issue 26: an 8-rank FSDP2 launch
of a 7B model, ``data/scripts/ranks/fsdp2_llama7b.py``, predicted in under 2 minutes on a 2-core machine).
Every run prints the reproducibility header first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.core.provenance import header  # noqa: E402

SCRIPTS = ROOT / "data" / "scripts"
# the batches of users' scripts: each a folder of data/scripts/, its flag and its recording (FOLDER.json)
USER_BATCHES = ("users", "users2", "users3")
PEAK_TARGET, RESERVED_TARGET, SECONDS_TARGET = 3.0, 10.0, 120.0


def split(name: str) -> str:
    """Held out or reference, by the corpus's rule (:func:`labkit.workloads.corpus.split_of`)."""
    from labkit.workloads.corpus import split_of

    return split_of(name)


def predict(script: Path, args: list[str], extra: list[str] = ()) -> tuple[dict | None, float, int, str]:
    """The script's ScriptReport (JSON), wall seconds, the child's max RSS in bytes, and the error line."""
    cmd = [sys.executable, "-m", "labkit", "measure", "--script", str(script), *extra, "--json", "--", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(script.parent),
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if proc.returncode != 0:
        return None, wall, rss, (err.strip().splitlines() or ["?"])[-1]
    return json.loads(out), wall, rss, ""


def validate(rows: list[dict], jobs: int, ranks: bool) -> int:
    def one(r: dict) -> dict:
        extra = ["--nproc-per-node", str(r["world_size"]), "--ranks", str(r.get("rank", 0))] if ranks else []
        rep, wall, rss, err = predict(SCRIPTS / r["script"], r["args"], extra)
        if rep is not None and ranks:
            rep = rep["ranks"][0]
        return {"row": r, "rep": rep, "wall": wall, "err": err}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, rows))
    print(f"{'case':28s} {'split':9s} {'recorded peak':>14s} {'predicted':>14s} {'error':>8s} "
          f"{'reserved err':>12s} {'seconds':>8s}")
    errs: dict[str, list[tuple[float, float]]] = {"reference": [], "held-out": []}
    within = {"reference": [0, 0], "held-out": [0, 0]}
    for res in results:
        r, rep = res["row"], res["rep"]
        sp = split(r["name"])
        within[sp][1] += 1
        if rep is None or r.get("status") != "ok":
            why = res["err"] if rep is None else f"recording: {r.get('status')}"
            print(f"{r['name']:28s} {sp:9s} {'-':>14s} {'-':>14s}  not compared: {why[:120]}")
            continue
        pe = 100 * (rep["peak_bytes"] / r["peak_allocated"] - 1)
        re_ = 100 * (rep["reserved_bytes"] / r["peak_reserved"] - 1)
        errs[sp].append((pe, re_))
        ok = abs(pe) <= PEAK_TARGET and abs(re_) <= RESERVED_TARGET and res["wall"] <= SECONDS_TARGET
        within[sp][0] += ok
        print(f"{r['name']:28s} {sp:9s} {r['peak_allocated']:>14,d} {rep['peak_bytes']:>14,d} {pe:>+7.2f}% "
              f"{re_:>+11.2f}% {res['wall']:>8.1f}{'' if ok else '  MISS'}")
    for sp in ("reference", "held-out"):
        e = errs[sp]
        if e:
            print(f"{sp}: {within[sp][0]} of {within[sp][1]} within targets (peak {PEAK_TARGET}%, reserved "
                  f"{RESERVED_TARGET}%, {SECONDS_TARGET:.0f} s); median |peak error| "
                  f"{statistics.median(abs(p) for p, _ in e):.2f}%, median |reserved error| "
                  f"{statistics.median(abs(q) for _, q in e):.2f}%")
    return 0


def predict_users(out: Path, only: str, jobs: int, folder: str = "users") -> int:
    """Predict each script of data/scripts/FOLDER/ in its own process; write the predictions (kind
    ``script_predictions``) with this machine's provenance, to commit before the scripts are recorded."""
    from labkit.core.provenance import write_measurement

    scripts = [p for p in sorted((SCRIPTS / folder).glob("*.py")) if only in p.stem]

    def one(p: Path) -> dict:
        rep, wall, _, err = predict(p, [])
        row = {"name": p.stem, "script": f"{folder}/{p.name}", "args": [], "split": split(p.stem),
               "predict_wall_s": round(wall, 1)}
        if rep is None:
            return {**row, "status": f"refused: {err}"}
        return {**row, "status": "ok", "peak_bytes": rep["peak_bytes"], "reserved_bytes": rep["reserved_bytes"],
                "outcome": rep["outcome"], "step_peaks": [s["peak_bytes"] for s in rep["steps"]],
                "notes": rep["notes"]}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(one, scripts))
    for r in rows:
        print(f"{r['name']:24s} {r['split']:9s} {r['status'][:80]:12s} peak {r.get('peak_bytes', 0):>14,d} "
              f"reserved {r.get('reserved_bytes', 0):>14,d} ({r['predict_wall_s']} s)")
    write_measurement(out, "script_predictions", rows, command=" ".join(sys.argv))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--validate", action="store_true")
    g.add_argument("--ranks", action="store_true")
    g.add_argument("--lora", action="store_true")
    for batch in USER_BATCHES:
        g.add_argument(f"--{batch}", action="store_true")
    g.add_argument("--script")
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--nproc-per-node", type=int, help="--script: as rank 0 of a launch of this many ranks")
    ap.add_argument("--predict-to", help="with a batch of users' scripts (--users, --users2, --users3): predict "
                                         "each script of its folder and write the predictions here")
    a = ap.parse_args()
    print(json.dumps(header(), indent=1))
    if a.script:
        extra = ["--nproc-per-node", str(a.nproc_per_node)] if a.nproc_per_node else []
        rep, wall, rss, err = predict(Path(a.script).resolve(), [], extra)
        if rep is None:
            print(f"failed: {err}")
            return 1
        what = a.script
        if extra:
            rep, what = rep["ranks"][0], f"{a.script}, rank 0 of {a.nproc_per_node}"
        ok = wall <= SECONDS_TARGET
        print(f"{what}: predicted peak {rep['peak_bytes']:,d} B, reserved {rep['reserved_bytes']:,d} B; "
              f"{wall:.1f} s wall (target < {SECONDS_TARGET:.0f} s: {'OK' if ok else 'MISSED'}), at most "
              f"{rss / 1e9:.2f} GB resident (the labkit process); {os.cpu_count()} CPUs here")
        return 0 if ok else 1
    batch = next((b for b in USER_BATCHES if getattr(a, b)), None)
    if a.predict_to:
        if batch is None:
            ap.error("--predict-to goes with " + ", ".join(f"--{b}" for b in USER_BATCHES))
        return predict_users(Path(a.predict_to), a.only, a.jobs, batch)
    name = ("ranks__fake_pg.json" if a.ranks else "lora.json" if a.lora else f"{batch}.json" if batch
            else "scripts.json")
    doc = json.loads((ROOT / "data" / "measurements" / "script" / name).read_text())
    prov = doc["provenance"]
    print(f"recorded on {prov['gpu_name']}, {prov['date'][:10]} (torch {prov['torch']}, transformers "
          f"{prov.get('transformers')}); predicted here by the installed versions")
    rows = [r for r in doc["data"] if a.only in r["name"]]
    return validate(rows, a.jobs, a.ranks)


if __name__ == "__main__":
    raise SystemExit(main())
