"""Data pointers for fake tensors: unique, stable, non-zero addresses that point at nothing.

A fake tensor's storage has no memory, and PyTorch answers ``data_ptr()`` of it with 0 (with a deprecation
warning): every fake storage then looks like every other one. Programs compare pointers to find tensors that
share memory: transformers' ``save_pretrained`` (``id_tensor_storage``, ``remove_tied_weights_from_state_dict`` in
``modeling_utils.py``), safetensors' ``save_file`` (``_find_shared_tensors``: storages with the same pointer and
size), ``_end_ptr``-style overlap checks. With one pointer for all, a whole model's weights look shared.

:class:`FakeAddresses` gives each fake storage an address as the GPU program would see one:

* a storage the fake GPU allocated gets the address of its block in the lab's simulated caching allocator
  (``device_address``, :class:`labkit.allocator.CachingAllocatorSim`'s ``Block.addr``): distinct for storages
  alive together, reused after a free as the real allocator reuses a block;
* any other fake storage (a host tensor, a GPU storage the simulator holds no block for) gets the next address
  of a counter in a range of its own (above the simulator's, which lies below 2**46), advanced by the storage's
  size rounded up to 512 bytes, the caching allocator's rounding (``kMinBlockSize``,
  c10/cuda/CUDACachingAllocator.cpp): ranges never overlap, and the address is kept while the storage lives;
* a view answers its storage's address plus its offset (``storage_offset() * element_size()``, what
  ``TensorImpl::data()`` computes); an empty storage answers 0, as CUDA's and the CPU's allocators do for 0 bytes;
  a fake tensor on the ``meta`` device answers 0 as a meta tensor does.

Nothing reads or writes host memory at these addresses: they are numbers. A real (non-fake) tensor keeps its real
pointer. The answers come from Python (``FakeTensor.data_ptr`` and ``UntypedStorage.data_ptr``, set for the run
with :func:`fake_data_pointers`); C++ code that reads a pointer itself still sees the fake storage's null.
``Tensor.__deepcopy__`` clones a tensor subclass only when its ``data_ptr()`` is 0
(:func:`labkit.memory.trace.fake.fake_runtime.fake_deepcopy` is the route that does not depend on it).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

#: Where the counter's addresses start: above the simulated allocator's segments (``DriverVA``'s top is 2**46)
HOST_BASE = 0x7F00_0000_0000
#: The caching allocator's rounding of a block's size (``kMinBlockSize`` = 512, c10/cuda/CUDACachingAllocator.cpp)
ALIGN = 512


class FakeAddresses:
    """The address book of one fake run (see the module docstring). ``device_address(storage)``: the simulated
    allocator's block address of a storage the fake GPU allocated, or None."""

    def __init__(self, device_address: Callable[[Any], int | None] | None = None) -> None:
        self.device_address = device_address
        self._known: dict[int, tuple[weakref.ref, int]] = {}    # id(storage) -> (ref, address)
        self._next = HOST_BASE

    def _forget(self, key: int, ref: weakref.ref) -> None:
        known = self._known.get(key)
        if known is not None and known[0] is ref:
            del self._known[key]

    def storage_address(self, st: Any) -> int:
        """The address of fake storage ``st`` (0 when it holds no bytes)."""
        nbytes = st.nbytes()
        if nbytes == 0:
            return 0
        if self.device_address is not None:
            addr = self.device_address(st)
            if addr is not None:
                return addr
        key = id(st)
        known = self._known.get(key)
        if known is not None and known[0]() is st:
            return known[1]
        addr = self._next
        self._next += -(-nbytes // ALIGN) * ALIGN
        ref = weakref.ref(st, lambda r, key=key: self._forget(key, r))
        self._known[key] = (ref, addr)
        return addr

    def tensor_address(self, t: Any) -> int:
        """``t.data_ptr()`` for a fake tensor ``t``."""
        if t.fake_device.type == "meta":
            return 0
        base = self.storage_address(t.untyped_storage())
        return base + t.storage_offset() * t.element_size() if base else 0


def _is_fake_storage(st: Any) -> bool:
    # a fake tensor's storage lives on the meta device (it has a size and no memory)
    return st.device.type == "meta"


@contextlib.contextmanager
def fake_data_pointers(book: FakeAddresses) -> Iterator[None]:
    """``data_ptr()`` of fake tensors and of their storages answers from ``book`` while active; real tensors and
    storages answer as before."""
    storage_ptr = torch.UntypedStorage.data_ptr
    saved = [(cls, cls.__dict__.get("data_ptr")) for cls in (FakeTensor, torch.UntypedStorage)]

    def tensor_data_ptr(self: Any) -> int:
        return book.tensor_address(self)

    def untyped_data_ptr(self: Any) -> int:
        if _is_fake_storage(self):
            return book.storage_address(self)
        return storage_ptr(self)

    FakeTensor.data_ptr = tensor_data_ptr                        # type: ignore[method-assign]
    torch.UntypedStorage.data_ptr = untyped_data_ptr             # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, had in saved:
            if had is None:
                delattr(cls, "data_ptr")
            else:
                setattr(cls, "data_ptr", had)
