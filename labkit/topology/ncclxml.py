"""Read an NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``) into the same model.

The XML nests ``<cpu numaid= affinity=>`` (a NUMA node), ``<pci busid=>`` (bridges and devices),
``<gpu dev= sm=>`` with ``<nvlink target=busid count=>`` children, and ``<nic>/<net>``.
Labels follow nvidia-smi's meaning: an nvlink element to the peer's bus id -> ``NV<count>``;
otherwise the PCIe path: same bridge -> ``PIX``, deeper common bridge -> ``PXB``, same NUMA node
without a common bridge -> ``NODE`` (the XML does not tell ``PHB`` from ``NODE``: stated as a warning
when it matters), different NUMA nodes -> ``SYS``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from labkit.core.errors import LabkitError
from labkit.topology.model import GPU, NIC, Topology, build

# Compute capability -> a name the bandwidth table knows.
_SM_MODEL = {60: "P100", 70: "V100", 80: "A100", 86: "RTX A6000", 89: "RTX 6000 Ada", 90: "H100", 100: "B200"}


def mask_to_cpulist(mask: str) -> str | None:
    """NCCL/sysfs affinity mask "00000000,00ffffff" -> "0-23"."""
    digits = mask.replace(",", "").strip()
    if not digits or not re.fullmatch(r"[0-9a-fA-F]+", digits):
        return None
    v = int(digits, 16)
    cpus = [i for i in range(v.bit_length()) if v >> i & 1]
    return cpulist(cpus)


def cpulist(cpus: list[int]) -> str | None:
    """[0, 1, 2, 5] -> "0-2,5"."""
    if not cpus:
        return None
    out, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def parse_nccl_xml(text: str, name: str = "<xml>", *, source: str | None = None, gpu_name: str | None = None) -> Topology:
    m = re.search(r"<!--\s*(source:.*?)-->", text, re.S)
    origin = m.group(1).strip() if m else None
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise LabkitError(f"{name}: not well-formed XML ({exc})") from None
    if root.tag != "system":
        raise LabkitError(f"{name}: root element is <{root.tag}>, expected NCCL's <system>")
    warnings: list[str] = []
    gpus_raw: list[dict] = []      # dev, busid, numa, affinity, path (list of pci bus ids), sm, nvlinks
    nics_raw: list[dict] = []

    def walk(el, numa, affinity, path):
        for child in el:
            if child.tag == "pci":
                walk(child, numa, affinity, path + [child.get("busid", "?")])
            elif child.tag == "gpu":
                if child.get("dev") is None:
                    raise LabkitError(f"{name}: a <gpu> element has no dev attribute")
                links = {}
                for nv in child.findall("nvlink"):
                    try:
                        links[nv.get("target", "").lower()] = links.get(nv.get("target", "").lower(), 0) + int(nv.get("count", "1"))
                    except ValueError:
                        raise LabkitError(f"{name}: GPU {child.get('dev')} nvlink count {nv.get('count')!r} is not a number") from None
                gpus_raw.append(dict(dev=int(child.get("dev")), busid=(path[-1] if path else "").lower(), numa=numa,
                                     affinity=affinity, path=path, sm=child.get("sm"), links=links))
            elif child.tag == "nic":
                for net in child.findall("net"):
                    nics_raw.append(dict(name=net.get("name", "net"), numa=numa, path=path))
                walk(child, numa, affinity, path)
            else:
                walk(child, numa, affinity, path)

    for cpu in root.iter("cpu"):
        numa = cpu.get("numaid")
        walk(cpu, int(numa) if numa and numa.isdigit() else None, mask_to_cpulist(cpu.get("affinity", "")), [])
    if not gpus_raw:
        raise LabkitError(f"{name}: no <gpu> elements under <cpu>: not an NCCL topology with GPUs")
    gpus_raw.sort(key=lambda g: g["dev"])
    if [g["dev"] for g in gpus_raw] != list(range(len(gpus_raw))):
        raise LabkitError(f"{name}: GPU dev numbers are {[g['dev'] for g in gpus_raw]}, expected 0..{len(gpus_raw) - 1}")

    def pcie_label(a: dict, b: dict) -> str:
        if a["numa"] != b["numa"]:
            return "SYS"
        common = 0
        for x, y in zip(a["path"][:-1], b["path"][:-1]):
            if x != y:
                break
            common += 1
        if common == 0:
            return "NODE"
        # Both hang below `common` shared bridges: directly under one bridge -> PIX, else PXB.
        return "PIX" if max(len(a["path"]), len(b["path"])) - 1 == common else "PXB"

    n = len(gpus_raw)
    matrix = [["X"] * n for _ in range(n)]
    node_pairs = 0
    for i, a in enumerate(gpus_raw):
        for j, b in enumerate(gpus_raw):
            if i == j:
                continue
            ab, ba = a["links"].get(b["busid"], 0), b["links"].get(a["busid"], 0)
            if ab != ba:
                raise LabkitError(f"{name}: GPU {i} lists {ab} NVLinks to GPU {j}, but GPU {j} lists {ba} back")
            if ab:
                matrix[i][j] = f"NV{ab}"
            else:
                matrix[i][j] = pcie_label(a, b)
                node_pairs += matrix[i][j] == "NODE"
    if node_pairs:
        warnings.append("NCCL XML does not tell PHB from NODE: GPUs in one NUMA node without a shared bridge are labelled NODE")
    sm = {g["sm"] for g in gpus_raw}
    model = gpu_name or None
    if model is None and origin:
        from labkit.topology.smi import _model_from_origin
        model = _model_from_origin(origin)
    if model is None and len(sm) == 1 and (s := next(iter(sm))) and s.isdigit():
        model = _SM_MODEL.get(int(s))
    gpus = [GPU(index=g["dev"], name=None, bus_id=g["busid"] or None, numa=g["numa"], cpu_affinity=g["affinity"])
            for g in gpus_raw]
    nics = [NIC(name=nr["name"], device=nr["name"],
                to_gpus=["SYS" if nr["numa"] != g["numa"] else "NODE" for g in gpus_raw]) for nr in nics_raw]
    return build(source or f"file: {name}", gpus, matrix, nics=nics, warnings=warnings, origin=origin,
                 gpu_model=model, raw_text=text)
