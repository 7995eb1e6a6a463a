"""Small shared pieces: errors, units, JSON, provenance."""

from labkit.core.errors import LabkitError
from labkit.core.units import GB, GiB, KiB, MiB, fmt_bytes, parse_bytes
from labkit.core.serialize import to_jsonable, dumps

__all__ = ["LabkitError", "GB", "GiB", "KiB", "MiB", "fmt_bytes", "parse_bytes", "to_jsonable", "dumps"]
