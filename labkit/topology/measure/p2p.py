"""GPU-to-GPU matrices like cuda-samples' ``p2pBandwidthLatencyTest``: unidirectional and
bidirectional bandwidth and latency, with peer access off then on (through :mod:`.cudart`), or with
torch tensor copies where the runtime cannot be reached.

Latency: 4-byte copies queued behind a GPU sleep so that launch gaps do not count, elapsed time / count.
"""

from __future__ import annotations

import statistics

from labkit.core.units import MiB
from labkit.topology.measure.cudart import Peer, load_cudart
from labkit.topology.measure.events import time_events
from labkit.topology.measure.progress import log
from labkit.topology.p2ptable import P2PTable

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def measure_p2p(size: int = 256 * MiB, warmup: int = 2, repeats: int = 10, lat_count: int = 100) -> P2PTable:
    """GPU-to-GPU matrices (uni/bidirectional bandwidth, latency) with peer access off, then on."""
    import torch

    n = torch.cuda.device_count()
    lib = load_cudart()
    if lib is None:
        raise RuntimeError("the CUDA runtime library (libcudart) is not loaded in this process: cannot call cudaMemcpyPeerAsync")
    peer = Peer(lib)
    names = [torch.cuda.get_device_name(i) for i in range(n)]
    bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}").fill_(i) for i in range(n)]
    bufs2 = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    small = [torch.zeros(16, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    can = [[i == j or peer.can_access(i, j) for j in range(n)] for i in range(n)]
    t = P2PTable(source="measured here", gpus=names, can_access=can)

    def uni(i, j):
        s = streams[i]
        return statistics.median(time_events(lambda: peer.copy(bufs2[j], j, bufs[i], i, size, s), warmup, repeats, s))

    def bi(i, j):
        si, sj = streams[i], streams[j]
        times = []
        for k in range(warmup + repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            done_j = torch.cuda.Event()
            a.record(si)
            sj.wait_event(a)
            peer.copy(bufs2[j], j, bufs[i], i, size, si)
            peer.copy(bufs2[i], i, bufs[j], j, size, sj)
            done_j.record(sj)
            si.wait_event(done_j)
            b.record(si)
            b.synchronize()
            if k >= warmup:
                times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    def latency(i, j):
        s = streams[i]
        with torch.cuda.device(i), torch.cuda.stream(s):
            peer.copy(small[j], j, small[i], i, 4, s)  # warm-up
            torch.cuda.synchronize(i)
            torch.cuda._sleep(20_000_000)  # hold the stream while the copies are queued
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            for _ in range(lat_count):
                peer.copy(small[j], j, small[i], i, 4, s)
            b.record(s)
            b.synchronize()
        return a.elapsed_time(b) / 1e3 / lat_count

    for mode in ("p2p_off", "p2p_on"):
        for i in range(n):
            for j in range(n):
                if i != j and can[i][j]:
                    peer.set_access(i, j, mode == "p2p_on")
        U = [[None] * n for _ in range(n)]
        B = [[None] * n for _ in range(n)]
        L = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if mode == "p2p_on" and i != j and not can[i][j]:
                    continue
                U[i][j] = size / uni(i, j)
                B[i][j] = (size / uni(i, j)) if i == j else 2 * size / bi(i, j)
                L[i][j] = latency(i, j)
                log(f"  {mode} GPU{i}->GPU{j}: uni {U[i][j] / 1e9:.1f} GB/s, bi {B[i][j] / 1e9:.1f} GB/s, "
                     f"latency {L[i][j] * 1e6:.2f} us")
        t.uni_Bps[mode], t.bi_Bps[mode], t.latency_s[mode] = U, B, L
    t.notes.append(f"copy size {size} bytes, {warmup} warm-up + median of {repeats}; latency: {lat_count} x 4-byte "
                   f"copies queued behind a GPU sleep; diagonal = copy inside one GPU (bidirectional diagonal = unidirectional)")
    del bufs, bufs2, small
    torch.cuda.empty_cache()
    return t


def measure_p2p_torch(size: int = 256 * MiB, warmup: int = 2, repeats: int = 10) -> P2PTable:
    """Fallback without the CUDA runtime through ctypes: ``dst.copy_(src)`` across GPUs (torch enables
    peer access where it can), unidirectional and bidirectional bandwidth; P2P off is not measured."""
    import torch

    n = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(n)]
    bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}").fill_(i) for i in range(n)]
    bufs2 = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    can = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    U = [[None] * n for _ in range(n)]
    B = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            s = streams[i]
            with torch.cuda.stream(s):
                U[i][j] = size / statistics.median(time_events(lambda: bufs2[j].copy_(bufs[i], non_blocking=True),
                                                                warmup, repeats, s))
            if i == j:
                B[i][j] = U[i][j]
                continue
            si, sj = streams[i], streams[j]
            times = []
            for k in range(warmup + repeats):
                a, b, done_j = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), torch.cuda.Event()
                a.record(si)
                sj.wait_event(a)
                with torch.cuda.stream(si):
                    bufs2[j].copy_(bufs[i], non_blocking=True)
                with torch.cuda.stream(sj):
                    bufs2[i].copy_(bufs[j], non_blocking=True)
                done_j.record(sj)
                si.wait_event(done_j)
                b.record(si)
                b.synchronize()
                if k >= warmup:
                    times.append(a.elapsed_time(b) / 1e3)
            B[i][j] = 2 * size / statistics.median(times)
            log(f"  torch copy GPU{i}->GPU{j}: uni {U[i][j] / 1e9:.1f} GB/s, bi {B[i][j] / 1e9:.1f} GB/s")
    t = P2PTable(source="measured here", gpus=names, can_access=can, uni_Bps={"p2p_on": U}, bi_Bps={"p2p_on": B})
    t.notes.append("fallback: torch tensor copies (peer access enabled by torch where possible); P2P off and latency not measured")
    return t

