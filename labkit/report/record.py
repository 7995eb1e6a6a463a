"""``record(name, value, unit, source=...)``: the one way a notebook puts a key result in the report.

Under ``labkit report`` the runner sets ``LABKIT_RESULTS_FILE`` and each call appends one JSON
line there; the runner collects them into ``summary.json``. Interactively, results are kept in
memory (``recorded()``) and nothing is written.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

from labkit.core.errors import LabkitError

RESULTS_ENV = "LABKIT_RESULTS_FILE"
SOURCES = ("measured here", "model", "recorded", "sample")
DIRECTIONS = ("higher", "lower")  # which way is better; None: informational (any change is just "changed")


@dataclass
class Result:
    name: str
    value: float | int | str
    unit: str
    source: str
    tolerance: float | None = None  # relative change vs the last comparable run that is flagged
    direction: str | None = None    # "higher" or "lower" is better; None: informational
    label: str = ""                 # what the number is, in words (the index shows it; ``name`` is its key)


_session: dict[str, Result] = {}


def record(name: str, value: float | int | str, unit: str = "", *, source: str,
           tolerance: float | None = None, direction: str | None = None, label: str = "") -> None:
    """Record a key result. ``source`` says where the number comes from: 'measured here',
    'model', 'recorded on <GPU>, <date>' or 'sample: <name>'. ``direction`` says which way is
    better ("higher" or "lower"), so the report can call a change a regression or an improvement;
    leave it None for a result that is information only. A result measured here must have one: it
    is what a nightly run can catch moving (``--fail-on-regression``). ``label``: the result in words."""
    if not name or not isinstance(name, str):
        raise LabkitError(f"record: result name must be a non-empty string, got {name!r}")
    if not any(source.startswith(s) for s in SOURCES):
        raise LabkitError(f"record {name!r}: source {source!r} must start with one of {SOURCES}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LabkitError(f"record {name!r}: value must be a number or a string, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise LabkitError(f"record {name!r}: value is {value}, not a finite number")
    if direction is not None and direction not in DIRECTIONS:
        raise LabkitError(f"record {name!r}: direction {direction!r} is not 'higher', 'lower' or None")
    if direction is None and source.startswith("measured here"):
        raise LabkitError(f"record {name!r}: a result measured here needs a direction ('higher' or 'lower' is "
                          "better), or the nightly report cannot flag it when it regresses")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
                                  or not math.isfinite(tolerance) or tolerance < 0):
        raise LabkitError(f"record {name!r}: tolerance {tolerance!r} must be a finite number >= 0")
    if hasattr(value, "item"):
        value = value.item()
    r = Result(name=name, value=value, unit=unit, source=source, tolerance=tolerance, direction=direction,
               label=str(label))
    _session[name] = r
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(asdict(r)) + "\n")


def recorded() -> dict[str, Result]:
    """Results recorded in this Python session (a notebook's kernel)."""
    return dict(_session)


def read_results(path: str) -> dict[str, dict]:
    """Results a notebook wrote to ``path`` (later records of a name win)."""
    out: dict[str, dict] = {}
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out[d["name"]] = d
    except FileNotFoundError:
        pass
    return out
