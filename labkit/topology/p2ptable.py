"""A GPU-to-GPU bandwidth and latency table like cuda-samples' ``p2pBandwidthLatencyTest``.

One dataclass for both what labkit measures (``labkit.topology.measure``) and what the cuda-samples
tool printed (``parse_p2p_test``). Bandwidths are bytes/s (the tool prints decimal GB/s: it divides
bytes by 1e9), latencies seconds. Keys of the matrices: ``"p2p_off"`` and ``"p2p_on"``.
The diagonal is a copy inside one GPU (as the tool reports it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from labkit.core.errors import LabkitError
from labkit.topology.model import MAX_GPUS


@dataclass
class P2PTable:
    source: str
    gpus: list[str]                                   # GPU names, index order
    can_access: list[list[bool]] | None = None        # peer access possible (cudaDeviceCanAccessPeer)
    uni_Bps: dict[str, list[list[float | None]]] = field(default_factory=dict)
    bi_Bps: dict[str, list[list[float | None]]] = field(default_factory=dict)
    latency_s: dict[str, list[list[float | None]]] = field(default_factory=dict)      # GPU-side
    cpu_latency_s: dict[str, list[list[float | None]]] = field(default_factory=dict)  # CPU-side
    origin: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.gpus)


_SECTIONS = [
    (re.compile(r"^P2P Connectivity Matrix"), ("conn", None, 1)),
    (re.compile(r"^Unidirectional P2P=Disabled Bandwidth"), ("uni", "p2p_off", 1e9)),
    (re.compile(r"^Unidirectional P2P=Enabled Bandwidth"), ("uni", "p2p_on", 1e9)),
    (re.compile(r"^Bidirectional P2P=Disabled Bandwidth"), ("bi", "p2p_off", 1e9)),
    (re.compile(r"^Bidirectional P2P=Enabled Bandwidth"), ("bi", "p2p_on", 1e9)),
    (re.compile(r"^P2P=Disabled Latency"), ("lat", "p2p_off", 1e-6)),
    (re.compile(r"^P2P=Enabled Latency"), ("lat", "p2p_on", 1e-6)),
]
_DEVICE = re.compile(r"^Device:\s*([0-9]{1,9}),\s*(.*?),\s*pciBusID")


def _is_int(tok: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return tok.isascii() and tok.isdigit()


def looks_like_p2p_test(text: str) -> bool:
    return "P2P (Peer-to-Peer) GPU Bandwidth Latency Test" in text or "P2P Connectivity Matrix" in text


def parse_p2p_test(text: str, name: str = "<text>", *, source: str | None = None) -> P2PTable:
    """Parse p2pBandwidthLatencyTest output. Errors name the line and the problem."""
    lines = text.splitlines()
    origin = next((ln.lstrip("#").strip() for ln in lines if ln.startswith("#") and "source:" in ln), None)
    names: dict[int, str] = {}
    seen_at: dict[int, int] = {}
    for no, ln in enumerate(lines, 1):
        m = _DEVICE.match(ln.strip())
        if m:
            dev = int(m.group(1))
            if dev in names:
                raise LabkitError(f"{name} line {no}: device {dev} is listed twice (first on line {seen_at[dev]})")
            names[dev], seen_at[dev] = m.group(2).strip(), no
    if not names:
        raise LabkitError(f"{name}: no 'Device: N, <name>, pciBusID' lines: not p2pBandwidthLatencyTest output")
    n = len(names)
    if n > MAX_GPUS:
        raise LabkitError(f"{name}: {n} devices, more than labkit reads in one table ({MAX_GPUS})")
    if sorted(names) != list(range(n)):
        raise LabkitError(f"{name}: device numbers {sorted(names)} are not 0..{n - 1}")
    t = P2PTable(source=source or f"file: {name}", gpus=[names[i] for i in range(n)], origin=origin)
    current = None
    sub = "gpu"
    for no, ln in enumerate(lines, 1):
        s = ln.strip()
        sec = next((v for rx, v in _SECTIONS if rx.match(s)), None)
        if sec:
            current, sub = sec, "gpu"
            rows: list[list[float]] = []
            continue
        if current is None or not s:
            continue
        toks = s.split()
        if toks[0] in ("D\\D", "GPU", "CPU"):
            sub = "cpu" if toks[0] == "CPU" else "gpu"
            if [int(x) for x in toks[1:] if _is_int(x)] != list(range(n)):
                raise LabkitError(f"{name} line {no}: column header {s!r} does not list devices 0..{n - 1}")
            rows = []
            continue
        if not _is_int(toks[0]):
            current = None
            continue
        try:
            vals = [float(x) for x in toks[1:]]
        except ValueError:
            raise LabkitError(f"{name} line {no}: {s[:80]!r} holds a value that is not a number") from None
        bad = next((x for x, v in zip(toks[1:], vals) if not (math.isfinite(v) and v >= 0)), None)
        if bad is not None:
            raise LabkitError(f"{name} line {no}: row {toks[0]} holds {bad!r}: a bandwidth or latency is a finite "
                              f"number >= 0")
        if int(toks[0]) != len(rows) or len(vals) != n:
            raise LabkitError(f"{name} line {no}: row {toks[0]} has {len(vals)} values, expected row {len(rows)} with {n}")
        kind, key, scale = current
        rows.append([v * scale for v in vals])
        if len(rows) == n:
            if kind == "conn":
                t.can_access = [[bool(v) for v in r] for r in rows]
            elif kind == "uni":
                t.uni_Bps[key] = rows
            elif kind == "bi":
                t.bi_Bps[key] = rows
            elif kind == "lat":
                (t.cpu_latency_s if sub == "cpu" else t.latency_s)[key] = rows
            rows = []
    if not t.uni_Bps and not t.bi_Bps:
        raise LabkitError(f"{name}: no bandwidth matrix found (truncated copy?)")
    for what, d in (("unidirectional", t.uni_Bps), ("bidirectional", t.bi_Bps)):
        for key in ("p2p_off", "p2p_on"):
            if key not in d:
                t.notes.append(f"{what} {key} matrix missing from the text")
    return t
