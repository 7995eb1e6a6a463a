"""Topology: read a server's GPU interconnect, map parallel groups onto it, measure the links.

Public API (stable: the memory planner and the comm chapter import these names):

Loading
    ``load_topology(source="live", *, gpu_name=None) -> Topology``: ``"live"`` (NVML, then
    ``nvidia-smi topo -m`` for what NVML cannot tell), a bundled sample name, or a file path.
    ``load_live()``, ``load_sample(name)``, ``load_file(path)``, ``parse_smi_text(text)``,
    ``parse_nccl_xml(text)``, ``list_samples() -> [SampleInfo]``.
    ``load_p2p_table(name_or_path) -> P2PTable``: a saved ``p2pBandwidthLatencyTest`` output.
    Bad input raises ``labkit.core.errors.LabkitError`` naming the line and the problem.

The model
    ``Topology`` (``gpus: [GPU]``, ``matrix`` N x N labels as nvidia-smi prints them, ``nics``,
    ``warnings``, ``generation``), ``GPU`` (index, name, memory_bytes, bus_id, numa, cpu_affinity),
    ``NIC``, ``Link`` (label, kind, nvlinks, bandwidth_Bps, distance).

Per pair (GPU indices a, b)
    ``link(topo, a, b) -> Link``; ``link_label(...) -> "NV12"``; ``link_kind(...) -> "NVLINK" | "PIX" |
    "PXB" | "PHB" | "NODE" | "SYS" | "X"``; ``nominal_bandwidth(...) -> float`` bytes/s per direction
    (sources in ``labkit.topology.links``).

Per group
    ``weakest_link(topo, gpus) -> PairLink | None``; ``ring_bottleneck(topo, gpus)``;
    ``collective_time(topo, gpus, op, nbytes) -> CollectiveEstimate`` (``.time_s``; alpha-beta ring,
    nccl-tests factors from ``labkit.core.collectives``: a model).

Placement
    ``place(topo, tp, pp=1, dp=1, sizes=Sizes(...)) -> Placement`` (groups, ``cuda_visible_devices``,
    per-rank affinity, weakest TP link, naive-vs-placed ``comparison``, ``good``/``verdict``);
    ``evaluate(topo, gpu_of_rank, tp, pp, dp)`` the objective of one mapping; ``nvlink_clique(topo)``.

Measurement (needs a CUDA GPU; parts skip with a reason otherwise; torch imported lazily)
    ``labkit.topology.measure.measure_links(smoke=False) -> LinkMeasurements``;
    ``recorded_links()`` / ``recorded_p2p()`` / ``recorded_topology()`` load what was recorded under
    ``data/measurements/topology/`` (each with its provenance); ``compare_links(m, topo)`` /
    ``compare_p2p(table, topo)`` put measured bandwidth beside the nominal figure of the same link.
"""

from labkit.topology.group_links import (CollectiveEstimate, PairLink, collective_time, link, link_kind, link_label,
                                      nominal_bandwidth, p2p_time, ring_bottleneck, weakest_link)
from labkit.topology.links import KINDS, LEGEND, Generation, Link, generation_for, parse_label
from labkit.topology.load import (SampleInfo, list_samples, load_file, load_live, load_p2p_table, load_sample,
                                  load_topology)
from labkit.topology.model import GPU, NIC, Topology
from labkit.topology.ncclxml import parse_nccl_xml
from labkit.topology.p2ptable import P2PTable, parse_p2p_test
from labkit.topology.placement import Placement, Sizes, evaluate, nvlink_clique, place
from labkit.topology.recorded import recorded_links, recorded_p2p, recorded_topology, recorded_topology_text
from labkit.topology.measured_vs_nominal import LinkComparison, compare_links, compare_p2p
from labkit.topology.smi import parse_smi_text

__all__ = [
    "CollectiveEstimate", "GPU", "Generation", "KINDS", "LEGEND", "Link", "NIC", "P2PTable", "PairLink", "Placement",
    "SampleInfo", "Sizes", "Topology", "collective_time", "evaluate", "generation_for", "link", "link_kind",
    "link_label", "list_samples", "load_file", "load_live", "load_p2p_table", "load_sample", "load_topology",
    "nominal_bandwidth", "nvlink_clique", "p2p_time", "parse_label", "parse_nccl_xml", "parse_p2p_test",
    "parse_smi_text", "place", "recorded_links", "recorded_p2p", "recorded_topology", "recorded_topology_text",
    "ring_bottleneck", "weakest_link", "LinkComparison", "compare_links", "compare_p2p",
]
