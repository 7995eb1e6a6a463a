"""Fake-mode predictions of corpus cases before they are recorded: each case as ``record_plain.py --fresh`` runs it
(a new process on the H200: no allocator state, no cuBLAS workspace before the model), the program the recording's
``transformers`` runs (``corpus_check.predict_as_recorded``), written as one ``fake_predictions`` file.

    PYTHONPATH=. .venv/bin/python benchmarks/predict_cases.py --out PREDICTIONS.json \\
        --recorded-transformers 5.17.0 (--new-kinds | --batch6 | --batch7 | --batch8 | --case NAME ...) [--note TEXT]

``--new-kinds``: the cases of ``corpus._new_kinds()`` (issue 27's fifth batch); ``--batch6``: ``corpus._batch6()``
(its sixth: timm among them); ``--batch7``: ``corpus._batch7()`` (learned attention biases); ``--batch8``:
``corpus._batch8()`` (speech encoders with LayerDrop off). A case fake mode refuses gets a row
with its ``refused`` line instead of figures. The file is rewritten after every case.

    PYTHONPATH=. .venv/bin/python benchmarks/predict_cases.py --compare PREDICTIONS.json RECORDING.json

``--compare``: the committed predictions beside a recording (``record_plain.py`` rows): each case's peak and
reserved error, reference and held-out cases apart, against the corpus' targets (peak 3%, reserved 5%).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from pathlib import Path

from labkit.core.provenance import header, write_measurement


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("PREDICTIONS", "RECORDING"))
    ap.add_argument("--recorded-transformers", default="5.17.0",
                    help="the transformers version of the recording to come (default 5.17.0: the H200's)")
    ap.add_argument("--new-kinds", action="store_true", help="the cases of corpus._new_kinds()")
    ap.add_argument("--batch6", action="store_true", help="the cases of corpus._batch6()")
    ap.add_argument("--batch7", action="store_true", help="the cases of corpus._batch7()")
    ap.add_argument("--batch8", action="store_true", help="the cases of corpus._batch8()")
    ap.add_argument("--case", action="append", default=[], metavar="NAME")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("--out is required (or --compare)")
    from labkit.memory.trace.corpus_check import predict_as_recorded
    from labkit.memory.trace.fake.fake_cuda import CudaTarget
    from labkit.memory.trace.step import FakeCuda, FakeModeUnsupported
    from labkit.workloads import corpus

    cases = ((corpus._new_kinds() if args.new_kinds else []) + (corpus._batch6() if args.batch6 else [])
             + (corpus._batch7() if args.batch7 else [])
             + (corpus._batch8() if args.batch8 else [])
             + [corpus.get_case(n) for n in args.case])
    if not cases:
        ap.error("no cases: give --new-kinds, --batch6, --batch7, --batch8 or --case NAME")
    prov = header("python benchmarks/predict_cases.py " + shlex.join(argv if argv is not None else sys.argv[1:]))
    if args.note:
        prov["note"] = args.note
    rows = []
    for case in cases:
        t = time.perf_counter()
        row = {"name": case.name, "split": case.split}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rep, notes = predict_as_recorded(case, args.recorded_transformers, None,
                                                 fake=FakeCuda(allocator_state=[], target=CudaTarget(warm_process=False)))
            row.update(peak_allocated=int(rep.peak_bytes), peak_reserved=int(rep.reserved_bytes))
            if notes:
                row["as_recorded"] = notes
        except FakeModeUnsupported as exc:
            row["refused"] = str(exc)
        row["seconds"] = round(time.perf_counter() - t, 1)
        rows.append(row)
        print(f"{case.name}: {row.get('peak_allocated')} {row.get('peak_reserved')} {row.get('refused', '')[:200]} "
              f"({row['seconds']} s)", flush=True)
        write_measurement(args.out, "fake_predictions", {"device": "fake-cuda", "process": "fresh", "cases": rows},
                          provenance=prov)
    return 0


def compare(predictions: Path, recording: Path) -> int:
    """Print the predictions' errors against the recording; exit status 1 when a recorded case misses a target."""
    from labkit.core.provenance import load_measurement
    from labkit.memory.trace.corpus_check import PEAK_TOLERANCE_PCT, RESERVED_TOLERANCE_PCT

    pred = {r["name"]: r for r in load_measurement(predictions, kind="fake_predictions")["data"]["cases"]}
    rows = load_measurement(recording, kind="measure_plain")["data"]["cases"]
    misses = 0
    for split in ("reference", "held-out"):
        print(f"{split}:")
        n = ok = 0
        for r in rows:
            p = pred.get(r["name"])
            if p is None or p.get("split") != split:
                continue
            if not r.get("peak_allocated") or "peak_allocated" not in p:
                print(f"  {r['name']:42s} {r.get('error') or p.get('refused') or 'no figures'}")
                continue
            pe = 100 * (p["peak_allocated"] - r["peak_allocated"]) / r["peak_allocated"]
            re_ = 100 * (p["peak_reserved"] - r["peak_reserved"]) / r["peak_reserved"]
            good = abs(pe) <= PEAK_TOLERANCE_PCT and abs(re_) <= RESERVED_TOLERANCE_PCT
            n, ok = n + 1, ok + good
            print(f"  {r['name']:42s} peak {r['peak_allocated'] / 1e9:7.3f} GB {pe:+6.2f}%   reserved "
                  f"{r['peak_reserved'] / 1e9:7.3f} GB {re_:+6.2f}%   retries {r.get('num_alloc_retries', 0)}"
                  f"{'' if good else '   MISS'}")
        print(f"  {ok} of {n} within targets (peak {PEAK_TOLERANCE_PCT}%, reserved {RESERVED_TOLERANCE_PCT}%)")
        misses += n - ok
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
