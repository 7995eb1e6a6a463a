"""The CUDA runtime through ctypes: peer copies with peer access off and on.

``cudaMemcpyPeerAsync`` without ``cudaDeviceEnablePeerAccess`` is what cuda-samples'
``p2pBandwidthLatencyTest`` calls "P2P off" (the driver stages the copy through host memory); with it,
"P2P on". The library is the one torch has loaded, so both share one CUDA context.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def load_cudart():
    """The CUDA runtime library torch has loaded (found in /proc/self/maps; else the one shipped in
    site-packages/nvidia), or None."""
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


class Peer:
    """Peer access and peer copies through a loaded CUDA runtime ``lib``."""

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

