"""What ``benchmarks/gpu/record_topology.py`` recorded, read back from ``data/measurements/topology/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.core import paths
from labkit.core.provenance import load_measurement
from labkit.topology.measure.results import LinkMeasurements, links_from_json
from labkit.topology.model import GPU, NIC, build
from labkit.topology.p2ptable import P2PTable


def measurements_dir() -> Path:
    return paths.MEASUREMENTS_DIR / "topology"


def recorded_links(folder: str | Path | None = None) -> tuple[LinkMeasurements, dict[str, Any]] | None:
    """(measurements, provenance) from ``links.json``, or None when nothing was recorded."""
    p = Path(folder or measurements_dir()) / "links.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "topology.links")
    return links_from_json(doc["data"]), doc["provenance"]


def recorded_p2p(folder: str | Path | None = None) -> tuple[P2PTable, dict[str, Any]] | None:
    p = Path(folder or measurements_dir()) / "p2p_matrix.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "topology.p2p")
    return P2PTable(**doc["data"]), doc["provenance"]


def recorded_topology_text(folder: str | Path | None = None) -> Path | None:
    p = Path(folder or measurements_dir()) / "nvidia_smi_topo.txt"
    return p if p.exists() else None


def recorded_topology(folder: str | Path | None = None):
    """(Topology, provenance) from ``topology_live.json`` (live NVML discovery on the recording machine),
    or None."""
    p = Path(folder or measurements_dir()) / "topology_live.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "topology.live")
    d = doc["data"]
    topo = build(f"recorded: {d.get('source', 'live')}", [GPU(**g) for g in d["gpus"]], d["matrix"],
                 nics=[NIC(**x) for x in d.get("nics", [])], warnings=d.get("warnings", []), origin=d.get("origin"),
                 gpu_model=d.get("gpu_model"), p2p=d.get("p2p"))
    return topo, doc["provenance"]
