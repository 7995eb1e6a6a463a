"""GPU Memory Lab: how GPU memory is spent and moved on a multi-GPU server.

Chapters (one sub-package each): ``env`` (this machine), ``topology``, ``memory``,
``allocator``, ``comm``, ``workloads``; ``report`` runs the notebooks, ``viz`` draws.
"""

__version__ = "0.1.0"
