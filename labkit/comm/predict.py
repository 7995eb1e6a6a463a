"""The topology model's prediction beside each measured collective (``labkit.topology`` public API).

``collective_time(topo, gpus, op, bytes)`` is the topology chapter's alpha-beta ring estimate over the
slowest ring link's nominal bandwidth: a *model*. GPU runs on one node are compared with it for GPUs
``0..world-1``; CPU (gloo) runs and multi-node runs have no topology model and get a note instead.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from labkit.core.errors import LabkitError
from labkit.topology import collective_time

DEFAULT_H200_STANDIN = "h100_nv18_8gpu_dual_numa"  # NV18 pairs, the same NVLink4 rate as an H200 board


def predict_us(topo, gpus: Sequence[int], op: str, nbytes: int) -> float:
    return collective_time(topo, list(gpus), op, int(nbytes)).time_s * 1e6


def predict_rows(rows: Iterable, topo, gpus: Sequence[int] | None = None) -> list[float]:
    """Predicted microseconds for each row (objects or dicts with ``op``, ``bytes``, ``world``)."""
    out = []
    for r in rows:
        r = r if isinstance(r, dict) else r.__dict__
        g = list(gpus) if gpus is not None else list(range(int(r["world"])))
        out.append(predict_us(topo, g, r["op"], r["bytes"]))
    return out


def attach_predictions(res, topo=None) -> bool:
    """Fill ``predicted_us`` of a :class:`~labkit.comm.bench.BenchResult`'s rows; False (with a note) when
    no topology model applies."""
    if res.backend != "nccl":
        res.notes.append("no topology prediction: CPU processes (gloo over shared memory/loopback) have no link model")
        return False
    if res.nodes > 1:
        res.notes.append("no topology prediction: the topology model covers one node; this run spans "
                         f"{res.nodes} nodes")
        return False
    try:
        if topo is None:
            from labkit.topology import load_topology

            topo = load_topology("live")
        if topo.n < res.world:
            raise LabkitError(f"topology has {topo.n} GPUs, the run used {res.world}")
        preds = predict_rows(res.rows, topo, list(range(res.world)))
    except LabkitError as exc:
        res.notes.append(f"no topology prediction: {exc}")
        return False
    for r, p in zip(res.rows, preds):
        r.predicted_us = p
    return True
