"""Reading ``torch.cuda.memory._snapshot()`` files (pickle, optionally gzip'd) safely and strictly.

A snapshot is a dict with ``segments`` (the allocator's state when it was taken), ``device_traces``
(one list of trace entries per device, when ``_record_memory_history`` was on) and
``allocator_settings``. Pickles can run code when loaded, so only plain containers and scalars
are accepted here. A file that is not a snapshot, or is truncated, raises :class:`LabkitError`
with the reason; it never yields a partial answer.
"""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.serialize import read_bytes

TRACE_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "oom", "snapshot", "user_defined"}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle hook
        if module == "builtins" and name in ("set", "frozenset", "complex"):
            return getattr(__import__("builtins"), name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a memory snapshot holds only plain data")


@dataclass
class Snapshot:
    """A memory snapshot: segments at the end, per-device traces, the allocator settings."""

    source: str
    segments: list[dict[str, Any]]
    device_traces: list[list[dict[str, Any]]]
    allocator_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def devices_with_traces(self) -> list[int]:
        return [i for i, t in enumerate(self.device_traces) if t]

    def alloc_conf(self) -> str:
        """The ``PYTORCH_ALLOC_CONF`` string the snapshot was recorded under ("" for the default)."""
        s = self.allocator_settings or {}
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "last_allocator_settings"):
            if isinstance(s.get(k), str):
                return s[k]
        parts = []
        if s.get("expandable_segments"):
            parts.append("expandable_segments:True")
        ms = s.get("max_split_size")
        if isinstance(ms, int) and 0 < ms < (1 << 62):
            parts.append(f"max_split_size_mb:{ms // (1024 * 1024)}")
        return ",".join(parts)


def _load_bytes(raw: bytes, name: str) -> Any:
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise LabkitError(f"{name}: the gzip stream is truncated (the file was cut short)") from None
        except (OSError, gzip.BadGzipFile) as exc:
            raise LabkitError(f"{name}: not a readable gzip file ({exc})") from None
    if not raw:
        raise LabkitError(f"{name}: the file is empty")
    if raw[:1] != b"\x80":
        raise LabkitError(f"{name}: not a pickle (a torch.cuda.memory._snapshot() file is a pickle, "
                          "optionally gzip'd)")
    try:
        return _SafeUnpickler(io.BytesIO(raw)).load()
    except EOFError:
        raise LabkitError(f"{name}: the pickle is truncated (the file was cut short)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise LabkitError(f"{name}: not a readable memory snapshot ({exc})") from None


def _check(obj: Any, name: str) -> Snapshot:
    if not isinstance(obj, dict):
        raise LabkitError(f"{name}: a memory snapshot is a dict with 'segments' and 'device_traces', "
                          f"this file holds a {type(obj).__name__}")
    if "segments" not in obj:
        raise LabkitError(f"{name}: no 'segments' key: not a torch.cuda.memory._snapshot() dict "
                          f"(keys: {sorted(map(str, obj))[:8]})")
    segs = obj["segments"]
    traces = obj.get("device_traces", [])
    if not isinstance(segs, list) or not isinstance(traces, list):
        raise LabkitError(f"{name}: 'segments' and 'device_traces' must be lists")
    for i, s in enumerate(segs):
        if not isinstance(s, dict) or not isinstance(s.get("address"), int) or not isinstance(s.get("total_size"), int) \
                or not isinstance(s.get("blocks", []), list):
            raise LabkitError(f"{name}: segment {i} is malformed (needs integer 'address', 'total_size' and a "
                              "'blocks' list)")
    for d, tr in enumerate(traces):
        if not isinstance(tr, list):
            raise LabkitError(f"{name}: device_traces[{d}] is not a list")
        for j, e in enumerate(tr):
            if not isinstance(e, dict) or e.get("action") not in TRACE_ACTIONS:
                raise LabkitError(f"{name}: device_traces[{d}][{j}] is not a trace entry "
                                  f"(action {e.get('action') if isinstance(e, dict) else e!r})")
            if not isinstance(e.get("size", 0), int) or (e["action"] != "oom" and not isinstance(e.get("addr", 0), int)):
                raise LabkitError(f"{name}: device_traces[{d}][{j}] ({e['action']}) has a non-integer size or address")
    settings = obj.get("allocator_settings") or {}
    return Snapshot(name, segs, traces, settings if isinstance(settings, dict) else {})


def read_snapshot(src: str | Path | bytes | dict) -> Snapshot:
    """Read a snapshot from a path (``.pickle`` / ``.pickle.gz``), raw bytes, or an already loaded dict."""
    if isinstance(src, dict):
        return _check(src, "snapshot")
    if isinstance(src, (bytes, bytearray)):
        return _check(_load_bytes(bytes(src), "snapshot"), "snapshot")
    path = Path(src)
    raw = read_bytes(path, "snapshot file")
    return _check(_load_bytes(raw, str(path)), str(path))
