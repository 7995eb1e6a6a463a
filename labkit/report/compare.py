"""Night-to-night comparison: each key result beside the previous run's value from the same folder."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TOLERANCE = 0.10  # relative change flagged when a result sets none


def previous_run(out_dir: Path, current_id: str) -> tuple[str, dict] | None:
    """The most recent finished run in ``out_dir`` other than ``current_id``."""
    best: tuple[str, dict] | None = None
    for summary in out_dir.glob("*/summary.json"):
        run_id = summary.parent.name
        if run_id == current_id:
            continue
        try:
            doc = json.loads(summary.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if doc.get("state") != "finished":
            continue
        if best is None or str(doc.get("started")) > str(best[1].get("started")):
            best = (run_id, doc)
    return best


def compare(current: dict, previous: dict | None) -> dict[str, dict[str, dict]]:
    """{notebook: {result: {previous, rel_change, flagged}}} for results present in both runs."""
    out: dict[str, dict[str, dict]] = {}
    if not previous:
        return out
    prev = {nb["name"]: nb.get("results") or {} for nb in previous.get("notebooks", [])}
    for nb in current.get("notebooks", []):
        for name, r in (nb.get("results") or {}).items():
            old = prev.get(nb["name"], {}).get(name)
            if old is None:
                continue
            entry: dict = {"previous": old["value"], "rel_change": None, "flagged": False}
            new_v, old_v = r["value"], old["value"]
            if isinstance(new_v, (int, float)) and isinstance(old_v, (int, float)):
                denom = abs(old_v) if old_v else 1.0
                rel = (new_v - old_v) / denom
                tol = r.get("tolerance") if r.get("tolerance") is not None else DEFAULT_TOLERANCE
                entry.update(rel_change=rel, flagged=abs(rel) > tol)
            else:
                entry["flagged"] = new_v != old_v
            out.setdefault(nb["name"], {})[name] = entry
    return out
