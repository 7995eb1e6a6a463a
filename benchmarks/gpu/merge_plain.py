"""Merge a new ``record_plain.py --fresh`` recording into the corpus' fresh-process recording.

    PYTHONPATH=. python3 benchmarks/gpu/merge_plain.py NEW/plain_cases.json [--note TEXT]
        [--into data/measurements/measure/plain__fresh.json]

Each row of ``NEW`` that ran (no ``error``) is stored with the new recording's provenance as its own
(``row["provenance"]``, which ``labkit.memory.trace.corpus_check.load_plain`` prefers to the file's), replacing
a row of the same name or added; the rows are kept in the corpus' order (``labkit.workloads.corpus.CASES``;
rows of cases no longer in the corpus stay at the end). The file's provenance lists the merged rows under
``rows_with_own_provenance`` and ``--note`` is appended to ``rows_with_own_provenance_note``. Nothing already
recorded is lost: a row is replaced only by a row of the same name that ran, and failed rows are reported and
left out. The file is written only when every new row names a corpus case and was recorded in fresh processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement, write_measurement

DEFAULT_INTO = Path("data/measurements/measure/plain__fresh.json")


def merge(new_path: Path, into: Path, note: str = "") -> dict[str, Any]:
    """Merge ``new_path``'s rows into ``into`` (see the module doc); returns a summary."""
    from labkit.workloads.corpus import CASES

    new = load_measurement(new_path, kind="measure_plain")
    if new["data"].get("process") != "fresh":
        raise LabkitError(f"{new_path}: not a --fresh recording (each case in its own process); merge only those "
                          f"into {into}")
    if new["data"].get("smoke"):
        raise LabkitError(f"{new_path}: a --smoke recording (CPU, no peaks); it is not ground truth")
    old = load_measurement(into, kind="measure_plain")
    names = {c.name for c in CASES}
    order = {c.name: i for i, c in enumerate(CASES)}
    rows = {r["name"]: r for r in old["data"]["cases"]}
    added, replaced, failed = [], [], []
    for r in new["data"]["cases"]:
        if r.get("name") not in names:
            raise LabkitError(f"{new_path}: row {r.get('name')!r} is not a corpus case (labkit.workloads.corpus)")
        if "error" in r or r.get("peak_allocated") is None:
            failed.append(f"{r['name']}: {r.get('error', 'no peak')}")
            continue
        row = dict(r)
        row["provenance"] = new["provenance"]
        (replaced if r["name"] in rows else added).append(r["name"])
        rows[r["name"]] = row
    merged = sorted(rows.values(), key=lambda r: order.get(r["name"], len(order)))
    prov = dict(old["provenance"])
    own = list(prov.get("rows_with_own_provenance", []))
    own += [n for n in added + replaced if n not in own]
    prov["rows_with_own_provenance"] = own
    if note:
        prov["rows_with_own_provenance_note"] = "; ".join(x for x in (prov.get("rows_with_own_provenance_note", ""),
                                                                      note) if x)
    data = dict(old["data"])
    data["cases"] = merged
    write_measurement(into, "measure_plain", data, provenance=prov)
    return {"added": added, "replaced": replaced, "failed": failed, "rows": len(merged)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new", type=Path, help="plain_cases.json of a record_plain.py --fresh run")
    ap.add_argument("--into", type=Path, default=DEFAULT_INTO)
    ap.add_argument("--note", default="", help="appended to the provenance's rows_with_own_provenance_note")
    args = ap.parse_args(argv)
    try:
        s = merge(args.new, args.into, args.note)
    except LabkitError as exc:
        print(f"merge_plain: {exc}", file=sys.stderr)
        return 2
    print(f"{args.into}: {len(s['added'])} rows added, {len(s['replaced'])} replaced, {s['rows']} in all")
    for f in s["failed"]:
        print(f"  not merged (the case failed): {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
