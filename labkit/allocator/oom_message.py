"""Parse PyTorch's CUDA out-of-memory message (current and older formats) into numbers.

Current format (``DeviceCachingAllocator::malloc``)::

    CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which
    131.02 GiB is free. [Process 123 has 86.00 GiB memory in use. ] Including non-PyTorch memory, this
    process has 8.78 GiB memory in use. [6.00 GiB allowed; ]Of the allocated memory 100.00 MiB is
    allocated by PyTorch, and 4.90 GiB is reserved by PyTorch but unallocated. ...

Older format (torch <= 2.0): ``Tried to allocate X (GPU 0; T total capacity; A already allocated;
F free; R reserved in total by PyTorch)``. Sizes are printed by ``format_size`` (bytes, KiB, MiB,
GiB with two decimals), so parsed values are accurate to about 0.5%.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes

_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(bytes|B|KiB|MiB|GiB|TiB)"


def _b(num: str, unit: str) -> int:
    return int(round(float(num) * _UNITS[unit]))


@dataclass
class OOMMessage:
    """Numbers from one OOM message (bytes; None where the message did not say)."""

    request_bytes: int
    device: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allowed_bytes: int | None = None
    this_process_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    private_pool_bytes: int | None = None
    other_processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    format: str = "current"

    @property
    def reserved_bytes(self) -> int | None:
        if self.allocated_bytes is None or self.reserved_unallocated_bytes is None:
            return None
        return self.allocated_bytes + self.reserved_unallocated_bytes

    @property
    def limit_bytes(self) -> int | None:
        """What this process may use: the memory fraction if set, else the device's capacity."""
        return self.allowed_bytes if self.allowed_bytes is not None else self.total_bytes


def parse_oom_message(text: str, *, source: str = "OOM message") -> OOMMessage:
    t = " ".join(text.split())
    m = re.search(r"Tried to allocate " + _SIZE, t)
    if not m or "out of memory" not in t:
        raise LabkitError(f"{source}: not a PyTorch CUDA out-of-memory message (expected 'CUDA out of memory. "
                          "Tried to allocate ...')")
    msg = OOMMessage(request_bytes=_b(*m.groups()))
    m = re.search(r"GPU (\d+) has a total capacity of " + _SIZE + r" of which " + _SIZE + " is free", t)
    if m:
        msg.device = int(m.group(1))
        msg.total_bytes = _b(m.group(2), m.group(3))
        msg.free_bytes = _b(m.group(4), m.group(5))
    for pm in re.finditer(r"Process (\d+) has " + _SIZE + " memory in use", t):
        msg.other_processes.append((int(pm.group(1)), _b(pm.group(2), pm.group(3))))
    m = re.search(r"this process has " + _SIZE + " memory in use", t)
    if m:
        msg.this_process_bytes = _b(*m.groups())
    m = re.search(_SIZE + r" allowed;", t)
    if m:
        msg.allowed_bytes = _b(*m.groups())
    m = re.search(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:with " + _SIZE +
                  r" allocated in private pools \(e\.g\., CUDA Graphs\), )?and " + _SIZE +
                  r" is reserved by PyTorch but unallocated", t)
    if m:
        msg.allocated_bytes = _b(m.group(1), m.group(2))
        if m.group(3):
            msg.private_pool_bytes = _b(m.group(3), m.group(4))
        msg.reserved_unallocated_bytes = _b(m.group(5), m.group(6))
        return _consistent(msg, source)
    m = re.search(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE +
                  r" free; (?:" + _SIZE + r" allowed; )?" + _SIZE + r" reserved in total by PyTorch\)", t)
    if m:
        g = m.groups()
        msg.format = "legacy"
        msg.device = int(g[0])
        msg.total_bytes = _b(g[1], g[2])
        msg.allocated_bytes = _b(g[3], g[4])
        msg.free_bytes = _b(g[5], g[6])
        if g[7]:
            msg.allowed_bytes = _b(g[7], g[8])
        msg.reserved_unallocated_bytes = _b(g[9], g[10]) - msg.allocated_bytes
        return _consistent(msg, source)
    if msg.total_bytes is None:
        raise LabkitError(f"{source}: an OOM message, but without the capacity/allocated figures this lab reads "
                          "(was it cut short?)")
    return _consistent(msg, source)


def _tol(x: int) -> int:
    """Printed sizes carry two decimals: half a unit of the last digit, at most ~0.5%."""
    return int(0.006 * x) + 1024 * 1024


def _consistent(msg: OOMMessage, source: str) -> OOMMessage:
    """Refuse a message whose figures contradict one another (edited by hand, or two messages mixed)."""
    T, F = msg.total_bytes, msg.free_bytes
    problems = []
    if T is not None and F is not None and F > T + _tol(T):
        problems.append(f"{fmt_bytes(F)} free is more than the total capacity {fmt_bytes(T)}")
    if T is not None and msg.allowed_bytes is not None and msg.allowed_bytes > T + _tol(T):
        problems.append(f"{fmt_bytes(msg.allowed_bytes)} allowed is more than the total capacity {fmt_bytes(T)}")
    if msg.reserved_unallocated_bytes is not None and msg.reserved_unallocated_bytes < 0:
        problems.append("reserved in total is less than already allocated")
    res = msg.reserved_bytes
    if res is not None and msg.this_process_bytes is not None and res > msg.this_process_bytes + _tol(res):
        problems.append(f"PyTorch's reserved {fmt_bytes(res)} is more than all of this process's memory "
                        f"{fmt_bytes(msg.this_process_bytes)}")
    if T is not None and F is not None:
        used = (msg.this_process_bytes or res or 0) + sum(b for _, b in msg.other_processes)
        if used + F > T + _tol(T) + _tol(used):
            problems.append(f"in use {fmt_bytes(used)} + free {fmt_bytes(F)} is more than the capacity {fmt_bytes(T)}")
    if problems:
        raise LabkitError(f"{source}: the message contradicts itself ({'; '.join(problems)}): was it edited or "
                          "pieced together from two errors?")
    return msg
