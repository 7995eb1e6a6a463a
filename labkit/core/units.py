"""Bytes are plain ints everywhere inside labkit; units appear only when formatting.

Both binary (GiB = 2**30) and decimal (GB = 10**9) units are used in the field, so every
formatted value names which one it is.
"""

from __future__ import annotations

import math
import re

from labkit.core.errors import LabkitError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
KB = 1000
MB = 1000**2
GB = 1000**3

_BINARY = [("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)]
_DECIMAL = [("TB", 1000**4), ("GB", GB), ("MB", MB), ("KB", KB)]
_UNITS = {name.lower(): factor for name, factor in _BINARY + _DECIMAL}
_UNITS.update({"b": 1, "": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024**4})


def fmt_bytes(n: float, *, binary: bool = True, digits: int = 2) -> str:
    """Format a byte count with a named unit: ``fmt_bytes(3 * 2**30) == '3.00 GiB'``."""
    table = _BINARY if binary else _DECIMAL
    sign = "-" if n < 0 else ""
    a = abs(n)
    for name, factor in table:
        if a >= factor:
            return f"{sign}{a / factor:.{digits}f} {name}"
    return f"{sign}{int(a)} B"


MAX_BYTES = 2**63 - 1  # a signed 64-bit byte count, what torch and NumPy sizes hold


def parse_bytes(text: str | int, *, what: str = "size", require_unit: bool = False) -> int:
    """Parse '512', '4KiB', '1.5 GB', '25M' (M/G alone mean binary units) into bytes.
    ``require_unit``: a bare number is refused, naming the units to use (a GPU's memory: '141' is
    neither 141 bytes nor a guess between GB and GiB)."""
    if isinstance(text, int) and not require_unit:
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise LabkitError(f"{what}: cannot read {text!r} as a size (examples: 4096, 64KiB, 1.5GB, 2GiB)")
    if require_unit and not m.group(2):
        raise LabkitError(f"{what} {text}: give a unit, e.g. {m.group(1)}GB (10^9 bytes, as vendors state a GPU's "
                          f"memory) or {m.group(1)}GiB (2^30 bytes, as torch reports it)")
    v = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(v):  # '1e400' reads as inf
        raise LabkitError(f"{what}: {text!r} is not a finite size")
    if v > MAX_BYTES:
        raise LabkitError(f"{what}: {text!r} is more than the largest size labkit takes, {MAX_BYTES} bytes (8 EiB)")
    return int(round(v))
