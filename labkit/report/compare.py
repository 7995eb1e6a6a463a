"""Night-to-night comparison: each key result against the last *comparable* run in the history.

Comparable means the same machine identity (GPU model and count, driver, torch, CUDA), the same
notebook parameters and the same profile (``labkit.report.history``). A change beyond the result's
tolerance is a *regression* when it goes the bad way for the result's direction ("higher" or
"lower" is better), an *improvement* the other way, and just *changed* for an informational result.
A result with earlier values only from other set-ups is *not comparable*, and the reason says what
differed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.report.history import Entry, entries_from_summary

DEFAULT_TOLERANCE = 0.10  # relative change flagged when a result sets none
TREND_POINTS = 20         # runs shown in a trend
_UNSET = object()


@dataclass
class Comparison:
    status: str                       # new | same | changed | improved | regressed | not comparable
    previous: float | int | str | None = None
    previous_run: str | None = None
    rel_change: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    reason: str = ""
    trend: list[tuple[str, float]] = field(default_factory=list)  # (run_id, value), comparable runs, oldest first

    @property
    def flagged(self) -> bool:
        return self.status in ("changed", "improved", "regressed")


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _differences(a: Entry, b: Entry) -> str:
    parts = []
    if a.machine_key != b.machine_key:
        parts.append(f"machine {b.machine_key} -> {a.machine_key}")
    if a.profile != b.profile:
        parts.append(f"profile {b.profile} -> {a.profile}")
    keys = sorted(set(a.parameters) | set(b.parameters))
    def shown(params: dict, k: str) -> str:  # a parameter not set with -p ran with the notebook's default
        return repr(params[k]) if k in params else "default"

    for k in keys:
        if a.parameters.get(k, _UNSET) != b.parameters.get(k, _UNSET):
            parts.append(f"{k} {shown(b.parameters, k)} -> {shown(a.parameters, k)}")
    return "; ".join(parts)


def _judge(cur: Entry, prev: Entry) -> tuple[str, float | None]:
    tol = cur.tolerance if cur.tolerance is not None else DEFAULT_TOLERANCE
    if not (_numeric(cur.value) and _numeric(prev.value)):
        return ("same" if cur.value == prev.value else "changed"), None
    denom = abs(prev.value) if prev.value else 1.0
    rel = (cur.value - prev.value) / denom
    if abs(rel) <= tol:
        return "same", rel
    if cur.direction is None:
        return "changed", rel
    better = rel > 0 if cur.direction == "higher" else rel < 0
    return ("improved" if better else "regressed"), rel


def compare(current: dict, history: list[Entry]) -> dict[str, dict[str, Comparison]]:
    """{notebook: {result: Comparison}} for the run ``current`` (a summary document) against the
    earlier runs in ``history`` (entries of ``current``'s own run are ignored)."""
    earlier = [e for e in history if e.run_id != current.get("run_id")]
    by_result: dict[tuple[str, str], list[Entry]] = {}
    for e in earlier:
        by_result.setdefault((e.notebook, e.name), []).append(e)
    out: dict[str, dict[str, Comparison]] = {}
    for cur in entries_from_summary(current):
        past = by_result.get((cur.notebook, cur.name), [])
        same_setup = [e for e in past if e.setup_key == cur.setup_key]
        tol = cur.tolerance if cur.tolerance is not None else DEFAULT_TOLERANCE
        if same_setup:
            prev = same_setup[-1]
            status, rel = _judge(cur, prev)
            c = Comparison(status, prev.value, prev.run_id, rel, tol)
        elif past:
            prev = past[-1]
            c = Comparison("not comparable", prev.value, prev.run_id, None, tol, _differences(cur, prev))
        else:
            c = Comparison("new", tolerance=tol)
        if _numeric(cur.value):
            pts = [(e.run_id, float(e.value)) for e in same_setup if _numeric(e.value)]
            c.trend = (pts + [(cur.run_id, float(cur.value))])[-TREND_POINTS:]
        out.setdefault(cur.notebook, {})[cur.name] = c
    return out


def regressions(comparison: dict[str, dict[str, Comparison]]) -> list[str]:
    """'notebook/result' for every result that regressed."""
    return [f"{nb}/{name}" for nb, res in comparison.items() for name, c in res.items() if c.status == "regressed"]
