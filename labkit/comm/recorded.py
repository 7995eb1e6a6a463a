"""What the GPU recording script (``benchmarks/gpu/record_comm.py``) left in ``data/measurements/comm/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.core import paths
from labkit.core.provenance import load_measurement

KINDS = {
    "collectives": "comm.collectives", "launch_overhead": "comm.launch_overhead", "buckets": "comm.buckets",
    "ddp_timeline": "comm.timeline", "async_overlap": "comm.async_overlap", "buffer_reuse": "comm.buffer_reuse",
    "dp_vs_ddp": "comm.dp_vs_ddp", "pinned_pageable": "comm.pinned_pageable",
}


def comm_dir() -> Path:
    return paths.MEASUREMENTS_DIR / "comm"


def recorded(name: str, folder: str | Path | None = None) -> dict[str, Any] | None:
    """The recorded ``comm_<name>.json`` (provenance, kind, data), or None when it was not recorded."""
    from labkit.core.errors import LabkitError

    if name not in KINDS:
        raise LabkitError(f"unknown comm recording {name!r}; one of {', '.join(KINDS)}")
    p = Path(folder or comm_dir()) / f"comm_{name}.json"
    if not p.exists():
        return None
    return load_measurement(p, KINDS[name])


def available(folder: str | Path | None = None) -> list[str]:
    return [n for n in KINDS if (Path(folder or comm_dir()) / f"comm_{n}.json").exists()]
