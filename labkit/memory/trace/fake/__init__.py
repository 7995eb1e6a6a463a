"""The fake GPU's rules: what a CUDA GPU and PyTorch's kernels allocate beyond the tensors a fake-tensor run
sees (cuBLAS and cuDNN workspaces, SDPA's kernel choice, autocast's cast cache, cuDNN RNNs, convolution
workspaces, gradient accumulation, mixture-of-experts routing), each rule with its PyTorch source, and the
facts of the target GPU (``targets/``). :mod:`labkit.memory.trace.step` and :mod:`labkit.memory.script` run
on them."""
