"""Copies that involve one GPU: inside its memory, and between it and host memory (pageable or pinned)."""

from __future__ import annotations

from labkit.topology.measure.events import point, time_events
from labkit.topology.measure.results import CopyResult

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def measure_device_copy(gpu: int, sizes: list[int], warmup: int = 2, repeats: int = 10) -> CopyResult:
    """Copy inside one GPU. ``bytes_per_s`` counts the bytes copied; read+write traffic is twice that."""
    import torch

    dev = torch.device("cuda", gpu)
    pts = []
    with torch.cuda.device(dev):
        s = torch.cuda.current_stream(dev)
        for size in sizes:
            src = torch.empty(size, dtype=torch.uint8, device=dev).fill_(1)
            dst = torch.empty_like(src)
            pts.append(point(size, time_events(lambda: dst.copy_(src), warmup, repeats, s)))
            del src, dst
        torch.cuda.empty_cache()
    return CopyResult("device copy", gpu, "device", pts,
                      note="bytes copied per second; the memory traffic (read + write) is 2x this")


def measure_host(gpu: int, sizes: list[int], pinned: bool, direction: str, warmup: int = 1,
                 repeats: int = 5, numa_node: int | None = None) -> CopyResult:
    """Host->device (``direction='h2d'``) or device->host copies from pageable or pinned host memory."""
    import torch

    dev = torch.device("cuda", gpu)
    pts = []
    with torch.cuda.device(dev):
        s = torch.cuda.current_stream(dev)
        for size in sizes:
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            host.fill_(1)  # first touch: pages land on this process's NUMA node
            d = torch.empty(size, dtype=torch.uint8, device=dev)
            if direction == "h2d":
                fn = (lambda: d.copy_(host, non_blocking=pinned))
            else:
                fn = (lambda: host.copy_(d, non_blocking=pinned))
            pts.append(point(size, time_events(fn, warmup, repeats, s)))
            del host, d
        torch.cuda.empty_cache()
    what = "host->device" if direction == "h2d" else "device->host"
    return CopyResult(what, gpu, "pinned" if pinned else "pageable", pts, numa_node=numa_node)
