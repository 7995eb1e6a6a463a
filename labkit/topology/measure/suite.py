"""Every part of the link measurement that can run here, in one call; the others are skipped with a reason."""

from __future__ import annotations

from labkit.core.units import MiB
from labkit.topology.measure.copies import measure_device_copy, measure_host
from labkit.topology.measure.events import cuda_unavailable_reason
from labkit.topology.measure.numa_child import measure_numa
from labkit.topology.measure.p2p import measure_p2p, measure_p2p_torch
from labkit.topology.measure.progress import log
from labkit.topology.measure.results import LinkMeasurements, Skipped

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def measure_links(*, smoke: bool = False, p2p_size: int | None = None) -> LinkMeasurements:
    """All parts that can run here; the others are listed in ``skipped`` with the reason."""
    why = cuda_unavailable_reason()
    if why:
        parts = ("device copy", "host<->device pageable/pinned", "NUMA-bound host<->device", "P2P matrix")
        return LinkMeasurements(gpus=[], skipped=[Skipped(p, why) for p in parts])
    import torch

    n = torch.cuda.device_count()
    m = LinkMeasurements(gpus=[torch.cuda.get_device_name(i) for i in range(n)])
    sizes = [1 * MiB, 4 * MiB] if smoke else [1 * MiB, 16 * MiB, 256 * MiB, 1024 * MiB]
    reps = 3 if smoke else 10
    for g in range(n):
        log(f"device copy GPU{g} ...")
        try:
            m.device_copy.append(measure_device_copy(g, sizes, repeats=reps))
            log(f"  peak {m.device_copy[-1].peak_Bps / 1e9:.0f} GB/s copied")
        except Exception as exc:
            m.skipped.append(Skipped(f"device copy GPU{g}", f"failed: {type(exc).__name__}: {exc}"))
        for pinned in (False, True):
            for direction in ("h2d", "d2h"):
                try:
                    r = measure_host(g, sizes, pinned, direction, repeats=3 if smoke else (5 if not pinned else 10))
                except Exception as exc:
                    m.skipped.append(Skipped(f"{direction} {'pinned' if pinned else 'pageable'} GPU{g}",
                                             f"failed: {type(exc).__name__}: {exc}"))
                    continue
                m.host.append(r)
                log(f"  {r.what} {r.memory} GPU{g}: peak {r.peak_Bps / 1e9:.1f} GB/s")
    numa_size = 4 * MiB if smoke else 256 * MiB
    try:
        res, reason = measure_numa(list(range(n)), numa_size, repeats=3 if smoke else 5)
    except Exception as exc:
        res, reason = [], f"failed: {type(exc).__name__}: {exc}"
    m.numa = res
    for r in res:
        log(f"  NUMA node {r.numa_node} ({r.note.split(':')[0]}) {r.what} {r.memory} GPU{r.gpu}: {r.peak_Bps / 1e9:.1f} GB/s")
    if reason:
        m.skipped.append(Skipped("NUMA-bound host<->device", reason))
    if n < 2:
        m.skipped.append(Skipped("P2P matrix", f"{n} GPU visible: a GPU-to-GPU matrix needs 2 or more"))
    else:
        size = p2p_size or (4 * MiB if smoke else 256 * MiB)
        try:
            log("P2P matrix ...")
            m.p2p = measure_p2p(size=size, repeats=reps)
        except Exception as exc:  # report, then fall back to torch copies (P2P on only)
            m.skipped.append(Skipped("P2P matrix (cudaMemcpyPeerAsync, P2P off/on)", f"failed: {type(exc).__name__}: {exc}"))
            try:
                log(f"  failed ({exc}); falling back to torch copies")
                m.p2p = measure_p2p_torch(size=size, repeats=reps)
            except Exception as exc2:
                m.skipped.append(Skipped("P2P matrix (torch copies)", f"failed: {type(exc2).__name__}: {exc2}"))
    return m
