"""``PYTORCH_ALLOC_CONF`` strings, parsed the way PyTorch parses them.

Source: ``c10/core/AllocatorConfig.{h,cpp}`` (``ConfigTokenizer``, ``AcceleratorAllocatorConfig``) and
``c10/cuda/CUDAAllocatorConfig.h`` (CUDA-only keys). The string is split into tokens at ``, : [ ]``
(whitespace dropped); options are ``key:value`` separated by ``,``; lists use ``[...]``.

* ``max_split_size_mb:N`` (N >= 20): blocks >= N MiB are never split. Default: unlimited.
* ``max_non_split_rounding_mb:N`` (N >= 20): a request >= max_split_size may take a cached block
  smaller than request + N MiB. Default 20 MiB.
* ``roundup_power2_divisions:N`` or ``[1:N,...,>:N]``: 16 intervals, one per power of two from
  1 MiB up to 64 GiB (list keys are interval starts in MiB; ``>`` fills the rest). Power of two or 0.
* ``garbage_collection_threshold:T`` with 0 < T < 1 (only active with a memory fraction set).
* ``expandable_segments:True|False``.
* ``per_process_memory_fraction:F`` (newer releases) caps the device memory like
  ``torch.cuda.set_per_process_memory_fraction``.
* Other CUDA keys (``backend``, ``release_lock_on_cudamalloc``, ``pinned_*``, ...) are accepted and
  do not change the simulation; ``backend:cudaMallocAsync`` is refused (a different allocator).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.core.errors import LabkitError

MiB = 1024 * 1024
kLargeBuffer = 20 * MiB
NO_LIMIT = (1 << 64) - 1  # std::numeric_limits<size_t>::max()
N_INTERVALS = 16  # 1 MiB .. 64 GiB

_IGNORED_KEYS = {
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "pinned_free_catch_all", "pinned_max_round_threshold",
    "pinned_max_cached_size", "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom",
    "expandable_segments_handle_type",
}


@dataclass(frozen=True)
class AllocatorConfig:
    """The options of PyTorch's native CUDA caching allocator that change its decisions."""

    max_split_size: int = NO_LIMIT
    max_non_split_rounding_size: int = kLargeBuffer
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * N_INTERVALS)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None
    text: str = ""

    def divisions_for(self, size: int) -> int:
        """``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``."""
        log_size = size.bit_length() - 1
        index = log_size - 20 if log_size > 20 else 0
        return self.roundup_power2_divisions[min(index, N_INTERVALS - 1)]

    @property
    def label(self) -> str:
        return self.text or "default"


DEFAULT = AllocatorConfig()


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def tokenize(text: str) -> list[str]:
    toks: list[str] = []
    buf = ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                toks.append(buf)
                buf = ""
            toks.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        toks.append(buf)
    return toks


