"""Which kernel ``F.scaled_dot_product_attention`` picks on this GPU, over a grid of calls: JSON to argv[1].

    PYTHONPATH=. python benchmarks/gpu/record_sdpa_choice.py OUT.json

Each row is one call's shapes, dtypes, mask, flags and whether the inputs require grad, with the backend that
``torch._fused_sdp_choice`` returned for it on the GPU (the dispatcher's own choice, made by
``sdp::select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``).
tests/memory/trace/test_sdpa_choice_grid.py asks fake mode's :func:`labkit.memory.trace.fake.sdpa.select_backend`
for every row and compares (data/measurements/measure/sdpa_choice__h200.json).
"""
import itertools
import sys
import time

import torch

from labkit.core.provenance import header, write_measurement

# torch's SDPBackend enum (torch/nn/attention/__init__.py; c10 sdp::SDPBackend): -1 error, 0 math, 1 flash,
# 2 efficient, 3 cudnn, 4 overrideable
NAMES = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}

MASKS = ("none", "bool_2d", "bool_b1ss", "float_1hss", "float_1hss_grad", "float_bhss_expanded", "float_b1ss_grad",
         "float_bhss_grad")


def grid():
    """The calls: every combination below, less those SDPA itself rejects (a mask with is_causal)."""
    for dtype, S, D, mask, causal, dropout, grad, gqa in itertools.product(
            ("float32", "bfloat16", "float16"), (49, 196, 256, 1000), (32, 60, 64, 128, 256), MASKS,
            (False, True), (0.0, 0.1), (False, True), (False, True)):
        if causal and mask != "none":
            continue
        yield dict(B=2, H=4, Hkv=2 if gqa else 4, S=S, D=D, dtype=dtype, mask=mask, is_causal=causal,
                   dropout_p=dropout, grad=grad, enable_gqa=gqa)


def tensors(c: dict, device: str):
    """q, k, v and the mask of one row, on ``device`` (``meta`` in the test: only shapes, strides and flags count)."""
    dt = getattr(torch, c["dtype"])
    B, H, Hkv, S, D = c["B"], c["H"], c["Hkv"], c["S"], c["D"]
    q = torch.empty(B, H, S, D, dtype=dt, device=device, requires_grad=c["grad"])
    k = torch.empty(B, Hkv, S, D, dtype=dt, device=device, requires_grad=c["grad"])
    v = torch.empty(B, Hkv, S, D, dtype=dt, device=device, requires_grad=c["grad"])
    m = c["mask"]
    mask = None
    if m == "bool_2d":
        mask = torch.ones(S, S, dtype=torch.bool, device=device)
    elif m == "bool_b1ss":
        mask = torch.ones(B, 1, S, S, dtype=torch.bool, device=device)
    elif m.startswith("float_1hss"):
        mask = torch.zeros(1, H, S, S, dtype=dt, device=device, requires_grad=m.endswith("grad"))
    elif m == "float_bhss_expanded":
        mask = torch.zeros(1, H, S, S, dtype=dt, device=device).expand(B, H, S, S)
    elif m == "float_b1ss_grad":
        mask = torch.zeros(B, 1, S, S, dtype=dt, device=device, requires_grad=True)
    elif m == "float_bhss_grad":
        mask = torch.zeros(B, H, S, S, dtype=dt, device=device, requires_grad=True)
    return q, k, v, mask


def ran(c: dict) -> list[str]:
    """The attention ops the profiler saw when the row's call ran forward (and backward where it needs grad): a
    check that the choice above is what runs."""
    q, k, v, mask = tensors(c, "cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=c["dropout_p"],
                                                             is_causal=c["is_causal"], enable_gqa=c["enable_gqa"])
        if o.requires_grad:
            o.sum().backward()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if "attention" in e.name and e.name.startswith("aten::_")})


RAN = [dict(B=2, H=4, Hkv=4, S=S, D=32, dtype=dt, mask=m, is_causal=False, dropout_p=p, grad=True, enable_gqa=False)
       for S in (49, 196) for dt in ("float32", "bfloat16") for m in ("float_1hss_grad", "float_bhss_grad")
       for p in (0.0, 0.1)]


def main(out: str) -> None:
    rows = []
    t0 = time.time()
    for c in grid():
        q, k, v, mask = tensors(c, "cuda")
        try:
            got = NAMES[int(torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=c["dropout_p"],
                                                    is_causal=c["is_causal"], enable_gqa=c["enable_gqa"]))]
        except Exception as e:  # a call SDPA refuses outright
            got = f"raised {type(e).__name__}"
        rows.append({**c, "backend": got})
    checked = [{**c, "backend": NAMES[int(torch._fused_sdp_choice(*tensors(c, "cuda"), dropout_p=c["dropout_p"],
                is_causal=c["is_causal"], enable_gqa=c["enable_gqa"]))], "ran": ran(c)} for c in RAN]
    prov = dict(header(), cudnn=torch.backends.cudnn.version(), seconds=round(time.time() - t0, 1),
                method="torch._fused_sdp_choice per row on freshly allocated CUDA tensors, no kernel run; `ran`: the "
                       "attention ops the profiler saw for a few rows run forward and backward")
    write_measurement(out, "sdpa_choice", {"rows": rows, "ran": checked}, provenance=prov)
    print(len(rows), "rows", {b: sum(r["backend"] == b for r in rows) for b in {r["backend"] for r in rows}})


if __name__ == "__main__":
    main(sys.argv[1])
