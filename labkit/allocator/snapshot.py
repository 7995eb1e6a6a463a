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
import reprlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.serialize import read_bytes
from labkit.core.units import fmt_bytes

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


#: Largest decompressed snapshot read by default. Loading a pickle of small dicts takes about 5x its size in memory,
#: so 512 MiB of pickle is about 2.5 GB of Python objects; ``--max-snapshot-bytes`` raises it.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024


def _too_big(name: str, limit: int) -> LabkitError:
    return LabkitError(f"{name}: decompresses to more than {fmt_bytes(limit)} (the snapshot size limit; loading takes "
                       "about 5x that in memory); if the file is genuine, raise the limit with --max-snapshot-bytes "
                       "(max_bytes=)")


def _gunzip(raw: bytes, name: str, limit: int) -> bytes:
    """Decompress at most ``limit`` bytes: a gzip bomb is refused after reading limit + 1 bytes, not all of it."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            out = f.read(limit + 1)
    except EOFError:
        raise LabkitError(f"{name}: the gzip stream is truncated (the file was cut short)") from None
    except (OSError, gzip.BadGzipFile, zlib.error) as exc:
        raise LabkitError(f"{name}: not a readable gzip file ({exc})") from None
    if len(out) > limit:
        raise _too_big(name, limit)
    return out


#: Bytes of Python objects one pickle opcode byte can create at most (CPython 3.11, 64-bit): an empty set, dict,
#: list, a 1-3 tuple, a short string, an int or float; every byte also costs up to 16 (stack, memo, container
#: slots). An upper bound on what decoding can take, counted before decoding (bytes.count per opcode).
_OPCODE_BYTES = {0x8F: 216, 0x91: 216, 0x7D: 64, 0x5D: 56, 0x85: 48, 0x86: 56, 0x87: 64, 0x8C: 60, 0x58: 60,
                 0x4A: 32, 0x47: 24, 0x8A: 40, 0x28: 16}
#: The snapshots torch writes take about 21x their pickled size by that bound (the recordings under data/traces:
#: 20.6-21.4x; about 9x really); a pickle above this ratio is built to expand, not written by torch.
MAX_DECODE_RATIO = 40
#: A snapshot's trace entries and blocks each take ~50 pickled bytes (data/traces); a memoised reference takes 2-5.
MIN_BYTES_PER_ITEM = 12


def decode_budget(raw: bytes, name: str, max_bytes: int) -> int:
    """The most memory decoding ``raw`` can take (an upper bound); a LabkitError when that is more than the
    budget: :data:`MAX_DECODE_RATIO` x the file, and 24 x ``max_bytes`` in all."""
    bound = 16 * len(raw) + sum(w * raw.count(bytes([op])) for op, w in _OPCODE_BYTES.items())
    if bound > MAX_DECODE_RATIO * len(raw) or bound > 24 * max_bytes:
        raise LabkitError(f"{name}: decoding this pickle could take up to {fmt_bytes(bound)} of memory "
                          f"({bound / max(len(raw), 1):.0f} bytes per byte of pickle; a snapshot torch writes takes "
                          f"about 21): built to expand, not a memory snapshot; refused before decoding")
    return bound


def _load_bytes(raw: bytes, name: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    return _decode(raw, name, max_bytes)[0]


def _decode(raw: bytes, name: str, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Any, int]:
    """The loaded object and its pickled (decompressed) size."""
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(raw, name, max_bytes)
    elif len(raw) > max_bytes:
        raise _too_big(name, max_bytes)
    if not raw:
        raise LabkitError(f"{name}: the file is empty")
    if raw[:1] != b"\x80":
        raise LabkitError(f"{name}: not a pickle (a torch.cuda.memory._snapshot() file is a pickle, "
                          "optionally gzip'd)")
    decode_budget(raw, name, max_bytes)
    return _unpickle(raw, name), len(raw)


def _unpickle(raw: bytes, name: str) -> Any:
    try:
        return _SafeUnpickler(io.BytesIO(raw)).load()
    except EOFError:
        raise LabkitError(f"{name}: the pickle is truncated (the file was cut short)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise LabkitError(f"{name}: not a readable memory snapshot ({_short(str(exc))})") from None
    except RecursionError:
        raise LabkitError(f"{name}: not a readable memory snapshot (nested too deeply)") from None
    except MemoryError:
        raise LabkitError(f"{name}: not a readable memory snapshot (it does not fit in memory)") from None


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = 40
_REPR.maxother = 40


def _short(x: Any) -> str:
    """A bounded description of any loaded value (never recurses deeply: nesting 100,000 deep is fine)."""
    try:
        return _REPR.repr(x)
    except (RecursionError, Exception):  # noqa: BLE001 - a description must not fail
        return f"a {type(x).__name__}"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: More bytes than any GPU has (a segment, a device's segments, a request): 1 TiB; an H200 has 141 GB.
MAX_DEVICE_BYTES = 1 << 40
#: The states ``torch.cuda.memory_snapshot()`` gives a block (c10/cuda/CUDACachingAllocator.cpp, snapshot()).
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


def _segment_problem(s: Any) -> str | None:
    if not isinstance(s, dict):
        return f"is a {type(s).__name__}, not a dict"
    for k in ("address", "total_size"):
        if not _is_int(s.get(k)) or s[k] < 0:
            return f"needs a non-negative integer {k!r}, has {_short(s.get(k))}"
    if s["total_size"] > MAX_DEVICE_BYTES:
        return f"has total_size {s['total_size']}, more than any GPU's memory (1 TiB)"
    if "device" in s and _is_int(s["device"]) and not 0 <= s["device"] < 1024:
        return f"has device {s['device']}, not a GPU index"
    for k in ("device", "stream", "allocated_size", "active_size", "requested_size"):
        if k in s and not _is_int(s[k]):
            return f"{k!r} is {_short(s[k])}, not an integer"
    pool = s.get("segment_pool_id")
    if pool is not None and not (isinstance(pool, (tuple, list)) and all(_is_int(v) for v in pool)):
        return f"'segment_pool_id' is {_short(pool)}, not a pair of integers"
    blocks = s.get("blocks", [])
    if not isinstance(blocks, list):
        return f"'blocks' is a {type(blocks).__name__}, not a list"
    total = 0
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or not _is_int(b.get("size", 0)) or not isinstance(b.get("state", ""), str):
            return f"block {j} is not a block (needs an integer 'size' and a string 'state'): {_short(b)}"
        if b.get("size", 0) < 0:
            return f"block {j} has a negative size {b['size']}"
        if "state" in b and b["state"] not in BLOCK_STATES:
            return f"block {j} has state {_short(b['state'])} (expected one of {', '.join(BLOCK_STATES)})"
        total += b.get("size", 0)
    if total > s["total_size"]:
        return f"its blocks hold {total} bytes, more than the segment's total_size {s['total_size']}"
    return None


def _entry_problem(e: Any) -> str | None:
    if not isinstance(e, dict):
        return f"is a {type(e).__name__}, not a trace entry"
    a = e.get("action")
    if not isinstance(a, str) or a not in TRACE_ACTIONS:
        return f"has action {_short(a)} (expected one of {', '.join(sorted(TRACE_ACTIONS))})"
    if not _is_int(e.get("size", 0)) or e.get("size", 0) < 0:
        return f"({a}) has size {_short(e.get('size'))}, not a non-negative integer"
    if e.get("size", 0) > MAX_DEVICE_BYTES:
        return f"({a}) has size {e['size']}, more than any GPU's memory (1 TiB)"
    if a != "oom" and not _is_int(e.get("addr", 0)):
        return f"({a}) has address {_short(e.get('addr'))}, not an integer"
    if "stream" in e and not _is_int(e["stream"]):
        return f"({a}) has stream {_short(e['stream'])}, not an integer"
    return None


def _check(obj: Any, name: str, pickled: int = 0) -> Snapshot:
    """A loaded snapshot, checked; ``pickled``: its pickled size, which bounds how many items it may hold."""
    if not isinstance(obj, dict):
        raise LabkitError(f"{name}: a memory snapshot is a dict with 'segments' and 'device_traces', "
                          f"this file holds a {type(obj).__name__}")
    if "segments" not in obj:
        raise LabkitError(f"{name}: no 'segments' key: not a torch.cuda.memory._snapshot() dict "
                          f"(keys: {_short(list(obj)[:8])})")
    segs = obj["segments"]
    traces = obj.get("device_traces", [])
    if not isinstance(segs, list) or not isinstance(traces, list):
        raise LabkitError(f"{name}: 'segments' and 'device_traces' must be lists")
    if not all(isinstance(tr, list) for tr in traces):
        d = next(i for i, tr in enumerate(traces) if not isinstance(tr, list))
        raise LabkitError(f"{name}: device_traces[{d}] is a {type(traces[d]).__name__}, not a list")
    items = len(segs) + sum(len(s["blocks"]) for s in segs if isinstance(s, dict) and isinstance(s.get("blocks"), list))
    items += sum(len(tr) for tr in traces)
    if pickled and items > pickled // MIN_BYTES_PER_ITEM:
        raise LabkitError(f"{name}: {items} segments, blocks and trace entries in {pickled} pickled bytes: they repeat "
                          "shared references (a snapshot torch writes holds each one once); refused before reading them")
    seen: set[int] = set()
    for i, s in enumerate(segs):
        if isinstance(s, dict) and isinstance(s.get("blocks"), list) and s["blocks"]:
            if id(s["blocks"]) in seen:
                raise LabkitError(f"{name}: segments[{i}] shares its block list with another segment (a snapshot "
                                  "torch writes gives each its own)")
            seen.add(id(s["blocks"]))
    for i, s in enumerate(segs):
        why = _segment_problem(s)
        if why:
            raise LabkitError(f"{name}: segments[{i}] is malformed: {why}")
    for d, tr in enumerate(traces):
        if not isinstance(tr, list):
            raise LabkitError(f"{name}: device_traces[{d}] is a {type(tr).__name__}, not a list")
        for j, e in enumerate(tr):
            why = _entry_problem(e)
            if why:
                raise LabkitError(f"{name}: device_traces[{d}][{j}] {why}")
    per_device: dict[int, int] = {}
    for s in segs:
        per_device[s.get("device", 0)] = per_device.get(s.get("device", 0), 0) + s["total_size"]
    for d, total in per_device.items():
        if total > MAX_DEVICE_BYTES:
            raise LabkitError(f"{name}: device {d}'s segments hold {total} bytes, more than any GPU's memory (1 TiB)")
    settings = obj.get("allocator_settings") or {}
    return Snapshot(name, segs, traces, settings if isinstance(settings, dict) else {})


def read_snapshot(src: str | Path | bytes | dict, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    """Read a snapshot from a path (``.pickle`` / ``.pickle.gz``), raw bytes, or an already loaded dict.

    ``max_bytes`` caps the decompressed size (a larger file is refused before it is unpacked in full)."""
    if isinstance(src, dict):
        return _check(src, "snapshot")
    if isinstance(src, (bytes, bytearray)):
        obj, size = _decode(bytes(src), "snapshot", max_bytes)
        return _check(obj, "snapshot", size)
    path = Path(src)
    try:
        raw = read_bytes(path, "snapshot file", limit=max_bytes)
    except LabkitError as exc:  # compressed data is never larger than what it unpacks to (for real snapshots)
        if "more than a snapshot file can be" in str(exc):
            raise _too_big(str(path), max_bytes) from None
        raise
    obj, size = _decode(raw, str(path), max_bytes)
    return _check(obj, str(path), size)
