"""What the GPU recording script (``benchmarks/gpu/record_comm.py``) left in ``data/measurements/comm/``."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.comm.bench import BenchResult
from labkit.comm.ddp import BucketSweep
from labkit.comm.dp import ParallelRun
from labkit.comm.levers import AsyncOverlap, BufferReuse, CopyOverlap
from labkit.comm.nominal import NominalLink
from labkit.comm.overhead import LaunchOverhead
from labkit.comm.timeline import Timeline
from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.provenance import describe, load_measurement

KINDS = {
    "collectives": "comm.collectives", "launch_overhead": "comm.launch_overhead", "buckets": "comm.buckets",
    "ddp_timeline": "comm.timeline", "async_overlap": "comm.async_overlap", "buffer_reuse": "comm.buffer_reuse",
    "dp_vs_ddp": "comm.dp_vs_ddp", "pinned_pageable": "comm.pinned_pageable",
}


def comm_dir() -> Path:
    return paths.MEASUREMENTS_DIR / "comm"


def recorded(name: str, folder: str | Path | None = None) -> dict[str, Any] | None:
    """The recorded ``comm_<name>.json`` (provenance, kind, data), or None when it was not recorded."""
    if name not in KINDS:
        raise LabkitError(f"unknown comm recording {name!r}; one of {', '.join(KINDS)}")
    p = Path(folder or comm_dir()) / f"comm_{name}.json"
    if not p.exists():
        return None
    return load_measurement(p, KINDS[name])


def available(folder: str | Path | None = None) -> list[str]:
    return [n for n in KINDS if (Path(folder or comm_dir()) / f"comm_{n}.json").exists()]


# -- typed recordings: the same dataclasses as the live run ------------------------------------------

@dataclass
class Recording:
    """One recording, its data loaded into the chapter's dataclasses (the ones a live run returns)."""

    name: str
    data: Any
    provenance: dict[str, Any]

    @property
    def source(self) -> str:
        return describe(self.provenance)


def _typed(cls, obj):
    """``obj`` (parsed JSON) as an instance of the dataclass ``cls``, nested dataclasses included."""
    if obj is None or not dataclasses.is_dataclass(cls):
        return obj
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            continue
        v, hint = obj[f.name], hints.get(f.name)
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
            v = [_typed(args[0], x) for x in v]
        else:
            inner = next((a for a in args if dataclasses.is_dataclass(a)), hint)
            v = _typed(inner, v) if isinstance(v, dict) and dataclasses.is_dataclass(inner) else v
        kwargs[f.name] = v
    return cls(**kwargs)


def _shapes() -> dict[str, Any]:
    """Per recording: the dataclass of its data, or {key: dataclass} for a dict of them."""
    return {"collectives": {"bench": BenchResult, "nominal_link": NominalLink}, "launch_overhead": {"rows": [LaunchOverhead]},
            "buckets": BucketSweep, "ddp_timeline": {"timeline": Timeline}, "async_overlap": AsyncOverlap,
            "buffer_reuse": BufferReuse, "dp_vs_ddp": {"runs": [ParallelRun]}, "pinned_pageable": CopyOverlap}


def load(name: str, folder: str | Path | None = None) -> Recording | None:
    """The recorded ``comm_<name>.json`` with its data in the chapter's dataclasses, or None when absent."""
    doc = recorded(name, folder)
    if doc is None:
        return None
    shape, data = _shapes()[name], doc["data"]
    if isinstance(shape, dict):
        data = dict(data)
        for key, cls in shape.items():
            if isinstance(cls, list):
                data[key] = [_typed(cls[0], x) for x in data.get(key) or []]
            else:
                data[key] = _typed(cls, data.get(key))
    else:
        data = _typed(shape, data)
    return Recording(name, data, doc["provenance"])
