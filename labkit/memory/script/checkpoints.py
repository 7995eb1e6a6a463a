"""Checkpoints a faked program saves and loads: shapes and dtypes on disk, no values.

A training script often saves its model and loads it back (``save_pretrained`` then ``from_pretrained`` of its own
folder, ``torch.save(model.state_dict(), path)`` then ``torch.load(path)``). Fake tensors have no values, so a save
cannot write the real file; what it writes is a *placeholder* that has the file's structure without its data, and
that only the fake GPU reads:

* ``safetensors`` (``save_file``, ``save``, what ``save_pretrained`` of transformers and peft write with): a
  safetensors header (the format's 8-byte length and JSON: each tensor's dtype, shape and data offsets, the caller's
  metadata) with a ``labkit_fake_gpu`` entry in its metadata, and no data section. A real reader refuses it (the
  offsets point past the end of the file); ``safe_open`` / ``load_file`` / ``load`` here give tensors of those
  shapes and dtypes on the device asked for. ``safe_open`` of any safetensors file is answered from its header
  alone (a real checkpoint's values are never read: fake tensors have none).
* ``torch.save``: :data:`MAGIC`, then a pickle of the saved object in which each tensor is a record (shape, stride,
  offset, dtype, storage, device, ``requires_grad``, ``Parameter``; a real host tensor keeps its values); views of
  one storage stay one storage. ``torch.load`` of such a file rebuilds the object, each tensor on the device it was
  saved from or the one ``map_location`` names, as ``torch.load`` places it; ``weights_only`` (the default) refuses
  what PyTorch's weights-only unpickler refuses. Any other file is loaded by ``torch.load`` itself.

Before writing, a save makes the checks the real one makes: safetensors' ``_evaluate_tensors_for_save`` (tensors
that share memory are refused: this needs real pointers, :mod:`labkit.memory.trace.fake.addresses`) and its
refusal of a non-contiguous tensor. A placeholder never replaces a file that is not one (nothing already written
is lost): the save is then kept in memory, and loads of that path in this run read it from there. Both are said in
the run's notes. Libraries bind these functions under their own names at import (``from safetensors import
safe_open`` in transformers' modeling_utils), so every module attribute that holds one is swapped for the run,
and swapped back after it (modules the script imported meanwhile included).

transformers loads a checkpoint's tensors in worker threads by default (``HF_DEACTIVATE_ASYNC_LOAD`` unset,
``core_model_loading.py``); the fake modes are per thread, so the run sets that variable and transformers loads
in the main thread, in the same order of tensors.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import struct
import sys
import threading
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
from torch._weights_only_unpickler import Unpickler as WeightsOnly    # what torch.load(weights_only=True) unpickles with

from labkit.core.errors import LabkitError
from labkit.memory.script.tensor_placement import is_cuda_device

#: The first bytes of a ``torch.save`` placeholder
MAGIC = b"LABKIT-FAKE-GPU torch.save placeholder (shapes and dtypes, no values)\n"
#: The metadata entry that marks a safetensors placeholder
SAFETENSORS_MARK = "labkit_fake_gpu"
_MARK_TEXT = "placeholder written on labkit's fake GPU: shapes and dtypes, no tensor data"
#: safetensors' dtype names (the format's ``Dtype``, https://github.com/huggingface/safetensors, safetensors/src/tensor.rs)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32,
    "F64": torch.float64, "I64": torch.int64, "U64": torch.uint64, "C64": torch.complex64,
    "F8_E5M2": torch.float8_e5m2, "F8_E4M3": torch.float8_e4m3fn,
}
_SAFETENSORS_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
#: Real host tensors up to this many bytes keep their values in a torch.save placeholder
VALUES_KEPT = 1 << 20
_PLAIN = (torch.Tensor, nn.Parameter)


class Placeholders:
    """The placeholders written in one run, by absolute path (see the module docstring)."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note
        self.saved: dict[str, bytes] = {}

    def write(self, f: Any, data: bytes, what: str) -> None:
        if not isinstance(f, (str, bytes, os.PathLike)):       # a file object the program opened to write
            f.write(data)
            self.note(f"{what} to a file object: a placeholder (shapes and dtypes, no values) was written")
            return
        path = os.path.abspath(os.fsdecode(f))
        self.saved[path] = data
        if os.path.exists(path) and self.read_placeholder(path) is None:
            self.note(f"{what}({os.fsdecode(f)!r}): the file exists and is not a fake-GPU placeholder, so it was kept; "
                      "the save is held in memory for this run's loads")
            return
        with open(path, "wb") as fh:
            fh.write(data)
        self.note(f"{what}({os.fsdecode(f)!r}): fake tensors have no values; a placeholder (shapes and dtypes, no "
                  "data) was written, which only the fake GPU loads")

    def read(self, f: Any) -> bytes | None:
        """The placeholder saved at path ``f`` in this run or found there on disk, else None."""
        path = os.path.abspath(os.fsdecode(f))
        if path in self.saved:
            return self.saved[path]
        return self.read_placeholder(path)

    @staticmethod
    def read_placeholder(path: str) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(MAGIC))
                if head == MAGIC:
                    return head + fh.read()
                fh.seek(0)
                header = _read_header(fh)
        except OSError:
            return None
        if header is not None and SAFETENSORS_MARK in (header.get("__metadata__") or {}):
            return _encode_header(header)
        return None


