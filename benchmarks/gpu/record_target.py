"""Record the GPU target's facts as this GPU and torch show them, beside labkit/memory/trace/fake/targets/h200.json.

Writes ``target.json`` (kind ``target``) into ``--out``: for each fact of the file that a running process
can show, the value seen here and whether it equals the file's (``facts_check``):

* ``sm``, ``sm_count``, ``max_threads_per_sm``, ``name``: ``torch.cuda.get_device_properties``;
* ``torch_version``, ``cudnn_version``: ``torch.__version__``, ``torch.backends.cudnn.version()``;
* ``allocator_rounding``: ``memory_allocated()`` after a 1-byte tensor;
* ``cublas_workspace_bytes``: ``memory_allocated()`` after this process's first matmul, less its output;
* ``cublas_handles``: the workspaces held after a first forward and backward, everything else freed;
* ``efficient_lse_block``: the rows of the memory-efficient kernel's logsumexp for 33 queries;
* ``cudnn_frontend_d256``: whether cuDNN attention (alone) runs a bfloat16 head_dim 256 forward and backward.

Each is measured in this one fresh process, in this order (the cuBLAS figures need a process that has
run no matmul). ``--smoke`` runs on the CPU: the same file with every measured value ``None``.

    PYTHONPATH=. python3 benchmarks/gpu/record_target.py --out DIR
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import header, write_measurement
from labkit.memory.trace.fake.targets import H200


def _rounded(n: int) -> int:
    return -(-n // 512) * 512


def measure(dev: str) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(dev)
    seen: dict[str, Any] = {
        "name": p.name, "sm": [p.major, p.minor], "sm_count": p.multi_processor_count,
        "max_threads_per_sm": p.max_threads_per_multi_processor,
        "torch_version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        "cudnn_version": torch.backends.cudnn.version(),
    }
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)
    one = torch.empty(1, dtype=torch.uint8, device=dev)
    seen["allocator_rounding"] = torch.cuda.memory_allocated(dev) - base
    del one
    x = torch.randn(64, 64, device=dev)
    base = torch.cuda.memory_allocated(dev)
    y = x @ x
    seen["cublas_workspace_bytes"] = torch.cuda.memory_allocated(dev) - base - _rounded(y.numel() * y.element_size())
    del x, y
    base = torch.cuda.memory_allocated(dev)
    lin = torch.nn.Linear(64, 64, device=dev)
    lin(torch.randn(8, 64, device=dev)).sum().backward()
    del lin
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(dev) - base + seen["cublas_workspace_bytes"]
    seen["cublas_handles"] = held / seen["cublas_workspace_bytes"] if seen["cublas_workspace_bytes"] else None
    q = torch.randn(1, 2, 33, 64, device=dev)
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True)
    seen["efficient_lse_block"] = out[1].shape[-1]     # 33 rows padded to the block
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 64, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        seen["cudnn_frontend_d256"] = True
    except RuntimeError:
        seen["cudnn_frontend_d256"] = False
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="on the CPU: the file's shape, no measurement")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("record_target.py: no CUDA GPU here (use --smoke to check the script on the CPU)")
    seen = {name: None for name in H200} if args.smoke else measure("cuda:0")
    check = {name: {"file": H200[name], "seen": seen.get(name), "same": seen.get(name) == H200[name]}
             for name in H200 if seen.get(name) is not None}
    cmd = "python3 benchmarks/gpu/record_target.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = write_measurement(args.out / "target.json", "target",
                             {"smoke": args.smoke, "seen": seen, "facts_check": check}, provenance=header(cmd))
    differ = [n for n, c in check.items() if not c["same"]]
    print(f"wrote {path}: {len(check)} facts seen, differing from h200.json: {differ or 'none'}", flush=True)


if __name__ == "__main__":
    main()
