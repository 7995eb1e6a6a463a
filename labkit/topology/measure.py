"""Measure this server's links: device copies, host<->device (pageable vs pinned, per NUMA node),
and a GPU-to-GPU bandwidth/latency matrix like cuda-samples' ``p2pBandwidthLatencyTest``.

Method: CUDA events around the copies on the stream that runs them, warm-up runs first, the median
of the repeats; bandwidth = bytes / median time (decimal GB/s when printed, GB = 1e9 B). A device copy
also reports read+write traffic (2 x bytes), the figure STREAM-like benchmarks quote.

GPU-to-GPU copies use the CUDA runtime's ``cudaMemcpyPeerAsync`` through ctypes (the library torch has
loaded), so that "P2P off" means what it means in p2pBandwidthLatencyTest: peer access not enabled,
the driver stages the copy through host memory; "P2P on" enables peer access first
(``cudaDeviceEnablePeerAccess``). Latency: 4-byte copies queued behind a GPU sleep so that launch
gaps do not count, elapsed time / count.

Every part is skipped with a stated reason where it cannot run (no CUDA GPU, one GPU, one NUMA node).
torch is imported only inside the functions.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core.units import MiB
from labkit.topology.p2ptable import P2PTable


@dataclass
class Point:
    size_bytes: int
    median_s: float
    bytes_per_s: float           # size / median time
    times_s: list[float]


@dataclass
class CopyResult:
    what: str                    # "device copy", "host->device", "device->host"
    gpu: int
    memory: str                  # "device", "pinned", "pageable"
    points: list[Point]
    numa_node: int | None = None       # the NUMA node the process and host buffer were bound to
    gpu_numa_node: int | None = None   # the GPU's own NUMA node
    note: str = ""

    @property
    def peak_Bps(self) -> float:
        """The best size's bandwidth."""
        return max(p.bytes_per_s for p in self.points)

    @property
    def largest(self) -> Point:
        """The largest size's point: the sustained rate (a cache or staging buffer can favour mid sizes)."""
        return max(self.points, key=lambda p: p.size_bytes)


@dataclass
class Skipped:
    part: str
    reason: str


@dataclass
class LinkMeasurements:
    gpus: list[str]
    device_copy: list[CopyResult] = field(default_factory=list)
    host: list[CopyResult] = field(default_factory=list)
    numa: list[CopyResult] = field(default_factory=list)
    p2p: P2PTable | None = None
    skipped: list[Skipped] = field(default_factory=list)
    method: str = ("CUDA events on the copying stream, warm-up then median of repeats; bandwidth = bytes / median time "
                   "(device copy also as read+write = 2 x bytes); P2P via cudaMemcpyPeerAsync with peer access off/on")


def _log(msg: str) -> None:
    print(msg, flush=True)


def cuda_unavailable_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        return f"no CUDA GPU visible to torch {torch.__version__} ({build})"
    return None


def _time_events(fn, warmup: int, repeats: int, stream) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(stream.device)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def _point(size: int, times: list[float], traffic: int | None = None) -> Point:
    med = statistics.median(times)
    return Point(size_bytes=size, median_s=med, bytes_per_s=(traffic or size) / med, times_s=times)


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
            pts.append(_point(size, _time_events(lambda: dst.copy_(src), warmup, repeats, s)))
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
            pts.append(_point(size, _time_events(fn, warmup, repeats, s)))
            del host, d
        torch.cuda.empty_cache()
    what = "host->device" if direction == "h2d" else "device->host"
    return CopyResult(what, gpu, "pinned" if pinned else "pageable", pts, numa_node=numa_node)


# ---- CUDA runtime through ctypes (peer copies with peer access off and on) ----

def _cudart():
    """The CUDA runtime library torch has loaded (found in /proc/self/maps; else the one shipped in
    site-packages/nvidia), or None."""
    import glob
    import site

    cands = []
    try:
        with open("/proc/self/maps") as f:
            cands += [line.split()[-1] for line in f if "libcudart.so" in line]
    except OSError:
        pass
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "**", "libcudart.so*"), recursive=True), reverse=True)
    for path in cands:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_size_t, ctypes.c_void_p]
        lib.cudaDeviceCanAccessPeer.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        return lib
    return None


