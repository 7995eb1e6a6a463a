"""Record this server's topology and link measurements (chapter: topology).

    PYTHONPATH=. python3 benchmarks/gpu/record_topology.py --out DIR [--smoke]

Writes into DIR (each JSON through labkit.core.provenance.write_measurement):
  topology_live.json    live NVML discovery (GPUs, NUMA, CPU affinity, link matrix, P2P status)
  nvidia_smi_topo.txt   raw `nvidia-smi topo -m` text with a '# source: measured live on ...' line
                        (becomes a sample in data/topologies/)
  links.json            device copy, host<->device pageable/pinned, NUMA-bound host<->device
  p2p_matrix.json       GPU-to-GPU bandwidth/latency matrices, P2P off/on (2+ GPUs)
Parts that cannot run are skipped with a printed reason. Budget: about 90 s on 2 x H200.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

from labkit.core.errors import LabkitError
from labkit.core.provenance import format_header, header, utc_now, write_measurement


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the results")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a dry run)")
    a = ap.parse_args(argv)
    # torch's GPU numbering = NVML's = nvidia-smi's (before CUDA starts; children inherit it).
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python3 benchmarks/gpu/record_topology.py " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    prov = header(command)
    log(format_header(prov))

    # 1. live discovery
    from labkit.topology.live import smi_topo_text
    from labkit.topology.load import load_live

    try:
        topo = load_live()
        log(f"live topology: {topo.describe()}")
        for w in topo.warnings:
            log(f"  warning: {w}")
        write_measurement(out / "topology_live.json", "topology.live", topo, provenance=prov)
    except LabkitError as exc:
        log(f"skipped live topology: {exc}")

    text, why = smi_topo_text()
    if text is None:
        log(f"skipped nvidia-smi topo -m text: {why}")
    else:
        gpu = f"{prov['gpu_count']} x {prov['gpu_name']}" if prov.get("gpu_count") else "unknown GPU"
        line = (f"# source: measured live on {gpu} (host {prov['host']}), driver {prov.get('driver')}, "
                f"{utc_now()[:10]}; `nvidia-smi topo -m` run by benchmarks/gpu/record_topology.py\n")
        (out / "nvidia_smi_topo.txt").write_text(line + text)
        slug = re.sub(r"[^a-z0-9]+", "_", (prov.get("gpu_name") or "gpu").lower()).strip("_")
        log(f"nvidia-smi topo -m saved (sample name suggestion: {slug}_{prov['gpu_count']}gpu_live)")
        log(text)

    # 2. link measurements
    from labkit.topology.measure import measure_links

    m = measure_links(smoke=a.smoke)
    for s in m.skipped:
        log(f"skipped {s.part}: {s.reason}")
    p2p = m.p2p
    write_measurement(out / "links.json", "topology.links", m, provenance=header(command))
    if p2p is not None:
        write_measurement(out / "p2p_matrix.json", "topology.p2p", p2p, provenance=header(command))
    log(f"done in {time.perf_counter() - t0:.1f} s; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