# -- safetensors ---------------------------------------------------------------------------------------------------
def _read_header(fh: Any) -> dict | None:
    """A safetensors header (the JSON after its 8-byte little-endian length), or None if ``fh`` holds none."""
    raw = fh.read(8)
    if len(raw) != 8:
        return None
    (n,) = struct.unpack("<Q", raw)
    if n <= 1 or n > 100_000_000:
        return None
    text = fh.read(n)
    if len(text) != n or not text.lstrip().startswith(b"{"):
        return None
    try:
        header = json.loads(text)
    except ValueError:
        return None
    return header if isinstance(header, dict) else None


def _encode_header(header: dict) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)                      # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text


def _header_of(data: bytes) -> dict | None:
    return _read_header(io.BytesIO(data))


def safetensors_placeholder(tensors: Any, metadata: dict | None) -> bytes:
    """The placeholder of ``save_file(tensors, ..., metadata)``, after safetensors' own checks."""
    try:
        from safetensors.torch import _evaluate_tensors_for_save as check
    except ImportError:                                  # another safetensors: its checks are not known here
        check = None
    if check is not None:
        check(tensors)                                   # not a dict, sparse, tensors sharing memory
    header: dict[str, Any] = {"__metadata__": {**(metadata or {}), SAFETENSORS_MARK: _MARK_TEXT}}
    offset = 0
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{name}` which is not allowed (safetensors "
                             "refuses it; call .contiguous() on it before saving)")
        code = _SAFETENSORS_NAMES.get(t.dtype)
        if code is None:
            raise ValueError(f"safetensors cannot save `{name}` of dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    return _encode_header(header)


class FakeSlice:
    """``safe_open(...).get_slice(name)`` of a header: shape and dtype; indexing makes the tensor."""

    def __init__(self, owner: "FakeSafeOpen", name: str) -> None:
        self.owner, self.name = owner, name
        self.info = owner.header[name]

    def get_shape(self) -> list[int]:
        return list(self.info["shape"])

    def get_dtype(self) -> str:
        return self.info["dtype"]

    def __getitem__(self, index: Any) -> torch.Tensor:
        full = self.owner.make(self.name, on_host=True)
        part = full[index]
        if part.data_ptr() != full.data_ptr() or part.shape != full.shape:
            part = part.clone()                          # safetensors reads just the slice into a tensor of its own
        return self.owner.place(part)


class FakeSafeOpen:
    """``safetensors.safe_open`` answered from a file's header (see the module docstring)."""

    def __init__(self, header: dict, device: Any = "cpu") -> None:
        self.header = {k: v for k, v in header.items() if k != "__metadata__"}
        self._metadata = header.get("__metadata__")
        self.device = device
        self.thread = threading.get_ident()

    def __enter__(self) -> "FakeSafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> list[str]:
        return sorted(self.header)

    def offset_keys(self) -> list[str]:
        return sorted(self.header, key=lambda k: self.header[k]["data_offsets"][0])

    def metadata(self) -> dict | None:
        return self._metadata

    def make(self, name: str, on_host: bool = False) -> torch.Tensor:
        if threading.get_ident() != self.thread:
            raise LabkitError("a safetensors file opened on the fake GPU was read in another thread, outside the fake "
                              "GPU's modes (they are per thread); read it in the thread that opened it")
        info = self.header.get(name)
        if info is None:
            raise KeyError(name)                         # as safe_open's get_tensor raises for an unknown name
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise LabkitError(f"safetensors dtype {info['dtype']} of {name!r} is not known to the fake GPU")
        t = torch.zeros(info["shape"], dtype=dtype, device="cpu")
        return t if on_host else self.place(t)

    def place(self, t: torch.Tensor) -> torch.Tensor:
        d = self.device
        if isinstance(d, int) or is_cuda_device(d):
            return t.to("cuda" if not isinstance(d, int) else f"cuda:{d}")
        return t

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.make(name)

    def get_slice(self, name: str) -> FakeSlice:
        if name not in self.header:
            raise KeyError(name)
        return FakeSlice(self, name)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {k: self.make(k) for k in self.offset_keys()}


# -- torch.save ----------------------------------------------------------------------------------------------------
def _is_plain(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (type(t) in _PLAIN or is_fake(t))


def torch_placeholder(obj: Any, on_gpu: Callable[[Any], bool], protocol: int = 2) -> bytes:
    """The placeholder of ``torch.save(obj)``: :data:`MAGIC`, the tensor records, then ``obj`` pickled with each
    tensor as the index of its record."""
    records: list[tuple] = []
    storages: dict[int, tuple[int, Any]] = {}      # id(storage) -> (storage key, storage), kept alive while saving
    values: dict[int, bytes] = {}
    index: dict[int, int] = {}

    def persistent_id(x: Any) -> int | None:
        if not _is_plain(x):
            return None
        if id(x) in index:
            return index[id(x)]
        if x.layout != torch.strided:
            raise LabkitError(f"torch.save on the fake GPU: a {x.layout} tensor cannot be saved as a placeholder")
        st = x.untyped_storage()
        key = storages.setdefault(id(st), (len(storages), st))[0]
        if not is_fake(x) and key not in values and st.nbytes() <= VALUES_KEPT:
            with unset_fake_temporarily():
                values[key] = bytes(torch.empty(0, dtype=torch.uint8).set_(st).numpy().tobytes())
        loc = "cuda:0" if on_gpu(x) else str(x.device)
        records.append((key, st.nbytes(), str(x.dtype).removeprefix("torch."), tuple(x.shape), tuple(x.stride()),
                        x.storage_offset(), bool(x.requires_grad), isinstance(x, nn.Parameter), loc))
        index[id(x)] = len(records) - 1
        return index[id(x)]

    body = io.BytesIO()
    pickler = pickle.Pickler(body, protocol=protocol)
    pickler.persistent_id = persistent_id              # type: ignore[method-assign]
    pickler.dump(obj)
    table = pickle.dumps((records, values), protocol=protocol)
    return MAGIC + struct.pack("<Q", len(table)) + table + body.getvalue()


def _device_for(loc: str, map_location: Any, note: Callable[[str], None]) -> str:
    if map_location is None:
        return loc
    if isinstance(map_location, dict):
        return str(map_location.get(loc, loc))
    if isinstance(map_location, (str, torch.device)):
        return str(map_location)
    note("torch.load(map_location=<a function>) of a fake-GPU placeholder: its tensors are loaded on the host")
    return "cpu"


def load_torch_placeholder(data: bytes, map_location: Any, weights_only: bool, note: Callable[[str], None]) -> Any:
    """``torch.load`` of a placeholder (see :func:`torch_placeholder`)."""
    (n,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    records, values = pickle.loads(data[start:start + n])
    bases: dict[int, torch.Tensor] = {}
    tensors: dict[int, torch.Tensor] = {}

    def persistent_load(pid: Any) -> torch.Tensor:
        pid = int(pid)
        if pid in tensors:
            return tensors[pid]
        key, nbytes, dtype_name, shape, stride, offset, requires_grad, param, loc = records[pid]
        device = _device_for(loc, map_location, note)
        dtype = getattr(torch, dtype_name)
        base = bases.get(key)
        if base is None:
            # the storage, typed as its first tensor (so a host storage is real or fake as the saved one was)
            dev = "cuda" if is_cuda_device(device) else device
            base = bases[key] = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=dev)
            if key in values and not is_fake(base):
                with unset_fake_temporarily():
                    base.view(torch.uint8).copy_(torch.frombuffer(bytearray(values[key]), dtype=torch.uint8))
        t = (base if base.dtype == dtype else base.view(torch.uint8).view(dtype)).as_strided(shape, stride, offset)
        t = nn.Parameter(t, requires_grad=requires_grad) if param else t.requires_grad_(requires_grad)
        tensors[pid] = t
        return t

    body = io.BytesIO(data[start + n:])
    if weights_only:
        unpickler: Any = WeightsOnly(body, encoding="utf-8")
        unpickler.persistent_load = persistent_load
        try:
            return unpickler.load()
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(f"Weights only load failed (torch.load, weights_only=True, on the fake GPU): "
                                         f"{e}") from None
    unpickler = pickle.Unpickler(body)
    unpickler.persistent_load = persistent_load         # type: ignore[method-assign]
    return unpickler.load()


# -- the swaps -----------------------------------------------------------------------------------------------------
def _swap(table: dict) -> None:
    """Every module attribute that is a key of ``table`` becomes its value."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            try:
                new = table.get(value)
            except TypeError:  # an unhashable attribute
                continue
            if new is not None:
                namespace[name] = new


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, bytes, os.PathLike))


@contextlib.contextmanager
def fake_checkpoints(gpu: Any) -> Iterator[Placeholders]:
    """The save and load functions above, for one fake run of ``gpu`` (a :class:`~labkit.memory.script.runtime.FakeGPU`)."""
    book = Placeholders(gpu.note)
    real_save, real_load = torch.save, torch.load

    def save(obj: Any, f: Any, pickle_module: Any = pickle, pickle_protocol: int = 2, *a: Any, **k: Any) -> None:
        book.write(f, torch_placeholder(obj, gpu.placement.on_gpu, pickle_protocol), "torch.save")

    def load(f: Any, map_location: Any = None, pickle_module: Any = None, *, weights_only: bool | None = None,
             mmap: bool | None = None, **kwargs: Any) -> Any:
        data = None
        if _is_path(f):
            data = book.read(f)
        elif hasattr(f, "read") and hasattr(f, "seek"):
            pos = f.tell()
            if f.read(len(MAGIC)) == MAGIC:
                f.seek(pos)
                data = f.read()
            else:
                f.seek(pos)
        if data is None or not data.startswith(MAGIC):
            return real_load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap, **kwargs)
        wo = weights_only if weights_only is not None else pickle_module is None
        return load_torch_placeholder(data, map_location, wo, gpu.note)

    swaps: dict[Any, Any] = {real_save: save, real_load: load}
    try:
        import safetensors
        import safetensors.torch as st
    except ImportError:  # no safetensors: nothing binds it
        st = None
    if st is not None:
        real_open, real_st_load = safetensors.safe_open, st.load

        def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
            book.write(filename, safetensors_placeholder(tensors, metadata), "safetensors save_file")

        def save_bytes(tensors: Any, metadata: Any = None) -> bytes:
            gpu.note("safetensors save: fake tensors have no values; the bytes are a placeholder (shapes and dtypes)")
            return safetensors_placeholder(tensors, metadata)

        def safe_open(filename: Any, framework: str = "pt", device: Any = "cpu", *a: Any, **k: Any) -> Any:
            data = book.read(filename)
            header = _header_of(data) if data is not None else None
            if header is None:
                try:
                    with open(filename, "rb") as fh:
                        header = _read_header(fh)
                except OSError:
                    header = None
                if header is not None:
                    gpu.note(f"safetensors safe_open({os.fsdecode(filename)!r}): read from its header (shapes and "
                             "dtypes); fake tensors have no values, so none were read")
            if header is None or framework not in ("pt", "torch", "pytorch"):
                return real_open(filename, framework, device, *a, **k)
            return FakeSafeOpen(header, device)

        def load_bytes(data: bytes) -> dict[str, torch.Tensor]:
            header = _header_of(data)
            if header is None or SAFETENSORS_MARK not in (header.get("__metadata__") or {}):
                return real_st_load(data)
            return FakeSafeOpen(header).get_tensors()

        swaps.update({st.save_file: save_file, st.save: save_bytes, real_open: safe_open, real_st_load: load_bytes})
    saved_env = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    _swap(swaps)
    try:
        yield book
    finally:
        _swap({new: old for old, new in swaps.items()})
        if saved_env is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = saved_env
