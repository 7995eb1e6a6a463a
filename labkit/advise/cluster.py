"""The machine ``advise`` plans for: a topology (live, file or sample) repeated over identical
nodes, or identical GPUs on NVSwitch when no topology is given; and the cluster the planner uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import labkit.topology as T
from labkit.advise.request import MachineSource
from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes
from labkit.memory.estimate.planner import cluster_from_topology, nic_400g, nvswitch_nvlink4, uniform_cluster

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


@dataclass
class Machine:
    name: str
    gpus: int
    gpus_per_node: int
    nodes: int
    gpu_memory_bytes: int
    topology: object | None              # labkit.topology.Topology of one node, or None
    cluster: object                      # labkit.memory.estimate.planner.Cluster
    source: str
    margin: float = 0.10                 # memory kept free on every GPU
    notes: list[str] = field(default_factory=list)


def resolve(src: MachineSource) -> Machine:

    notes: list[str] = []
    topo = None
    if src.live or src.file or src.sample:
        if src.live:
            topo, where = T.load_topology("live"), "measured here: NVML and nvidia-smi topo -m"
        elif src.file:
            topo, where = T.load_file(src.file), f"file: {src.file}"
        else:
            topo, where = T.load_sample(src.sample), f"sample: {src.sample}"
        per_node = len(topo.gpus)
        if per_node < 1:
            raise LabkitError(f"{where}: the topology has no GPUs")
        nodes = src.nodes
        total = per_node * nodes
        if src.gpus is not None and src.gpus != total:
            raise LabkitError(f"--gpus {src.gpus} contradicts the topology: {nodes} node(s) x {per_node} GPUs = "
                              f"{total}; give --nodes or leave --gpus out")
        mem = src.gpu_memory_bytes or next((g.memory_bytes for g in topo.gpus if g.memory_bytes), None)
        if not mem:
            raise LabkitError(f"{where}: the topology does not say the GPU memory; give --gpu-memory")
        cluster = cluster_from_topology(topo, nodes=nodes, gpu_memory_bytes=int(mem))
        name = f"{nodes} x {per_node}-GPU node ({where}), {fmt_bytes(int(mem))} per GPU"
        if nodes > 1:
            notes.append("nodes are assumed identical, one 400 Gb/s NIC per GPU between them (model)")
        return Machine(name, total, per_node, nodes, int(mem), topo, cluster, where, src.margin, notes)
    total = src.gpus or 1
    if src.nodes > 1:
        per_node = total // src.nodes
    else:  # one node of up to 8 GPUs, else nodes of 8 (the usual server)
        per_node = total if total <= 8 else 8
        if total % per_node:
            raise LabkitError(f"--gpus {total}: more than 8 GPUs must be whole nodes of 8, or give --nodes")
    if per_node > 8:
        raise LabkitError(f"--gpus {total} on {src.nodes} node(s) is {per_node} GPUs per node; at most 8 per "
                          "node without a topology")
    nodes = total // per_node
    cluster = uniform_cluster(f"{total} GPUs", total, per_node, src.gpu_memory_bytes,
                              nvswitch_nvlink4("NVLink4 through NVSwitch (assumed)"),
                              nic_400g("400 Gb/s NIC per GPU (assumed)"),
                              source="no topology given: NVSwitch inside a node, 400 Gb/s NIC per GPU (assumed)")
    notes.append("no topology given: GPUs inside a node assumed all on NVSwitch (NVLink4 figures)")
    return Machine(f"{nodes} x {per_node} GPUs, {fmt_bytes(src.gpu_memory_bytes)} per GPU", total, per_node, nodes,
                   src.gpu_memory_bytes, None, cluster, "given: --gpus and --gpu-memory", src.margin, notes)
