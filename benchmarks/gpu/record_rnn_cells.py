"""What nn.LSTMCell, nn.GRUCell and nn.RNNCell keep and peak at on a GPU, and two autocast choices (rms_norm on a
bfloat16 input beside a float32 weight, Tensor.norm): JSON rows written to argv[1].

    python benchmarks/gpu/record_rnn_cells.py OUT.json

It ran on the H200 on 2026-12-03 as a single module-level script; here the same operations are split into
:func:`run` (one cell, ``steps`` steps, forward then backward) and :func:`main`, so that
tests/memory/trace/test_rnn_cells.py can run :func:`run` on the fake GPU and compare with the recording
(data/measurements/measure/rnn_cells__h200.json).
"""
import json
import sys

import torch
import torch.nn as nn


def run(kind: str, B: int, I: int, H: int, steps: int, amp: bool) -> dict:
    """Bytes allocated beyond the start after each of the first three steps, after the forward, the forward's and the
    backward's peaks, and after the backward, for ``steps`` steps of one cell over a (steps, B, I) input."""
    torch.manual_seed(0)
    cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn": nn.RNNCell}[kind](I, H).cuda()
    x = torch.randn(steps, B, I, device="cuda", requires_grad=True)
    h = torch.zeros(B, H, device="cuda")
    c = torch.zeros(B, H, device="cuda")
    torch.cuda.synchronize()
    a0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    allocs = []
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        outs = []
        for t in range(steps):
            if kind == "lstm":
                h, c = cell(x[t], (h, c))
            else:
                h = cell(x[t], h)
            outs.append(h)
            allocs.append(torch.cuda.memory_allocated() - a0)
        loss = torch.stack(outs).float().sum()
    a1 = torch.cuda.memory_allocated() - a0
    p1 = torch.cuda.max_memory_allocated() - a0
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    p2 = torch.cuda.max_memory_allocated() - a0
    row = dict(kind=kind, B=B, I=I, H=H, steps=steps, amp=amp, h_dtype=str(h.dtype), after_fwd=a1, fwd_peak=p1,
               bwd_peak=p2, per_step=allocs[:3], after_bwd=torch.cuda.memory_allocated() - a0)
    del cell, x, h, c, outs, loss
    torch.cuda.empty_cache()
    return row


CASES = [*[(kind, 256, 512, 1024, 8, amp) for kind in ("lstm", "gru", "rnn") for amp in (False, True)],
         ("lstm", 100, 300, 700, 5, False), ("gru", 100, 300, 700, 5, True)]


def main(out: str) -> None:
    res = [run(*case) for case in CASES]
    n = nn.RMSNorm(1024).cuda()
    xb = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a0 = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = n(xb)
    res.append(dict(kind="rms_norm_amp_bf16_in_fp32_w", out_dtype=str(y.dtype),
                    kept=torch.cuda.memory_allocated() - a0 - y.untyped_storage().nbytes()))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16).norm(dim=-1)
    res.append(dict(kind="norm_amp", out_dtype=str(z.dtype)))
    json.dump({"torch": torch.__version__, "rows": res}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