def parse_alloc_conf(text: str | None) -> AllocatorConfig:
    """Parse a ``PYTORCH_ALLOC_CONF`` value; raise :class:`LabkitError` naming what is wrong."""
    text = (text or "").strip()
    if text.lower() in ("", "default"):
        return DEFAULT
    toks = tokenize(text)
    where = f"allocator configuration {text!r}"

    def tok(i: int, what: str) -> str:
        if i >= len(toks):
            raise LabkitError(f"{where}: expected {what} at the end")
        return toks[i]

    def expect(i: int, ch: str) -> None:
        if tok(i, repr(ch)) != ch:
            raise LabkitError(f"{where}: expected {ch!r} but found {toks[i]!r}")

    def as_int(i: int, key: str) -> int:
        t = tok(i, f"a number for {key}")
        try:
            return int(t)
        except ValueError:
            raise LabkitError(f"{where}: {key} needs a whole number, got {t!r}") from None

    def as_float(i: int, key: str) -> float:
        t = tok(i, "a number")
        try:
            return float(t)
        except ValueError:
            raise LabkitError(f"{where}: {key} needs a number, got {t!r}") from None

    def as_bool(i: int, key: str) -> bool:
        t = tok(i, f"True or False for {key}")
        if t not in ("True", "False"):
            raise LabkitError(f"{where}: {key} needs True or False (capitalised), got {t!r}")
        return t == "True"

    opts: dict = {}
    divisions = [0] * N_INTERVALS
    i = 0
    while i < len(toks):
        key = toks[i]
        expect(i + 1, ":")
        i += 2
        if key == "max_split_size_mb":
            v = as_int(i, key)
            if v < kLargeBuffer // MiB:
                raise LabkitError(f"{where}: max_split_size_mb too small, must be >= 20 (got {v})")
            opts["max_split_size"] = v * MiB
        elif key == "max_non_split_rounding_mb":
            v = as_int(i, key)
            if v < kLargeBuffer // MiB:
                raise LabkitError(f"{where}: max_non_split_rounding_mb too small, must be >= 20 (got {v})")
            opts["max_non_split_rounding_size"] = v * MiB
        elif key == "garbage_collection_threshold":
            v = as_float(i, key)
            if not 0.0 < v < 1.0:
                raise LabkitError(f"{where}: garbage_collection_threshold must be in (0.0, 1.0), got {v}")
            opts["garbage_collection_threshold"] = v
        elif key == "per_process_memory_fraction":
            v = as_float(i, key)
            if not 0.0 <= v <= 1.0:
                raise LabkitError(f"{where}: per_process_memory_fraction must be in [0, 1], got {v}")
            opts["per_process_memory_fraction"] = v
        elif key == "expandable_segments":
            opts["expandable_segments"] = as_bool(i, key)
        elif key == "roundup_power2_divisions":
            if tok(i, "a value") == "[":
                first = True
                last_index = 0
                i += 1
                while i < len(toks) and toks[i] != "]":
                    bound = toks[i]
                    expect(i + 1, ":")
                    val = as_int(i + 2, key)
                    i += 2
                    if val != 0 and not _is_pow2(val):
                        raise LabkitError(f"{where}: roundup_power2_divisions values must be a power of 2 or 0, got {val}")
                    if bound == ">":
                        for j in range(last_index + 1, N_INTERVALS):
                            divisions[j] = val
                    else:
                        try:
                            b = int(bound)
                        except ValueError:
                            raise LabkitError(f"{where}: roundup_power2_divisions interval {bound!r} is not a number") from None
                        if not _is_pow2(b):
                            raise LabkitError(f"{where}: roundup_power2_divisions intervals must be powers of 2 (MiB), got {b}")
                        index = min(max(b.bit_length() - 1, 0), N_INTERVALS - 1)
                        if first:
                            for j in range(index):
                                divisions[j] = val
                            first = False
                        divisions[index] = val
                        last_index = index
                    if i + 1 < len(toks) and toks[i + 1] != "]":
                        expect(i + 1, ",")
                        i += 1
                    i += 1
                if i >= len(toks):
                    raise LabkitError(f"{where}: roundup_power2_divisions list has no closing ']'")
            else:
                v = as_int(i, key)
                if not _is_pow2(v):
                    raise LabkitError(f"{where}: roundup_power2_divisions must be a power of 2, got {v}")
                divisions = [v] * N_INTERVALS
            opts["roundup_power2_divisions"] = tuple(divisions)
        elif key == "backend":
            v = tok(i, "native or cudaMallocAsync")
            if v == "cudaMallocAsync":
                raise LabkitError(f"{where}: backend:cudaMallocAsync is CUDA's own pool allocator, which this lab does not simulate")
            if v != "native":
                raise LabkitError(f"{where}: unknown backend {v!r} (native or cudaMallocAsync)")
        elif key in _IGNORED_KEYS:
            if tok(i, "a value") == "[":
                while i < len(toks) and toks[i] != "]":
                    i += 1
        else:
            raise LabkitError(f"{where}: unrecognised option {key!r}")
        i += 1
        if i < len(toks):
            expect(i, ",")
            i += 1
    return AllocatorConfig(text=text, **opts)


def round_size(size: int, config: AllocatorConfig = DEFAULT) -> int:
    """``DeviceCachingAllocator::round_size``: 512-byte rounding or power-of-two divisions."""
    if size < 512:
        return 512
    div = config.divisions_for(size)
    if div > 1 and size > 512 * div:
        return roundup_power2_next_division(size, div)
    return 512 * ((size + 511) // 512)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    if _is_pow2(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the size of a new segment for a rounded request."""
    if size <= 1048576:
        return 2097152
    if size < 10485760:
        return kLargeBuffer
    return 2097152 * ((size + 2097151) // 2097152)
