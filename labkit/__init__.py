"""GPU Memory Lab: how GPU memory is spent and moved on a multi-GPU server.

Chapters (one sub-package each): ``env`` (this machine), ``topology``, ``memory``,
``allocator``, ``comm``, ``workloads``; ``advise`` plans a whole job from them; ``report`` runs the
notebooks, ``viz`` draws.

The names a user imports are here, loaded on first use so that ``import labkit`` imports neither
torch nor a chapter::

    from labkit import measure_step, estimate, plan, watch
    labkit.report.record(...)        # a chapter is an attribute too

Each name is its chapter's own object (the chapter's package states it and documents it). A chapter's
name stays the chapter: the job planner is ``labkit.advise.advise``.
"""

__version__ = "0.1.0"

# name -> the module that defines or exports it. One __getattr__ serves them all (PEP 562).
_LAZY_NAMES = {
    # what a training step and a run are: one default per field, every verb's shared flags generated from them
    "StepSpec": "labkit.core.spec",
    "RunSpec": "labkit.core.spec",
    # a training step, measured (GPU, CPU) or predicted on fake tensors (labkit.memory.trace)
    "measure_step": "labkit.memory",
    "trace_script": "labkit.memory",
    "fake_gpu": "labkit.memory",
    "MeasureReport": "labkit.memory",
    "StepPolicy": "labkit.memory",
    "FakeCuda": "labkit.memory",
    "Probes": "labkit.memory",
    "CudaTarget": "labkit.memory",
    # the analytical per-GPU model and the layout planner (labkit.memory.estimate)
    "estimate": "labkit.memory.estimate",
    "ModelSpec": "labkit.memory.estimate",
    "ParallelSpec": "labkit.memory.estimate",
    "TrainSpec": "labkit.memory.estimate",
    "get_preset": "labkit.memory",
    "plan": "labkit.memory",
    "explain": "labkit.memory",
    # the caching allocator: capture an OOM in one's own loop, diagnose one
    "watch": "labkit.allocator",
    "diagnose": "labkit.allocator",
    # the machine and its links
    "probe": "labkit.env",
    "load_topology": "labkit.topology",
    # the error every bad input raises
    "LabkitError": "labkit.core",
}
_CHAPTERS = ("advise", "allocator", "comm", "core", "env", "lessons", "memory", "report", "topology", "viz",
             "workloads")

__all__ = ["__version__", *_LAZY_NAMES]


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy attribute access (PEP 562)
    import importlib

    if name in _CHAPTERS:
        return importlib.import_module(f"labkit.{name}")
    mod = _LAZY_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module 'labkit' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES) | set(_CHAPTERS))
