"""One helper turns labkit's dataclasses into JSON; the CLI's --json prints exactly that."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """Recursively convert dataclasses, enums, paths, tuples and numpy scalars to JSON types.

    Non-finite floats become None (JSON has no NaN/inf).
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return to_jsonable(obj.item())
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def read_bytes(path: str | Path, what: str = "file", *, limit: int | None = None) -> bytes:
    """Read a user's file; a missing path, a folder or (with ``limit``) a file larger than ``limit``
    bytes is a LabkitError naming the path."""
    from labkit.core.errors import LabkitError

    p = Path(path)
    try:
        if limit is not None and p.is_file() and p.stat().st_size > limit:
            raise LabkitError(f"{p}: {p.stat().st_size} bytes, more than a {what} can be ({limit} bytes)")
        return p.read_bytes()
    except FileNotFoundError:
        raise LabkitError(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise LabkitError(f"{p}: is a folder, expected a {what}") from None


def read_json(path: str | Path, what: str = "file") -> Any:
    """Parse a JSON file; a missing or malformed file is a LabkitError naming the path."""
    from labkit.core.errors import LabkitError

    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise LabkitError(f"{p}: no such {what}") from None
    except json.JSONDecodeError as exc:
        raise LabkitError(f"{p}: not valid JSON ({exc})") from None


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=False)
