"""Host<->device copies with the process bound to each NUMA node in turn: one child process per node.

The binding must happen before CUDA starts (its threads inherit the CPU mask), hence a child:
``numactl --cpunodebind --membind`` when installed, else CPU affinity set first thing in the child
with first-touch allocation of the host buffers.

The protocol: the parent runs this module's ``main`` in ``python -c`` with ``--numa-child NODE --gpus
0,1 --size BYTES --repeats R --result FILE``; the child writes a JSON list of :class:`CopyResult`
to FILE and exits 0; anything else is a failure the parent reports as a reason, not an exception.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit.core.serialize import to_jsonable
from labkit.topology.measure.copies import measure_host
from labkit.topology.measure.numa import gpu_numa_node, numa_nodes_with_cpus
from labkit.topology.measure.progress import log
from labkit.topology.measure.results import CopyResult, copy_result_from_json

CHILD_TIMEOUT_S = 90
# not ``-m``: the package would import this module before running it as ``__main__``
CHILD_ENTRY = f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1:]))"


def measure_numa(gpus: list[int], size: int, repeats: int = 5) -> tuple[list[CopyResult], str | None]:
    """Host<->device per GPU with the process bound to each NUMA node in turn.
    Returns (results, reason skipped or None)."""
    nodes = numa_nodes_with_cpus()
    if len(nodes) < 2:
        return [], f"this machine has {len(nodes)} NUMA node(s) with CPUs: nothing to compare"
    numactl = shutil.which("numactl")
    out: list[CopyResult] = []
    for node in nodes:
        with tempfile.TemporaryDirectory() as td:
            res = Path(td) / "numa.json"
            cmd = [sys.executable, "-c", CHILD_ENTRY, "--numa-child", str(node), "--gpus", ",".join(map(str, gpus)),
                   "--size", str(size), "--repeats", str(repeats), "--result", str(res)]
            if numactl:
                cmd = [numactl, f"--cpunodebind={node}", f"--membind={node}"] + cmd
            env = dict(os.environ)
            root = str(Path(__file__).resolve().parents[3])  # the folder holding this labkit
            env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            log(f"  NUMA node {node}: {'numactl' if numactl else 'CPU affinity'} binding, child process ...")
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
            if r.returncode != 0 or not res.exists():
                return out, f"child bound to NUMA node {node} failed (exit {r.returncode}): {r.stderr.strip()[-300:]}"
            out += [copy_result_from_json(d) for d in json.loads(res.read_text())]
    return out, None


def run_child(node: int, gpus: list[int], size: int, repeats: int, result: str) -> None:
    """The child's side: bind to ``node``'s CPUs, measure, write the results to ``result``."""
    cpus = numa_nodes_with_cpus().get(node)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # before CUDA starts, so its threads inherit it
    out = []
    for g in gpus:
        local = gpu_numa_node(g)
        for pinned in (False, True):
            for direction in ("h2d", "d2h"):
                r = measure_host(g, [size], pinned, direction, warmup=1, repeats=repeats, numa_node=node)
                r.gpu_numa_node = local
                r.note = ("local: process and buffer on the GPU's NUMA node" if local == node else
                          "remote: process and buffer on another NUMA node" if local is not None else
                          "GPU's NUMA node unknown")
                out.append(r)
    Path(result).write_text(json.dumps(to_jsonable(out)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="internal: NUMA-bound host<->device child")
    p.add_argument("--numa-child", type=int, required=True)
    p.add_argument("--gpus", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--result", required=True)
    a = p.parse_args(argv)
    run_child(a.numa_child, [int(x) for x in a.gpus.split(",") if x], a.size, a.repeats, a.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
