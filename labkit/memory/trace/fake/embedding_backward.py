"""The temporaries of ``embedding_dense_backward`` on CUDA, as ATen's kernels allocate them.

On the CPU the backward of an embedding is a scatter-add; on CUDA it is a sort-and-reduce whose buffers
depend on the batch's index count, the table's row count and the row width. The rule below follows
``embedding_dense_backward_cuda`` (``aten/src/ATen/native/cuda/Embedding.cu``) and
``embedding_backward_cuda_kernel`` (``EmbeddingBackwardKernel.cu``) of torch 2.11:

* up to 3072 indices (and no ``scale_grad_by_freq``): one atomic kernel straight into the gradient, no
  temporaries;
* otherwise the indices are sorted (``sorted_indices``, ``orig_indices`` and an ``arange``, index dtype,
  one element per index), then segments are found (``segment_offsets``: one per index; two 8-byte
  counters) and split into partial segments of ``NROWS_PER_THREAD`` (10) rows:
  ``max_segments = min(indices, rows)`` and ``max_partial = indices // 10 + max_segments``
  (``partials_per_segment`` and its offsets: ``max_segments`` each; ``partial_segment_offset``:
  ``max_partial``);
* the partial sums: a ``max_partial x width`` buffer in the accumulate type (float32 for fp16/bf16)
  for the two-pass kernel; when ``sum_and_scatter`` would launch fewer than 4 blocks per SM and
  ``max_partial`` exceeds 4x its grid, a fused atomic kernel instead needs a ``max_partial`` index map
  and, for fp16/bf16, a float32 copy of the whole gradient.

Checked against the H200's allocation stream of OPT (bf16, 4 x 1024 tokens, 2048 wide): the token
table (50272 rows) takes a 4505 x 2048 float32 block (36,904,960 B), the position table (2050 rows) a
2459 x 2048 one (20,144,128 B). CUB's own scratch space (sort, unique, scan) is a few KiB here and is
not counted.
"""

from __future__ import annotations

import torch

from labkit.memory.trace.fake.targets import H200

NROWS_PER_THREAD = 10
ATOMIC_FAST_PATH_MAX_INDICES = 3072
MAX_ATOMIC_ACCUM_BLOCKS_PER_SM = 4
MAX_BLOCK_SIZE = 1024
WARP = 32


def embedding_backward_temporaries(grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                                   scale_grad_by_freq: bool = False, sm_count: int = H200["sm_count"]) -> list[int]:
    """Bytes of each buffer ``embedding_dense_backward`` holds besides its result (all live together)."""
    n = indices.numel()
    if n <= ATOMIC_FAST_PATH_MAX_INDICES and not scale_grad_by_freq:
        return []
    isz = indices.element_size()
    width = grad.size(-1) if grad.dim() else 1
    acc = 8 if grad.dtype == torch.float64 else 4
    max_segments = min(n, int(num_weights))
    max_partial = n // NROWS_PER_THREAD + max_segments
    sizes = [n * isz, n * isz, n * isz]                  # sorted_indices, orig_indices, arange
    if scale_grad_by_freq:
        sizes.append(n * isz)                            # count
    sizes += [n * isz, 8, max_segments * isz, max_segments * isz, 8, max_partial * isz]
    warped = -(-width // WARP) * WARP
    block = min(warped, MAX_BLOCK_SIZE)
    scatter_grid = -(-max_segments * warped // block)
    fused = scatter_grid < sm_count * MAX_ATOMIC_ACCUM_BLOCKS_PER_SM and max_partial > scatter_grid * 4
    if fused:
        sizes.append(max_partial * isz)                  # partial_to_segment_idx
        if grad.dtype in (torch.float16, torch.bfloat16):
            sizes.append(int(num_weights) * width * 4)   # float32 accumulator, copied into the result
    else:
        sizes.append(max_partial * width * acc)          # grad_weight_per_segment
    return sizes


__all__ = ["embedding_backward_temporaries"]
