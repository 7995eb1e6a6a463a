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
from labkit.topology.model import GPU, MAX_GPUS, NIC, Topology, build
from labkit.topology.smi import _model_from_origin

# Compute capability -> a name the bandwidth table knows.
_SM_MODEL = {60: "P100", 70: "V100", 80: "A100", 86: "RTX A6000", 89: "RTX 6000 Ada", 90: "H100", 100: "B200"}


MAX_MASK_HEX_DIGITS = 4096   # 16,384 CPUs: the longest affinity mask read
MAX_DEPTH = 10_000           # PCIe bridges above one device (a real machine has a few)
MAX_PATH_TOTAL = 20_000      # bridges on all GPUs' paths together: bounds the pairwise path comparisons


def mask_to_cpulist(mask: str) -> str | None:
    """NCCL/sysfs affinity mask "00000000,00ffffff" -> "0-23" (None when it is not a mask or too long)."""
    digits = mask.replace(",", "").strip()
    if not digits or len(digits) > MAX_MASK_HEX_DIGITS or not re.fullmatch(r"[0-9a-fA-F]+", digits):
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

    def number(el, attr: str, what: str, default: str | None = None) -> int:
        v = el.get(attr, default)
        if v is None:
            raise LabkitError(f"{name}: {what} has no {attr} attribute")
        v = v.strip()
        if not (v.isascii() and v.isdigit() and len(v) <= 9):
            raise LabkitError(f"{name}: {what} {attr}={v[:40]!r} is not a non-negative integer")
        return int(v)

    def gpu(el, numa, affinity, path) -> None:
        dev = number(el, "dev", "a <gpu> element")
        links: dict[str, int] = {}
        for nv in el.findall("nvlink"):
            target = nv.get("target", "").lower()
            count = number(nv, "count", f"GPU {dev}'s <nvlink target={target[:40]!r}>", default="1")
            links[target] = links.get(target, 0) + count
        gpus_raw.append(dict(dev=dev, busid=(path[-1] if path else "").lower(), numa=numa, affinity=affinity,
                             path=path, sm=el.get("sm"), links=links))

    path_total = 0

    def materialise(node) -> list[str]:
        """A path kept as linked (busid, parent, depth) nodes, as a list (the work bounded by MAX_PATH_TOTAL)."""
        nonlocal path_total
        out = []
        while node is not None:
            out.append(node[0])
            node = node[1]
        path_total += len(out)
        if path_total > MAX_PATH_TOTAL:
            raise LabkitError(f"{name}: the GPUs' PCIe paths hold more than {MAX_PATH_TOTAL} bridges in all: not a "
                              "machine's topology")
        return out[::-1]

    # One depth-first pass without recursion (a file may nest elements deeper than Python's stack), linear in the
    # file: each element is visited once, a path is shared with its parent's; the nearest <cpu> gives the NUMA node.
    todo = [(child, None, None, None, False) for child in reversed(list(root))]
    while todo:
        el, node, numa, affinity, in_cpu = todo.pop()
        depth = node[2] if node is not None else 0
        if el.tag == "cpu":
            v = el.get("numaid")
            numa, affinity, in_cpu = (int(v) if v and v.isascii() and v.isdigit() and len(v) <= 9 else None,
                                      mask_to_cpulist(el.get("affinity", "")), True)
        elif in_cpu and el.tag == "gpu":
            gpu(el, numa, affinity, materialise(node))
            continue
        elif in_cpu and el.tag == "nic":
            nics_raw.extend(dict(name=net.get("name", "net"), numa=numa) for net in el.findall("net"))
        elif el.tag == "pci":
            if depth >= MAX_DEPTH:
                raise LabkitError(f"{name}: <pci> elements nested more than {MAX_DEPTH} deep: not a machine's topology")
            node = (el.get("busid", "?"), node, depth + 1)
        todo.extend((child, node, numa, affinity, in_cpu) for child in reversed(list(el)))
    if not gpus_raw:
        raise LabkitError(f"{name}: no <gpu> elements under <cpu>: not an NCCL topology with GPUs")
    if len(gpus_raw) > MAX_GPUS:
        raise LabkitError(f"{name}: {len(gpus_raw)} <gpu> elements, more than labkit reads in one topology ({MAX_GPUS})")
    gpus_raw.sort(key=lambda g: g["dev"])
    devs = [g["dev"] for g in gpus_raw]
    if devs != list(range(len(gpus_raw))):
        twice = sorted({d for d in devs if devs.count(d) > 1})
        raise LabkitError(f"{name}: GPU dev number {twice[0]} appears twice" if twice else
                          f"{name}: GPU dev numbers are {devs[:16]}{' ...' if len(devs) > 16 else ''}, "
                          f"expected 0..{len(gpus_raw) - 1}")

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
        model = _model_from_origin(origin)
    if model is None and len(sm) == 1 and (s := next(iter(sm))) and s.isdigit():
        model = _SM_MODEL.get(int(s))
    gpus = [GPU(index=g["dev"], name=None, bus_id=g["busid"] or None, numa=g["numa"], cpu_affinity=g["affinity"])
            for g in gpus_raw]
    nics = [NIC(name=nr["name"], device=nr["name"],
                to_gpus=["SYS" if nr["numa"] != g["numa"] else "NODE" for g in gpus_raw]) for nr in nics_raw]
    return build(source or f"file: {name}", gpus, matrix, nics=nics, warnings=warnings, origin=origin,
                 gpu_model=model, raw_text=text)
