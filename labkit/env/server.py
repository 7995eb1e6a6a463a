"""Which machine a notebook describes: this one (live) or the recorded GPU server."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.errors import LabkitError
from labkit.core.machine import MachineInfo, probe
from labkit.core.provenance import describe
from labkit.env.summary import load_recorded_machine

SOURCES = ("auto", "live", "recorded")


@dataclass
class ServerView:
    machine: MachineInfo
    live: bool
    origin: str  # 'measured here' or 'recorded on ...'
    provenance: dict | None = None

    @property
    def label(self) -> str:
        """A short source label for figure titles."""
        if self.live:
            return "measured here"
        p = self.provenance or {}
        return f"recorded on {p.get('gpu_name')}, {str(p.get('date'))[:10]}"


def this_server(source: str = "auto") -> ServerView:
    """``auto``: live when this machine has an NVIDIA GPU, else the recorded GPU server."""
    if source not in SOURCES:
        raise LabkitError(f"source={source!r}: expected one of {', '.join(SOURCES)}")
    if source in ("auto", "live"):
        m = probe()
        if m.gpus or source == "live":
            return ServerView(m, True, "measured here")

    m, prov = load_recorded_machine()
    return ServerView(m, False, describe(prov), prov)
