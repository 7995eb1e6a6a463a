"""Measure this server's links: device copies, host<->device (pageable vs pinned, per NUMA node),
and a GPU-to-GPU bandwidth/latency matrix like cuda-samples' ``p2pBandwidthLatencyTest``.

Method: CUDA events around the copies on the stream that runs them, warm-up runs first, the median
of the repeats; bandwidth = bytes / median time (decimal GB/s when printed, GB = 1e9 B). A device copy
also reports read+write traffic (2 x bytes), the figure STREAM-like benchmarks quote. Every part is
skipped with a stated reason where it cannot run (no CUDA GPU, one GPU, one NUMA node); torch is
imported only inside the functions.

One concern per module:

``results``     the result dataclasses (``Point``, ``CopyResult``, ``Skipped``, ``LinkMeasurements``)
                and their readers from JSON
``events``      CUDA-event timing; ``cuda_unavailable_reason()``
``copies``      device copies and host<->device copies
``cudart``      the CUDA runtime through ctypes (peer access, ``cudaMemcpyPeerAsync``)
``p2p``         the GPU-to-GPU matrices (``measure_p2p``, ``measure_p2p_torch``)
``numa``        NUMA nodes and CPUs from sysfs, a GPU's NUMA node
``numa_child``  one child process per NUMA node, bound before CUDA starts (``measure_numa``)
``suite``       ``measure_links(smoke=False)``: everything that can run here
"""

from labkit.topology.measure.events import cuda_unavailable_reason
from labkit.topology.measure.results import CopyResult, LinkMeasurements, Point, Skipped
from labkit.topology.measure.suite import measure_links

__all__ = ["CopyResult", "LinkMeasurements", "Point", "Skipped", "cuda_unavailable_reason", "measure_links"]
