"""One helper turns labkit's dataclasses into JSON; the CLI's --json prints exactly that."""

from __future__ import annotations

import dataclasses
import enum
import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError


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


#: The largest file read when the caller names no limit (a config, a statistics file, a summary).
DEFAULT_READ_LIMIT = 32 << 20

#: JSON nested deeper than this is refused (a real config or statistics file nests a few levels; Python's
#: parser would otherwise recurse until it fails with a RecursionError, or be slow before it does).
MAX_JSON_DEPTH = 200


def _os_error(p: Path, what: str, exc: OSError) -> "Exception":
    """One line for every OS error a user's path can give, naming the path."""
    name = str(p)
    if len(name) > 160:
        name = name[:80] + f"...({len(name)} characters)"
    why = {errno.ENOENT: f"no such {what}", errno.EISDIR: f"is a folder, expected a {what}",
           errno.ENOTDIR: f"not a {what}: a part of the path is not a folder",
           errno.ENAMETOOLONG: "the name is too long for the file system",
           errno.EACCES: f"cannot read the {what} (permission denied)", errno.EPERM: f"cannot read the {what} "
           "(operation not permitted)", errno.ELOOP: "a symbolic link loop (or a link where none is allowed)",
           errno.EIO: f"cannot read the {what} (input/output error)",
           errno.ENXIO: f"not a {what} (no such device)"}.get(exc.errno)
    if why is None:
        why = f"cannot read the {what} ({exc.strerror or type(exc).__name__})"
    return LabkitError(f"{name}: {why}")


def read_bytes(path: str | Path, what: str = "file", *, limit: int | None = None, follow_links: bool = True) -> bytes:
    """Read a user's file, the one way labkit reads any file it is given.

    Only a regular file is read (a FIFO, a device such as ``/dev/zero``, a socket or a folder is refused
    without blocking on it); its size is checked against ``limit`` (default :data:`DEFAULT_READ_LIMIT`)
    before it is read, and no more than ``limit`` bytes are read whatever the file claims (``/proc``
    files report size 0). Every OS error is one :class:`LabkitError` line naming the path.
    ``follow_links=False`` refuses a symbolic link (a folder labkit wrote holds none)."""
    p = Path(path)
    limit = DEFAULT_READ_LIMIT if limit is None else limit
    if not str(path):
        raise LabkitError(f"an empty path given for the {what}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise _os_error(p, what, exc) from None
    except ValueError:  # an embedded NUL
        raise LabkitError(f"{str(p)[:160]!r}: not a usable path (it holds a NUL character)") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise LabkitError(f"{p}: is a folder, expected a {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a character device"
                    if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise LabkitError(f"{p}: is {kind}, expected a regular {what}")
        if st.st_size > limit:
            raise LabkitError(f"{p}: {st.st_size} bytes, more than a {what} can be ({limit} bytes)")
        os.set_blocking(fd, True)
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:
            raise LabkitError(f"{p}: more than {limit} bytes, more than a {what} can be")
        return b"".join(chunks)
    except OSError as exc:
        raise _os_error(p, what, exc) from None
    finally:
        os.close(fd)


def read_text(path: str | Path, what: str = "file", *, limit: int | None = None, follow_links: bool = True,
              errors: str = "strict") -> str:
    """:func:`read_bytes` decoded as UTF-8; bytes that are not UTF-8 are a LabkitError naming the file
    (``errors="replace"`` keeps them as U+FFFD)."""
    raw = read_bytes(path, what, limit=limit, follow_links=follow_links)
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise LabkitError(f"{path}: not a text file (byte {exc.start} is not UTF-8), expected a {what}") from None


def json_depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``text`` nests at most ``limit`` deep (one linear scan; brackets inside strings are skipped)."""
    if text.count("[") + text.count("{") <= limit:
        return True

    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return False
        elif c in "]}":
            depth -= 1
    return True


def parse_json(text: str, name: str, what: str = "JSON") -> Any:
    """``json.loads`` with one LabkitError line for anything wrong: not JSON, nested more than
    :data:`MAX_JSON_DEPTH` deep, NaN/Infinity (not JSON; Python would accept them)."""
    if not json_depth_ok(text):
        raise LabkitError(f"{name}: the {what} nests more than {MAX_JSON_DEPTH} levels deep")

    def no_constant(c: str) -> Any:
        raise ValueError(f"{c} is not a JSON value")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise LabkitError(f"{name}: not valid JSON ({exc})") from None
    except ValueError as exc:
        raise LabkitError(f"{name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise LabkitError(f"{name}: the {what} nests too deeply") from None


def read_json(path: str | Path, what: str = "file", *, limit: int | None = None, follow_links: bool = True) -> Any:
    """Parse a JSON file read by :func:`read_bytes`; a missing, unreadable, too large, too deep or malformed
    file is a LabkitError naming the path."""
    return parse_json(read_text(path, what, limit=limit, follow_links=follow_links), str(path), what)


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=False)


def path_is(path: str | Path, kind: str) -> bool:
    """``Path.exists()`` / ``is_dir()`` / ``is_file()`` that answer False for a path the OS cannot even look
    up (a 5,000-character name, a NUL), instead of raising."""
    try:
        p = Path(path)
        return {"exists": p.exists, "dir": p.is_dir, "file": p.is_file, "link": p.is_symlink}[kind]()
    except (OSError, ValueError):
        return False