class _Peer:
    def __init__(self, lib):
        self.lib = lib

    def _check(self, rc: int, what: str, ok=(0,)) -> None:
        if rc not in ok:
            self.lib.cudaGetLastError()
            raise RuntimeError(f"{what} returned CUDA error {rc}")

    def can_access(self, a: int, b: int) -> bool:
        v = ctypes.c_int(0)
        self._check(self.lib.cudaDeviceCanAccessPeer(ctypes.byref(v), a, b), "cudaDeviceCanAccessPeer")
        return bool(v.value)

    def set_access(self, a: int, b: int, on: bool) -> None:
        """Enable/disable a's access to b's memory (704 already enabled, 705 not enabled are fine)."""
        import torch

        with torch.cuda.device(a):
            self._check(self.lib.cudaSetDevice(a), "cudaSetDevice")
            if on:
                rc = self.lib.cudaDeviceEnablePeerAccess(b, 0)
            else:
                rc = self.lib.cudaDeviceDisablePeerAccess(b)
            self._check(rc, "cudaDevice%sPeerAccess" % ("Enable" if on else "Disable"), ok=(0, 704, 705))
            if rc:
                self.lib.cudaGetLastError()

    def copy(self, dst, dst_dev: int, src, src_dev: int, nbytes: int, stream) -> None:
        self._check(self.lib.cudaMemcpyPeerAsync(ctypes.c_void_p(dst.data_ptr()), dst_dev, ctypes.c_void_p(src.data_ptr()),
                                                 src_dev, nbytes, ctypes.c_void_p(stream.cuda_stream)), "cudaMemcpyPeerAsync")


