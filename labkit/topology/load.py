"""Load a topology from this server (live), a saved file, or a bundled sample in ``data/topologies/``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.serialize import path_is, read_bytes
from labkit.topology.model import Topology
from labkit.topology.ncclxml import parse_nccl_xml
from labkit.topology.p2ptable import P2PTable, looks_like_p2p_test, parse_p2p_test
from labkit.topology.smi import parse_smi_text

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

MAX_FILE_BYTES = 8 << 20  # 8 MiB: a 512-GPU nvidia-smi matrix is about 2 MiB
SMI, NCCL_XML, P2P_TEST = "nvidia-smi topo -m", "NCCL topology XML", "p2pBandwidthLatencyTest output"


@dataclass
class SampleInfo:
    name: str
    path: str
    format: str        # SMI, NCCL_XML or P2P_TEST
    origin: str | None  # its '# source:' line


def _read(path: Path) -> str:
    data = read_bytes(path, "topology file", limit=MAX_FILE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise LabkitError(f"{path}: not a text file (not UTF-8)") from None


def detect_format(text: str) -> str:
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).lstrip()
    if body.startswith("<"):
        return NCCL_XML
    if looks_like_p2p_test(text):
        return P2P_TEST
    return SMI


def _origin(text: str) -> str | None:
    m = re.search(r"source:\s*(.*?)(?:-->|$)", text, re.M)
    return m.group(1).strip() if m else None


def list_samples() -> list[SampleInfo]:
    """The bundled samples (name = file name without extension), with format and source line."""
    out = []
    for p in sorted(paths.TOPOLOGIES_DIR.glob("*")):
        if p.is_file() and p.suffix in (".txt", ".xml"):
            text = _read(p)
            out.append(SampleInfo(name=p.stem, path=str(p), format=detect_format(text), origin=_origin(text)))
    return out


def sample_path(name: str) -> Path:
    for s in list_samples():
        if s.name == name:
            return Path(s.path)
    names = ", ".join(s.name for s in list_samples())
    raise LabkitError(f"no topology sample named {name!r}; samples: {names}")


def parse_text(text: str, name: str, *, source: str | None = None, gpu_name: str | None = None) -> Topology:
    fmt = detect_format(text)
    if fmt == NCCL_XML:
        return parse_nccl_xml(text, name, source=source, gpu_name=gpu_name)
    if fmt == P2P_TEST:
        raise LabkitError(f"{name}: is {P2P_TEST}: measured bandwidth with no link labels, not a topology; "
                          f"read it with labkit.topology.load_p2p_table")
    return parse_smi_text(text, name, source=source, gpu_name=gpu_name)


def load_file(path: str | Path, *, gpu_name: str | None = None) -> Topology:
    """``nvidia-smi topo -m`` text or an NCCL topology XML saved in a file."""
    p = Path(path)
    return parse_text(_read(p), str(p), source=f"file: {p}", gpu_name=gpu_name)


def load_sample(name: str, *, gpu_name: str | None = None) -> Topology:
    p = sample_path(name)
    return parse_text(_read(p), name, source=f"sample: {name}", gpu_name=gpu_name)


def load_live(*, use_smi: bool = True) -> Topology:
    from labkit.topology.live import nvml_topology

    return nvml_topology(use_smi=use_smi)


def load_topology(source: str = "live", *, gpu_name: str | None = None) -> Topology:
    """``"live"`` (this server, NVML), a sample name, or a path to a saved file."""
    if source == "live":
        return load_live()
    if any(s.name == source for s in list_samples()):
        return load_sample(source, gpu_name=gpu_name)

    if path_is(source, "exists") or path_is(source, "link") or "/" in source:
        return load_file(source, gpu_name=gpu_name)   # a path: its own error names what is wrong with it
    names = ", ".join(s.name for s in list_samples())
    shown = source if len(source) <= 120 else source[:80] + f"...({len(source)} characters)"
    raise LabkitError(f"topology source {shown!r} is neither 'live', a sample ({names}) nor an existing file")


def load_p2p_table(source: str | Path) -> P2PTable:
    """A p2pBandwidthLatencyTest output: a sample name or a file path."""
    if any(s.name == str(source) for s in list_samples()):
        p, src = sample_path(str(source)), f"sample: {source}"
    else:
        p, src = Path(source), f"file: {source}"
    return parse_p2p_test(_read(p), str(source), source=src)
