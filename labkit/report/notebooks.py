"""The lab's notebooks and their parameters: discovery, and refusing bad names before a run."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.paths import NOTEBOOKS_DIR
from labkit.core.units import parse_bytes
from labkit.core.vocab import canonical
from labkit.memory import get_preset
from labkit.topology import list_samples
from labkit.workloads import get_workload

# papermill (11 s to import: python -X importtime, 2-core machine) is imported where a notebook runs.


@dataclass
class Parameter:
    name: str
    type_name: str  # as papermill infers it from the annotation: 'bool', 'int', 'float', 'str', 'None' (unknown)
    default: str


def discover(directory: Path = NOTEBOOKS_DIR) -> dict[str, Path]:
    """Notebook name (file name without .ipynb) -> path, in order."""
    return {p.stem: p for p in sorted(Path(directory).glob("*.ipynb")) if not p.name.startswith(".")}


def select(names: list[str] | None, directory: Path = NOTEBOOKS_DIR) -> dict[str, Path]:
    found = discover(directory)
    if not found:
        raise LabkitError(f"no notebooks found in {directory}")
    if not names:
        return found
    unknown = [n for n in names if n not in found]
    if unknown:
        raise LabkitError(f"unknown notebook(s) {', '.join(unknown)}; known: {', '.join(found)}")
    return {n: found[n] for n in names}


def parameters(path: Path) -> dict[str, Parameter]:
    """The parameters declared in a notebook's cell tagged 'parameters'."""
    import papermill

    try:
        raw = papermill.inspect_notebook(str(path))
    except Exception as exc:  # papermill raises plain exceptions for unreadable notebooks
        raise LabkitError(f"{path}: cannot read parameters ({exc})") from None
    return {name: Parameter(name, str(p.get("inferred_type_name", "None")), str(p.get("default")))
            for name, p in raw.items()}


def parse_assignments(items: list[str]) -> dict[str, str]:
    """['smoke=true', 'n=3'] -> {'smoke': 'true', 'n': '3'}; refuses anything without '='."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise LabkitError(f"-p {item!r}: expected key=value with a Python identifier as key")
        out[name] = value
    return out


#: Counts whose every unit starts work (ranks are processes): a lower bound than the default 2^20.
INT_PARAMETER_MAX = {"world": 64, "tp": 1024, "pp": 1024, "dp": 1 << 16, "deep_layers": 1024, "planner_nodes": 4096,
                     "sim_gpus_per_node": 64, "sim_nodes": 4096}


def coerce(name: str, text: str, type_name: str) -> Any:
    """Convert the text of ``-p name=text`` to the parameter's declared type."""
    t = type_name.lower()
    if t == "bool":
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise LabkitError(f"-p {name}={text}: {name} is a bool; use true or false")
    if t == "int":
        try:
            v = int(text)
        except ValueError:
            raise LabkitError(f"-p {name}={text}: {name} is an int") from None
        hi = INT_PARAMETER_MAX.get(name, 1 << 20)
        if not 1 <= v <= hi:   # every int a notebook declares is a count (GPUs, ranks, tokens, MiB, layers)
            raise LabkitError(f"-p {name}={text}: {name} is a count from 1 to {hi}")
        return v
    if t == "float":
        try:
            v = float(text)
        except ValueError:
            raise LabkitError(f"-p {name}={text}: {name} is a float") from None
        if not math.isfinite(v) or v < 0:   # sizes, rates, latencies: 0 means "none" where one is allowed
            raise LabkitError(f"-p {name}={text}: {name} is a finite number >= 0")
        return v
    if t == "str":
        return text
    try:  # no annotation: read a Python literal, else keep the text
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _sample(v: str) -> None:
    names = [s.name for s in list_samples()]
    if v not in names:
        raise LabkitError(f"not a bundled topology sample (labkit topo --list): {', '.join(names)}")


def _preset(v: str) -> None:
    get_preset(v)


def _workload(v: str) -> None:
    get_workload(v)


def _precision(v: str) -> None:
    canonical("precision", v)


def _size(v: str) -> None:
    if parse_bytes(v, what="the size") <= 0:
        raise LabkitError("a size above 0, e.g. 80GiB")


#: Words a notebook takes by name, checked before anything runs (a bad one would fail its notebook: exit 1).
VALUE_CHECKS = {"sample": _sample, "topology_sample": _sample, "model_name": _preset, "planner_model": _preset,
                "model": _preset, "workload": _workload, "precision": _precision, "gpu_memory": _size}


def check_value(name: str, value: Any) -> None:
    """Refuse ``-p name=value`` that the notebook would fail on (an unknown sample, preset, workload, ...)."""
    check = VALUE_CHECKS.get(name)
    if check is None or not isinstance(value, str) or (name == "model" and value == ""):
        return
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            check(value)
    except LabkitError as exc:
        raise LabkitError(f"-p {name}={value[:80]}: {exc}") from None


def resolve(selected: dict[str, Path], raw: dict[str, str], profile: str) -> dict[str, dict[str, Any]]:
    """Per-notebook parameters: the profile's smoke flag plus every -p the notebook declares.

    A -p name no selected notebook declares is refused, as is a notebook without a smoke flag.
    """
    if profile not in ("smoke", "full"):
        raise LabkitError(f"--profile {profile!r}: expected smoke or full")
    declared = {name: parameters(path) for name, path in selected.items()}
    known = set().union(*(set(d) for d in declared.values()))
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LabkitError(f"unknown parameter(s) {', '.join(unknown)} for notebook(s) {', '.join(selected)}; "
                          f"declared: {', '.join(sorted(known)) or 'none'}")
    out: dict[str, dict[str, Any]] = {}
    for name, params in declared.items():
        if "smoke" not in params:
            raise LabkitError(f"notebook {name}: its parameters cell declares no 'smoke' flag")
        values: dict[str, Any] = {"smoke": profile == "smoke"}
        for key, text in raw.items():
            if key in params:
                values[key] = coerce(key, text, params[key].type_name)
                check_value(key, values[key])
        out[name] = values
    return out
