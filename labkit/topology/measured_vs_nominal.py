"""Measured link bandwidth beside the nominal figure of the same link."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.units import fmt_bytes
from labkit.topology.links import Generation
from labkit.topology.measure.results import LinkMeasurements
from labkit.topology.model import Topology
from labkit.topology.p2ptable import P2PTable


@dataclass
class LinkComparison:
    what: str
    nominal_Bps: float | None     # per direction (bidirectional rows: both directions together)
    measured_Bps: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if not self.nominal_Bps or self.measured_Bps is None:
            return None
        return self.measured_Bps / self.nominal_Bps


def _size(r) -> str:
    return f"median at {fmt_bytes(r.largest.size_bytes)}"


def _pcie_nominal(topo: Topology | None, gen: Generation | None) -> tuple[float | None, str]:
    g = topo.generation if topo is not None else gen
    if g is None:
        return None, ""
    return g.pcie_Bps, f"PCIe Gen{g.pcie_gen} x{g.pcie_width}"


def compare_links(m: LinkMeasurements, topo: Topology | None = None, gen: Generation | None = None) -> list[LinkComparison]:
    """Host<->device (at the largest size measured) against the GPU's PCIe link, device copies (no nominal figure
    here: HBM bandwidth is not in the table), GPU pairs against their link (P2P on)."""
    rows: list[LinkComparison] = []
    nominal, pcie = _pcie_nominal(topo, gen)
    for r in m.device_copy:
        rows.append(LinkComparison(f"GPU{r.gpu} device copy", None, r.largest.bytes_per_s,
                                   f"{_size(r)}; bytes copied per second (memory traffic is 2x)"))
    for r in m.host:
        rows.append(LinkComparison(f"GPU{r.gpu} {r.what} {r.memory}", nominal, r.largest.bytes_per_s,
                                   f"{_size(r)}; nominal {pcie}"))
    for r in m.numa:
        rows.append(LinkComparison(f"GPU{r.gpu} {r.what} {r.memory}, CPU+memory on NUMA node {r.numa_node}",
                                   nominal, r.largest.bytes_per_s, f"{_size(r)}; {r.note}"))
    if m.p2p is not None:
        rows += compare_p2p(m.p2p, topo, gen)
    return rows


def compare_p2p(t: P2PTable, topo: Topology | None = None, gen: Generation | None = None) -> list[LinkComparison]:
    rows = []
    pcie_nominal, pcie = _pcie_nominal(topo, gen)
    for i in range(t.n):
        for j in range(t.n):
            if i == j:
                continue
            if topo is not None and max(i, j) < topo.n:
                lk = topo.link(i, j)
                nominal, note = lk.bandwidth_Bps, f"{lk.label} nominal"
            else:
                nominal, note = pcie_nominal, f"{pcie} nominal (no link label in the source)"
            for mode in ("p2p_on", "p2p_off"):
                u = t.uni_Bps.get(mode)
                b = t.bi_Bps.get(mode)
                if u and u[i][j] is not None:
                    rows.append(LinkComparison(f"GPU{i}->GPU{j} {mode.replace('_', ' ')}", nominal, u[i][j], note))
                if b and b[i][j] is not None and i < j:
                    rows.append(LinkComparison(f"GPU{i}<->GPU{j} bidirectional {mode.replace('_', ' ')}",
                                               None if nominal is None else 2 * nominal, b[i][j], note + " x 2"))
    return rows
