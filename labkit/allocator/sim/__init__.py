"""The caching-allocator simulator: PyTorch's ``CUDACachingAllocator`` as rules (block sizes, pools, best fit,
splitting, ``PYTORCH_ALLOC_CONF``), where the driver places segments, a process's starting state, and replays
of recorded or synthetic request streams through it."""
