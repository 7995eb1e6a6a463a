"""Where ``cudaMalloc`` places a new segment in the virtual address space: a model of the CUDA driver.

The caching allocator's best fit takes, among free blocks of equal size, the one at the lowest address
(``BlockComparatorSize``: stream, size, then pointer), so which segment a request lands in, and whether a
later request finds room or needs a new segment, depends on the addresses the driver gave the segments.
PyTorch does not choose them. The H200's recorded allocation streams
(``data/measurements/measure/alloc_stream/``, driver 580, CUDA 13.0) show the driver's placement:

* a segment gets a new range of its size rounded up to 32 MiB, ranges handed out top-down
  (1960 MiB segments 1984 MiB apart, a 1470 MiB one in 1472 MiB, 980 in 992, 736 in 736, 394 in 416,
  a 36 MiB one in 64);
* a later segment that fits in the unused end of such a range goes there, into the lowest one that fits
  (BLOOM's cold stream: 28 MiB and 20 MiB segments right after 36 MiB ones, 2 MiB ones after 1470 MiB
  and 1960 MiB ones), before a new range is taken.

Replaying BLOOM amp-bf16's recorded requests with these addresses reserves exactly the H200's 19.80 GB
(cold), where plain top-down addresses gave 17.74 GB; the other recorded streams replay as before
(``tests/allocator/test_driver_va.py``). Not modelled: the driver's own allocations (the CUDA context,
libraries calling ``cudaMalloc`` directly) that sit between the ranges, and the first range of a process
(416 MiB in the recorded cold streams, filled bottom-up).
"""

from __future__ import annotations

import random
from bisect import bisect_left, insort

RANGE = 32 * 1024 * 1024        # the granularity of the driver's ranges (observed, see above)


class DriverVA:
    """Synthetic ``cudaMalloc`` addresses, top-down from ``top``, reusing the unused ends of earlier ranges."""

    __slots__ = ("top", "holes")

    def __init__(self, top: int = 1 << 46) -> None:
        self.top = top
        self.holes: list[tuple[int, int]] = []      # (address, size) free inside ranges, sorted by address

    def place(self, size: int) -> int:
        """The address of a new segment of ``size`` bytes (a multiple of 2 MiB, as cudaMalloc is asked)."""
        for i, (a, s) in enumerate(self.holes):     # the lowest hole that fits
            if s >= size:
                if s > size:
                    self.holes[i] = (a + size, s - size)
                else:
                    del self.holes[i]
                return a
        span = -(-size // RANGE) * RANGE
        self.top -= span
        if span > size:
            insort(self.holes, (self.top + size, span - size))
        return self.top

    def reserve(self, size: int, align: int) -> int:
        """A range reserved whole (``cuMemAddressReserve`` of an expandable segment), below every other."""
        self.top = (self.top - size) // align * align
        return self.top

    def release(self, addr: int, size: int) -> None:
        """``cudaFree``: the segment's range can be handed out again (merged with free neighbours)."""
        i = bisect_left(self.holes, (addr, size))
        if i < len(self.holes) and self.holes[i][0] == addr + size:          # the hole right after it
            size += self.holes.pop(i)[1]
        if i and sum(self.holes[i - 1]) == addr:                              # the hole right before it
            addr, size = self.holes[i - 1][0], self.holes[i - 1][1] + size
            del self.holes[i - 1]
            i -= 1
        self.holes.insert(i, (addr, size))


class ShuffledVA(DriverVA):
    """Segment addresses in a seeded random order: a stand-in for a process whose address space already holds
    other ranges (freed earlier, the driver's own), where the order of the segments' addresses is the
    process's history. Replays under several seeds bound how far that order moves the reserved peak: on the
    H200's stream of ``llama-gqa-b8-ckpt3-amp-bf16`` 30 seeds reserve either ~21.5 GB (22) or ~23.6 GB (8),
    the two figures two recordings of that loop measured (21.58 and 23.63 GB)."""

    __slots__ = ("_rng", "_taken")

    def __init__(self, seed: int, top: int = 1 << 46) -> None:
        super().__init__(top)
        self._rng = random.Random(seed)
        self._taken: dict[int, int] = {}

    def place(self, size: int) -> int:
        return self._random_free(size, RANGE)

    def reserve(self, size: int, align: int) -> int:
        return self._random_free(size, align)

    def _random_free(self, size: int, align: int) -> int:
        while True:
            a = self._rng.randrange(1 << 32, self.top - size) // align * align
            if not any(b < a + size and a < b + n for b, n in self._taken.items()):
                self._taken[a] = size
                return a

    def release(self, addr: int, size: int) -> None:
        self._taken.pop(addr, None)
