"""The CUDA caching allocator chapter: a faithful simulator, snapshot replay, experiments, OOM doctor."""
