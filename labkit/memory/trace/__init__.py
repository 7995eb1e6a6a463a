"""The tracer: one training step run under a storage tracker, on a GPU, on the CPU, or on fake
tensors that predict a CUDA GPU's allocations (``fake-cuda``).

Modules: ``storage`` (the tracker), ``step`` (``measure_step``), ``fake_cuda`` (the GPU's choices
reproduced on CPU fake tensors), ``moe`` (the routing a mixture-of-experts dispatch is assumed to
take there; ``moe_sweep`` finds when it changes the peak), ``reserved`` (the allocation stream replayed through the allocator
simulator), ``phases`` (per-phase statistics for a user's own loop), ``sweeps`` (checkpointing and
precision sweeps), ``recorded`` (recorded H200 peaks and their fake-mode predictions), ``cli``
(``labkit measure``). Importing this package does not import torch; import the modules.
"""