def measure_p2p(size: int = 256 * MiB, warmup: int = 2, repeats: int = 10, lat_count: int = 100) -> P2PTable:
    """GPU-to-GPU matrices (uni/bidirectional bandwidth, latency) with peer access off, then on."""
    import torch

    n = torch.cuda.device_count()
    lib = _cudart()
    if lib is None:
        raise RuntimeError("the CUDA runtime library (libcudart) is not loaded in this process: cannot call cudaMemcpyPeerAsync")
    peer = _Peer(lib)
    names = [torch.cuda.get_device_name(i) for i in range(n)]
    bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}").fill_(i) for i in range(n)]
    bufs2 = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    small = [torch.zeros(16, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    can = [[i == j or peer.can_access(i, j) for j in range(n)] for i in range(n)]
    t = P2PTable(source="measured here", gpus=names, can_access=can)

    def uni(i, j):
        s = streams[i]
        return statistics.median(_time_events(lambda: peer.copy(bufs2[j], j, bufs[i], i, size, s), warmup, repeats, s))

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
                _log(f"  {mode} GPU{i}->GPU{j}: uni {U[i][j] / 1e9:.1f} GB/s, bi {B[i][j] / 1e9:.1f} GB/s, "
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
                U[i][j] = size / statistics.median(_time_events(lambda: bufs2[j].copy_(bufs[i], non_blocking=True),
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
            _log(f"  torch copy GPU{i}->GPU{j}: uni {U[i][j] / 1e9:.1f} GB/s, bi {B[i][j] / 1e9:.1f} GB/s")
    t = P2PTable(source="measured here", gpus=names, can_access=can, uni_Bps={"p2p_on": U}, bi_Bps={"p2p_on": B})
    t.notes.append("fallback: torch tensor copies (peer access enabled by torch where possible); P2P off and latency not measured")
    return t


# ---- NUMA binding: one child process per NUMA node ----

def numa_nodes_with_cpus() -> dict[int, list[int]]:
    out = {}
    for d in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        try:
            text = (d / "cpulist").read_text().strip()
        except OSError:
            continue
        cpus = _expand(text)
        if cpus:
            out[int(d.name[4:])] = cpus
    return out


def _expand(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def gpu_numa_node(gpu: int) -> int | None:
    """The NUMA node of torch's GPU ``gpu``: its PCI bus id (torch, else NVML at the same index, which
    matches when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) looked up in sysfs."""
    from labkit.core.machine import pci_numa_node

    try:
        import torch

        p = torch.cuda.get_device_properties(gpu)
        bus = getattr(p, "pci_bus_id", None)
        if bus is not None:
            return pci_numa_node(f"{getattr(p, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(p, 'pci_device_id', 0):02x}.0")
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            b = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).busId
            return pci_numa_node(b.decode() if isinstance(b, bytes) else str(b))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def measure_numa(gpus: list[int], size: int, repeats: int = 5) -> tuple[list[CopyResult], str | None]:
    """Host<->device per GPU with the process bound to each NUMA node in turn (a child process per
    node, bound before CUDA starts: ``numactl --cpunodebind --membind`` when installed, else CPU
    affinity with first-touch allocation). Returns (results, reason skipped or None)."""
    nodes = numa_nodes_with_cpus()
    if len(nodes) < 2:
        return [], f"this machine has {len(nodes)} NUMA node(s) with CPUs: nothing to compare"
    numactl = shutil.which("numactl")
    out: list[CopyResult] = []
    for node, cpus in nodes.items():
        with tempfile.TemporaryDirectory() as td:
            res = Path(td) / "numa.json"
            cmd = [sys.executable, "-c", "import sys; from labkit.topology.measure import _main; sys.exit(_main(sys.argv[1:]))",
                   "--numa-child", str(node), "--gpus",
                   ",".join(map(str, gpus)), "--size", str(size), "--repeats", str(repeats), "--result", str(res)]
            if numactl:
                cmd = [numactl, f"--cpunodebind={node}", f"--membind={node}"] + cmd
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2])] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            _log(f"  NUMA node {node}: {'numactl' if numactl else 'CPU affinity'} binding, child process ...")
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
            if r.returncode != 0 or not res.exists():
                return out, f"child bound to NUMA node {node} failed (exit {r.returncode}): {r.stderr.strip()[-300:]}"
            from labkit.topology.recorded import copy_result_from_json

            out += [copy_result_from_json(d) for d in json.loads(res.read_text())]
    return out, None


def _numa_child(node: int, gpus: list[int], size: int, repeats: int, result: str) -> None:
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
    from labkit.core.serialize import to_jsonable

    Path(result).write_text(json.dumps(to_jsonable(out)))


# ---- everything ----

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
        _log(f"device copy GPU{g} ...")
        try:
            m.device_copy.append(measure_device_copy(g, sizes, repeats=reps))
            _log(f"  peak {m.device_copy[-1].peak_Bps / 1e9:.0f} GB/s copied")
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
                _log(f"  {r.what} {r.memory} GPU{g}: peak {r.peak_Bps / 1e9:.1f} GB/s")
    numa_size = 4 * MiB if smoke else 256 * MiB
    try:
        res, reason = measure_numa(list(range(n)), numa_size, repeats=3 if smoke else 5)
    except Exception as exc:
        res, reason = [], f"failed: {type(exc).__name__}: {exc}"
    m.numa = res
    for r in res:
        _log(f"  NUMA node {r.numa_node} ({r.note.split(':')[0]}) {r.what} {r.memory} GPU{r.gpu}: {r.peak_Bps / 1e9:.1f} GB/s")
    if reason:
        m.skipped.append(Skipped("NUMA-bound host<->device", reason))
    if n < 2:
        m.skipped.append(Skipped("P2P matrix", f"{n} GPU visible: a GPU-to-GPU matrix needs 2 or more"))
    else:
        size = p2p_size or (4 * MiB if smoke else 256 * MiB)
        try:
            _log("P2P matrix ...")
            m.p2p = measure_p2p(size=size, repeats=reps)
        except Exception as exc:  # report, then fall back to torch copies (P2P on only)
            m.skipped.append(Skipped("P2P matrix (cudaMemcpyPeerAsync, P2P off/on)", f"failed: {type(exc).__name__}: {exc}"))
            try:
                _log(f"  failed ({exc}); falling back to torch copies")
                m.p2p = measure_p2p_torch(size=size, repeats=reps)
            except Exception as exc2:
                m.skipped.append(Skipped("P2P matrix (torch copies)", f"failed: {type(exc2).__name__}: {exc2}"))
    return m


def _main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="internal: NUMA-bound host<->device child")
    p.add_argument("--numa-child", type=int, required=True)
    p.add_argument("--gpus", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--result", required=True)
    a = p.parse_args(argv)
    _numa_child(a.numa_child, [int(x) for x in a.gpus.split(",") if x], a.size, a.repeats, a.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
