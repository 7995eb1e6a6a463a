"""Your script, unmodified, on a faked GPU: the fake-CUDA runtime for a whole program.

``measure_step`` owns the training loop; this package runs the user's own program instead (gradient
accumulation, clipping, an EMA copy, ``GradScaler``, an evaluation pass, Lightning, Hugging Face
``Trainer``, accelerate) on CPU fake tensors, while ``torch.cuda`` answers as the target GPU would.

Modules, one concern each:

* ``tensor_placement``: which tensors live on the GPU. Every tensor is a CPU fake tensor; a tensor is "on the
  GPU" when the tracker registered its storage. ``device="cuda"``, ``.cuda()``, ``.to("cuda")`` place
  there, ``.cpu()`` takes a host copy, every other op's output follows its inputs; user code sees
  ``x.device == cuda:0`` for a GPU tensor.
* ``tracker``: the storage tracker restricted to GPU tensors, with the user's file:line of each allocation.
* ``live_allocator``: the caching-allocator simulator fed in step with the tracker, so that
  ``torch.cuda.memory_allocated()`` and friends answer mid-run, and the whole run's peaks come from it.
* ``cuda_api``: ``torch.cuda``'s answers (availability, properties, memory statistics, streams, events).
* ``frameworks``: what Lightning, Hugging Face ``Trainer``, accelerate, ``DataLoader`` and ``torch.compile``
  need to see the target GPU.
* ``runtime``: :func:`fake_gpu`, the context manager that puts it all together and measures phases and
  optimizer steps; ``script_report``: :class:`ScriptReport`; ``run``: :func:`trace_script` (a file, in a fresh process
  by default).

Importing this package does not import torch.
"""

import importlib

_LAZY = {
    "fake_gpu": "labkit.memory.script.runtime",
    "FakeGPU": "labkit.memory.script.runtime",
    "ScriptReport": "labkit.memory.script.script_report",
    "trace_script": "labkit.memory.script.run",
}


def __getattr__(name: str):  # noqa: ANN202 - lazy attribute access (PEP 562)
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'labkit.memory.script' has no attribute {name!r}")

    return getattr(importlib.import_module(mod), name)
