"""Parse the text of ``nvidia-smi topo -m`` (run live or saved to a file).

Handles the variants seen in real outputs: tab- or space-separated cells (split on any whitespace),
NIC columns and rows named ``NIC#`` (with a ``NIC Legend:`` block naming the device) or ``mlx5_#``,
optional ``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA ID`` columns, the legacy ``SOC`` label
(read as ``SYS``, with a warning), copies without a legend, and copies that lost rows (a missing GPU
row is rebuilt from its column, with a warning, because the matrix is symmetric).

Malformed input raises ``LabkitError`` naming the line and the problem: an unknown label, a row with
the wrong number of cells, an asymmetric matrix, a self link that is not ``X``, a row that is not a
header column. It never returns a matrix it could not check.
"""

from __future__ import annotations

import re

from labkit.core.errors import LabkitError
from labkit.topology.links import parse_label
from labkit.topology.model import GPU, MAX_GPUS, NIC, Topology, build

_GPU = re.compile(r"^GPU([0-9]+)$")
_EXTRA_COLUMNS = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_CPULIST = re.compile(r"^([0-9]+(-[0-9]+)?)(,[0-9]+(-[0-9]+)?)*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _is_label(tok: str) -> bool:
    try:
        parse_label(tok)
        return True
    except LabkitError:
        return False


def _split_header(tokens: list[str], where: str) -> tuple[list[str], list[str]]:
    """Header tokens -> (device column names, extra column names)."""
    devices: list[str] = []
    i = 0
    while i < len(tokens):
        matched = next((c for c in _EXTRA_COLUMNS if tuple(tokens[i:i + len(c)]) == c), None)
        if matched:
            break
        devices.append(tokens[i])
        i += 1
    extras: list[str] = []
    while i < len(tokens):
        matched = next((c for c in _EXTRA_COLUMNS if tuple(tokens[i:i + len(c)]) == c), None)
        if not matched:
            raise LabkitError(f"{where}: header column {tokens[i]!r} after the affinity columns is not understood")
        extras.append(" ".join(matched))
        i += len(matched)
    return devices, extras


def _is_int(v: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return v.isascii() and v.isdigit()


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v is not None and _is_int(v) else None


def parse_smi_text(text: str, name: str = "<text>", *, source: str | None = None,
                   gpu_name: str | None = None) -> Topology:
    """Parse ``nvidia-smi topo -m`` output into a :class:`Topology`.

    ``name`` is used in error messages (a file path or sample name); ``gpu_name`` picks the
    bandwidth table (the text itself names no GPU model)."""
    # A terminal's nvidia-smi underlines the header with ANSI escapes ("\x1b[4mGPU0 ...\x1b[0m").
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    origin = None
    warnings: list[str] = []
    header_at = None
    for no, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("#") and origin is None and "source:" in s:
            origin = s.lstrip("#").strip()
        toks = s.split()
        # The header starts with GPU0 and is not a row: a row's second cell is a link label ("X" for GPU0).
        if toks and toks[0] == "GPU0" and (len(toks) == 1 or not _is_label(toks[1])):
            header_at = no
            break
    if header_at is None:
        raise LabkitError(f"{name}: no header line starting with 'GPU0' found: this is not `nvidia-smi topo -m` output")
    devices, extras = _split_header(lines[header_at - 1].split(), f"{name} line {header_at}")
    gpu_cols = [d for d in devices if _GPU.match(d)]
    for k, d in enumerate(gpu_cols):
        if d != f"GPU{k}":
            raise LabkitError(f"{name} line {header_at}: GPU columns must be GPU0, GPU1, ... in order; found {d!r} at position {k}")
    if devices[:len(gpu_cols)] != gpu_cols:
        raise LabkitError(f"{name} line {header_at}: GPU columns must come before NIC columns")
    if len(set(devices)) != len(devices):
        raise LabkitError(f"{name} line {header_at}: a column name appears twice")
    if len(gpu_cols) > MAX_GPUS:
        raise LabkitError(f"{name} line {header_at}: {len(gpu_cols)} GPU columns, more than labkit reads in one "
                          f"topology ({MAX_GPUS})")
    nic_cols = devices[len(gpu_cols):]
    ndev = len(devices)

    rows: dict[str, tuple[int, list[str], list[str]]] = {}
    nic_legend: dict[str, str] = {}
    in_legend = False
    legacy_soc = False
    for no in range(header_at + 1, len(lines) + 1):
        line = lines[no - 1]
        s = line.strip()
        if not s:
            continue
        if s.startswith("Legend") or s.startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = _NIC_LEGEND.match(line)
            if m:
                nic_legend[m.group(1)] = m.group(2)
            elif s.startswith("SOC"):
                legacy_soc = True
            continue
        toks = s.split()
        head = toks[0]
        if head not in devices:
            if _GPU.match(head) or head.startswith(("NIC", "mlx5")):
                raise LabkitError(f"{name} line {no}: row {head!r} is not a column of the header (line {header_at})")
            raise LabkitError(f"{name} line {no}: cannot read {s[:60]!r} as a row of the link matrix")
        if head in rows:
            raise LabkitError(f"{name} line {no}: row {head} appears twice (first on line {rows[head][0]})")
        cells = toks[1:]
        if len(cells) < ndev:
            raise LabkitError(f"{name} line {no}: row {head} has {len(cells)} cells, expected {ndev} link labels "
                              f"(columns {' '.join(devices)}): a truncated or hand-edited row")
        labels = [c.upper() for c in cells[:ndev]]
        for col, lab in zip(devices, labels):
            try:
                kind, _ = parse_label(lab)
            except LabkitError as exc:
                raise LabkitError(f"{name} line {no}: row {head}, column {col}: {exc}") from None
            if lab == "SOC":
                legacy_soc = True
        rest = cells[ndev:]
        if _GPU.match(head):
            if len(rest) > len(extras):
                raise LabkitError(f"{name} line {no}: row {head} has {len(cells)} cells, more than the header's "
                                  f"{ndev} link columns and {len(extras)} affinity columns")
        rows[head] = (no, ["SYS" if lab == "SOC" else lab for lab in labels], rest)

    if legacy_soc:
        warnings.append("legacy 'SOC' label (drivers before 384) read as 'SYS': across the inter-socket link")

    # GPU rows: rebuild a missing one from its column when every other row is present.
    n = len(gpu_cols)
    matrix: list[list[str] | None] = [None] * n
    for k, g in enumerate(gpu_cols):
        if g in rows:
            matrix[k] = rows[g][1][:n]
    missing = [k for k in range(n) if matrix[k] is None]
    if missing:
        if len(missing) > 1 or len(missing) == n:
            raise LabkitError(f"{name}: GPU rows {', '.join(gpu_cols[k] for k in missing)} are missing (truncated copy): "
                              f"their links to each other are unknown")
        k = missing[0]
        matrix[k] = [("X" if j == k else matrix[j][k]) for j in range(n)]
        warnings.append(f"row GPU{k} is missing (truncated copy): rebuilt from column GPU{k} of the other rows")
    full: list[list[str]] = [r for r in matrix if r is not None]

    for i in range(n):
        li = rows[gpu_cols[i]][0] if gpu_cols[i] in rows else None
        if full[i][i] != "X":
            raise LabkitError(f"{name} line {li}: GPU{i}'s link to itself is {full[i][i]!r}, expected 'X'")
        for j in range(n):
            if i != j and full[i][j] == "X":
                raise LabkitError(f"{name} line {li}: GPU{i} -> GPU{j} is 'X' (self) but they are different GPUs")
            if j > i and full[i][j] != full[j][i]:
                lj = rows[gpu_cols[j]][0] if gpu_cols[j] in rows else None
                raise LabkitError(f"{name}: asymmetric matrix: GPU{i} -> GPU{j} is {full[i][j]} (line {li}) but "
                                  f"GPU{j} -> GPU{i} is {full[j][i]} (line {lj})")

    gpus: list[GPU] = []
    for k in range(n):
        rest = rows[gpu_cols[k]][2] if gpu_cols[k] in rows else []
        vals: dict[str, str] = {}
        if rest and len(rest) == len(extras):
            vals = dict(zip(extras, rest))
        elif rest or (extras and gpu_cols[k] in rows):
            lineno = rows[gpu_cols[k]][0]
            if len(rest) < len(extras) and rest:
                # Fill from the left only where the cells still look like what the column holds.
                vals = dict(zip(extras, rest))
                warnings.append(f"line {lineno}: GPU{k} has {len(rest)} of {len(extras)} affinity cells "
                                f"({', '.join(extras)}): read from the left")
            elif not rest:
                warnings.append(f"line {lineno}: GPU{k} has no affinity cells: CPU/NUMA affinity unknown")
        cpu = vals.get("CPU Affinity")
        if cpu is not None and not _CPULIST.match(cpu):
            if cpu.upper() != "N/A":
                raise LabkitError(f"{name} line {rows[gpu_cols[k]][0]}: GPU{k} CPU Affinity {cpu!r} is not a CPU list like 0-31,64-95")
            cpu = None
        numa_s = vals.get("NUMA Affinity")
        if numa_s is not None and not (_is_int(numa_s) or numa_s.upper() == "N/A" or re.match(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$", numa_s)):
            raise LabkitError(f"{name} line {rows[gpu_cols[k]][0]}: GPU{k} NUMA Affinity {numa_s!r} is not a node number")
        gpus.append(GPU(index=k, numa=_int_or_none(numa_s), cpu_affinity=cpu,
                        gpu_numa_id=_int_or_none(vals.get("GPU NUMA ID"))))
    if "NUMA Affinity" not in extras and any(g.cpu_affinity for g in gpus):
        # Older drivers print only CPU Affinity: GPUs with the same CPU list share a NUMA node.
        groups: dict[str, int] = {}
        for g in gpus:
            if g.cpu_affinity:
                g.numa = groups.setdefault(g.cpu_affinity, len(groups))
        if len(groups) > 0:
            warnings.append("no NUMA Affinity column: NUMA nodes numbered by distinct CPU Affinity lists")

    nics: list[NIC] = []
    for c, nic in enumerate(nic_cols, start=n):
        col = [full_row_cell(rows, gpu_cols, g, c) for g in range(n)]
        if nic in rows:
            no, labs, _ = rows[nic]
            for g in range(n):
                if col[g] is not None and labs[g] != col[g]:
                    raise LabkitError(f"{name} line {no}: {nic} -> GPU{g} is {labs[g]} but GPU{g} -> {nic} is {col[g]}")
                if labs[g] == "X":
                    raise LabkitError(f"{name} line {no}: {nic} -> GPU{g} is 'X' (self)")
            to = labs[:n]
        else:
            if any(v is None for v in col):
                raise LabkitError(f"{name}: NIC {nic} has neither a row nor a full column")
            to = [v for v in col if v is not None]
            warnings.append(f"row {nic} is missing (truncated copy): its GPU links read from column {nic}")
        if nic_legend and nic.startswith("NIC") and nic not in nic_legend:
            warnings.append(f"{nic} is not named in the NIC Legend")
        nics.append(NIC(name=nic, device=nic_legend.get(nic, nic if not nic.startswith("NIC") else None), to_gpus=to))
    if nic_cols and any(c.startswith("NIC") for c in nic_cols) and not nic_legend:
        warnings.append("NIC columns but no 'NIC Legend' block: NIC device names unknown")

    return build(source or f"file: {name}", gpus, full, nics=nics, warnings=warnings, origin=origin,
                 gpu_model=gpu_name or _model_from_origin(origin), raw_text=text)


def full_row_cell(rows, gpu_cols, g: int, c: int) -> str | None:
    r = rows.get(gpu_cols[g])
    return r[1][c] if r else None


# GPU models named in a saved file's '# source:' line ("8x A100 PCIe ..."), used for the bandwidth table.
_MODEL_HINTS = (r"B200|B300|GH200|H200|H100|H800|A100|A800|A30\b|A40\b|V100|P100|RTX 6000 Ada|RTX 4090|RTX 3090|"
                r"RTX A6000|L40S?|K80")


def _model_from_origin(origin: str | None) -> str | None:
    if not origin:
        return None
    m = re.search(_MODEL_HINTS, origin, re.I)
    return m.group(0) if m else None
