"""cuDNN convolution workspaces in fake mode (labkit.memory.trace.conv_workspace), against the H200 recording."""

import pytest
import torch

from labkit.core.provenance import load_measurement
from labkit.memory.trace.conv_workspace import conv_workspace_bytes
from labkit.memory.trace.fake_cuda import CudaTarget
from labkit.memory.trace.recorded import measure_dir
from labkit.memory.trace.step import measure_step

MiB = 1 << 20


def _rows():
    doc = load_measurement(measure_dir() / "conv_workspace__h200.json", kind="conv_workspace")
    return [r for r in doc["data"]["rows"] if not r["cudnn_benchmark"] and "error" not in r]


def _measured(r, p):
    blocks = r[p]["transient_blocks"] or []
    return max(blocks) if blocks else 0


def _rule(r, p):
    dt = torch.float32 if r["dtype"] == "fp32" else torch.bfloat16
    return conv_workspace_bytes(p, r["input_shape"], r["weight_shape"], r["output_shape"], [r["stride"]] * 2,
                                [r["padding"]] * 2, [1, 1], r["groups"], dt)[0]


@pytest.mark.parametrize("geometry,dtype,batch,pass_", [
    ("3x3-64-56", "bf16", 64, "forward"),            # NHWC copies: input + output + weight
    ("3x3s2-128-56", "fp32", 32, "backward_data"),
    ("patch16", "bf16", 8, "forward"),               # 3 input channels padded to 8 (16-bit)
    ("1x1-512to128-28", "fp32", 64, "forward"),      # a GEMM on NCHW: none
    ("1x1-512to128-28", "bf16", 32, "backward_filter"),   # per-sample float32 weight-gradient partials
    ("dw7x7-96-56", "fp32", 64, "backward_filter"),  # PyTorch's depthwise kernel: none
])
def test_rule_matches_the_measured_workspace(geometry, dtype, batch, pass_):
    (r,) = [r for r in _rows() if (r["geometry"], r["dtype"], r["batch"]) == (geometry, dtype, batch)]
    assert abs(_rule(r, pass_) - _measured(r, pass_)) <= max(0.02 * _measured(r, pass_), 0.1 * MiB)


def test_rule_holds_for_most_measured_passes():
    res = [(_rule(r, p), _measured(r, p)) for r in _rows() for p in ("forward", "backward_data", "backward_filter")]
    ok = sum(abs(a - b) <= max(0.1 * max(a, b), 0.6 * MiB) for a, b in res)
    assert len(res) == 522 and ok >= 400, (ok, len(res))


def test_fake_mode_takes_the_workspace_inside_the_convolution():
    def run(target=None):
        rep = measure_step(lambda: torch.nn.Conv2d(64, 64, 3, padding=1), torch.randn(8, 64, 56, 56),
                           loss_fn=lambda o, b: o.sum(), steps=1, target=target)
        f = next(ph for ph in rep.by_phase if ph.phase == "forward")
        return f.peak_bytes - f.end_bytes        # what lived only inside the forward's ops

    ws = (8 * 64 * 56 * 56 * 2 + 64 * 64 * 9) * 4      # NHWC input + output + weight, float32
    assert run() == ws
    assert run(CudaTarget(cudnn_conv_workspaces=False)) == 0


def test_unmeasured_layouts_are_stated_assumptions():
    n, why = conv_workspace_bytes("forward", [8, 64, 56, 56], [64, 64, 3, 3], [8, 64, 56, 56], [1, 1], [1, 1],
                                  [1, 1], 1, torch.float32, channels_last=True)
    assert n == 0 and "channels-last" in why
    n, why = conv_workspace_bytes("forward", [8, 64, 56], [64, 64, 3], [8, 64, 56], [1], [1], [1], 1, torch.float32)
    assert n == 0 and "1-D" in why
    with pytest.raises(ValueError, match="pass_"):
        conv_workspace_bytes("sideways", [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1], [0, 0], [1, 1], 1,
                             torch.float32)


def test_rule_holds_at_larger_batches():
    doc = load_measurement(measure_dir() / "conv_workspace_batch__h200.json", kind="conv_workspace")
    rows = [r for r in doc["data"]["rows"] if "error" not in r]
    res = [(_rule(r, p), _measured(r, p)) for r in rows for p in ("forward", "backward_data", "backward_filter")]
    ok = sum(abs(a - b) <= max(0.1 * max(a, b), 0.6 * MiB) for a, b in res)
    assert len(res) == 144 and ok >= 100, (ok, len(res))


def test_rule_gives_the_workspaces_seen_in_a_traced_resnet50_step():
    """The allocator's own trace of one steady step of tv-resnet50-b128-amp-bf16 on the H200 (a reference
    case): the blocks taken and freed at once inside the forward's convolutions, against the rule applied
    to the model's convolutions in order (bf16, batch 128)."""
    import gzip
    import json

    from labkit.workloads.vision import torchvision_models

    with gzip.open(measure_dir() / "conv_trace__tv-resnet50-b128-amp-bf16.json.gz", "rt") as fh:
        ev = json.load(fh)["data"]["events"]
    seen = [e["size"] for e, nxt in zip(ev, ev[1:]) if e["action"] == "alloc" and e["size"] >= MiB
            and nxt["action"] == "free_requested" and nxt["addr"] == e["addr"] and any("conv.py" in f for f in e["frames"])]
    with torch.device("meta"):
        model = torchvision_models().resnet50(weights=None).to(torch.bfloat16)
    rule = []

    def hook(mod, inp, out):
        x = inp[0]
        rule.append(conv_workspace_bytes("forward", x.shape, mod.weight.shape, out.shape, mod.stride, mod.padding,
                                         mod.dilation, mod.groups, x.dtype)[0])

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    model(torch.empty(128, 3, 224, 224, device="meta", dtype=torch.bfloat16))
    rule = [n for n in rule if n >= MiB]
    # the first three stages block by block (stem 294 MiB, 98 MiB per 3x3 at 56x56, ...), then the total
    assert len(seen) >= 16 and all(abs(a - b) <= 0.01 * a for a, b in zip(seen[:16], rule[:16])), (seen, rule)
    assert abs(sum(rule) - sum(seen)) <= 0.1 * sum(seen)
