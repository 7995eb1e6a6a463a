"""Which tensors of a user's program live on the (fake) GPU.

Every tensor of a faked program is a CPU fake tensor: a CPU-only PyTorch cannot run autograd on fake
``cuda`` tensors (the engine asks for CUDA's device guard and the process aborts). The GPU is kept as a
fact beside the tensors instead: a tensor is on the GPU when the tracker registered its storage
(:meth:`Placement.on_gpu`). The rules are the GPU program's:

* a factory with ``device="cuda"`` (or ``torch.device("cuda", i)``, ``set_default_device("cuda")``,
  ``with torch.device("cuda")``) allocates on the GPU; without one, on the host;
* ``.cuda()``, ``.to("cuda")``, ``.to(cuda_tensor)`` copy a host tensor to the GPU and return a GPU
  tensor itself unchanged (``Tensor.to`` aliases when nothing changes: ``to_will_alias`` in
  ``aten/src/ATen/native/TensorConversions.cpp``); ``.cpu()`` and ``.to("cpu")`` take a host copy;
* every other op's outputs are on the GPU when any tensor argument is (a 0-dim host tensor mixes
  with GPU tensors as CUDA kernels allow).

User code sees a GPU tensor's ``device`` as ``cuda:0`` (and ``is_cuda``, ``get_device()`` to match), so
``torch.arange(n, device=x.device)`` lands where it would on the GPU; the fake-tensor machinery itself
(inside an op's dispatch) and the C++ autograd engine still see ``cpu``.

:class:`DeviceMode` is the Python-level half (a ``TorchFunctionMode``: ``device=`` arguments and the
copy methods); :class:`labkit.memory.script.tracker.GpuTracker` the dispatch-level half.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.optim.optimizer as optim_mod
import torch.utils._foreach_utils as foreach_mod
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
# what torch raises for a copy of a meta tensor to a real device (aten/src/ATen/native/Copy.cpp, copy_impl; the
# text torch/nn/modules/module.py's Module.to matches to suggest to_empty())
_NO_DATA = "Cannot copy out of meta tensor; no data!"


def is_cuda_device(d: Any) -> bool:
    """Whether a ``device=`` argument names a CUDA device (a string, an index counts as CUDA's)."""
    if d is None:
        return False
    if isinstance(d, int):
        return True
    try:
        return torch.device(d).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def is_host_device(d: Any) -> bool:
    if d is None or isinstance(d, int):
        return False
    try:
        return torch.device(d).type == "cpu"
    except (RuntimeError, TypeError):
        return False


def is_meta_device(d: Any) -> bool:
    """Whether a ``.to()`` target names the meta device (a tensor target never does here: meta tensors are not
    the program's GPU or host tensors)."""
    if d is None or isinstance(d, (int, torch.Tensor)):
        return False
    try:
        return torch.device(d).type == "meta"
    except (RuntimeError, TypeError):
        return False


class Placement:
    """The GPU membership of tensors and the copy direction of the call in progress.

    ``directed``: ``"gpu"`` or ``"host"`` while a call that names its device runs (every allocation in it
    lands there), else None. ``internal``: > 0 while an op is being dispatched (fake tensors then report
    their real, CPU device)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.directed: str | None = None
        self.internal = 0

    def on_gpu(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self.tracker.storage_id(t) is not None

    @contextlib.contextmanager
    def direct(self, where: str | None) -> Iterator[None]:
        prev, self.directed = self.directed, where
        try:
            yield
        finally:
            self.directed = prev


def parse_to(args: tuple, kwargs: dict) -> tuple[Any, Any, bool, bool, Any] | None:
    """``Tensor.to``'s arguments as (device, dtype, non_blocking, copy, memory_format); a tensor argument
    gives its own device object back (its placement is decided by the caller). None when they do not parse
    (the original call then raises what it raises on the GPU)."""
    kwargs = dict(kwargs)
    copy = bool(kwargs.pop("copy", False))
    other = kwargs.pop("other", None)
    if other is None and args and isinstance(args[0], torch.Tensor):
        other, args = args[0], args[1:]
    if other is not None:
        args = (other.dtype, *args)
    for attempt in (args, args[:-1]):
        try:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*attempt, **kwargs)
        except (TypeError, RuntimeError):
            continue
        if attempt is not args:
            if not isinstance(args[-1], bool):
                return None
            copy = args[-1]
        return (other if other is not None else device), dtype, non_blocking, copy, memory_format
    return None


class DeviceMode(TorchFunctionMode):
    """The Python-level placement rules (see the module docstring)."""

    def __init__(self, placement: Placement) -> None:
        super().__init__()
        self.p = placement

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu", "pin_memory", "is_pinned") and args and isinstance(args[0], torch.Tensor):
            return self._method(name, func, args[0], args[1:], kwargs)
        d = kwargs.get("device")
        if d is not None and name != "_parse_to":         # nn.Module.to parses its arguments with _parse_to
            if is_cuda_device(d):
                kwargs["device"] = _CPU
                with self.p.direct("gpu"):
                    return func(*args, **kwargs)
            if is_host_device(d):
                with self.p.direct("host"):
                    return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _method(self, name: str, func: Any, t: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        gpu = self.p.on_gpu(t)
        if name == "pin_memory":            # pinned host memory is not the GPU's; a CPU build has none
            return t
        if name == "is_pinned":
            return False
        if name in ("cuda", "cpu") and t.device.type == "meta":
            raise NotImplementedError(_NO_DATA)
        if name == "cuda":
            if gpu:
                return t
            with self.p.direct("gpu"):
                return torch.Tensor.to(t, _CPU, copy=True, non_blocking=bool(kwargs.get("non_blocking", False)))
        if name == "cpu":
            if not gpu:
                return t
            with self.p.direct("host"):
                return torch.Tensor.to(t, _CPU, copy=True)
        parsed = parse_to(args, kwargs)
        if parsed is None:
            return func(t, *args, **kwargs)
        target, dtype, non_blocking, copy, memory_format = parsed
        if is_meta_device(target):              # shape only, no data (pipelining's stage takes its inputs' so)
            with self.p.direct("host"):
                return func(t, *args, **kwargs)
        if t.device.type == "meta" and (is_cuda_device(target) or is_host_device(target)):
            raise NotImplementedError(_NO_DATA)
        to_gpu = self.p.on_gpu(target) if isinstance(target, torch.Tensor) else is_cuda_device(target)
        to_host = (not self.p.on_gpu(target)) if isinstance(target, torch.Tensor) else is_host_device(target)
        rest = {"dtype": dtype, "non_blocking": non_blocking, "copy": copy, "memory_format": memory_format}
        rest = {k: v for k, v in rest.items() if v not in (None, False)}
        if target is None or (to_gpu and gpu) or (to_host and not gpu):
            return func(t, **rest)              # the device does not change: Tensor.to's own rules
        rest["copy"] = True
        with self.p.direct("gpu" if to_gpu else "host"):
            return func(t, _CPU, **rest)


@contextlib.contextmanager
def reported_devices(placement: Placement, index: int = 0) -> Iterator[None]:
    """Fake tensors report ``cuda:0`` to user code while on the GPU (see the module docstring): the
    ``device`` property, ``is_cuda`` and ``get_device()`` of :class:`FakeTensor`; and ``FakeTensor`` counts
    as a tensor type the foreach and fused kernels take (``torch.optim.optimizer._foreach_supported_types``,
    ``torch.utils._foreach_utils._foreach_supported_types``), as a CUDA tensor does, so that an optimizer
    or ``clip_grad_norm_`` left at its defaults picks the implementation it picks on the GPU."""
    original = FakeTensor.__dict__["device"]
    gpu_device = torch.device("cuda", index)

    def device(self: Any) -> torch.device:
        if self.fake_mode.in_kernel_invocation:
            return torch.device("meta")
        if placement.internal == 0 and placement.on_gpu(self):
            return gpu_device
        return self.fake_device

    def is_cuda(self: Any) -> bool:
        return placement.internal == 0 and placement.on_gpu(self)

    def get_device(self: Any) -> int:
        return index if is_cuda(self) else -1

    def wrapper_subclass(cls: Any, *args: Any, **kwargs: Any) -> Any:
        # a tensor subclass's wrapper (DTensor) takes its device from its inner tensor's reported device; the
        # engine must see the real one (a CPU-only build aborts on a CUDA wrapper in autograd)
        if is_cuda_device(kwargs.get("device")):
            kwargs["device"] = _CPU
        return make_wrapper(cls, *args, **kwargs)

    def subclass_device(self: Any) -> torch.device:
        inner = getattr(self, "_local_tensor", None)
        if isinstance(inner, torch.Tensor) and placement.internal == 0 and placement.on_gpu(inner):
            return gpu_device
        return torch._C.TensorBase.device.__get__(self)

    make_wrapper = torch.Tensor._make_wrapper_subclass
    added: list[list] = []
    for lst in (optim_mod._foreach_supported_types, foreach_mod._foreach_supported_types):
        if FakeTensor not in lst:
            lst.append(FakeTensor)
            added.append(lst)
    FakeTensor.device = property(device)                         # type: ignore[assignment]
    torch.Tensor._make_wrapper_subclass = staticmethod(wrapper_subclass)  # type: ignore[assignment]
    dtensor = _dtensor_class()
    propagator = _sharding_propagator()
    if dtensor is not None:
        dtensor.device = property(subclass_device)                # type: ignore[attr-defined]
    if propagator is not None:
        meta = propagator._propagate_tensor_meta_non_cached

        def propagate_meta(self: Any, *a: Any, **k: Any) -> Any:
            # DTensor infers an op's output shapes by running it on stand-in tensors under the fake mode it finds
            # (this one): on the GPU no memory is involved, so they are not the GPU's allocations
            with placement.direct("host"):
                return meta(self, *a, **k)

        propagator._propagate_tensor_meta_non_cached = propagate_meta
    FakeTensor.is_cuda = property(is_cuda)                       # type: ignore[assignment]
    FakeTensor.get_device = get_device                           # type: ignore[assignment]
    try:
        yield
    finally:
        FakeTensor.device = original                             # type: ignore[assignment]
        del torch.Tensor._make_wrapper_subclass
        if dtensor is not None:
            del dtensor.device
        if propagator is not None:
            propagator._propagate_tensor_meta_non_cached = meta
        del FakeTensor.is_cuda
        del FakeTensor.get_device
        for lst in added:
            lst.remove(FakeTensor)


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:          # a build without torch.distributed
        return None
    return DTensor


def _sharding_propagator() -> Any:
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        return None
    return ShardingPropagator if hasattr(ShardingPropagator, "_propagate_tensor_meta_non_cached") else None


def local_tensor(t: Any) -> Any:
    """The tensor whose storage is the memory: a DTensor's local shard, else ``t``."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t
