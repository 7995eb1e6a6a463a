"""For every aten op, the dispatch keys with a kernel registered in this torch build (JSON to argv[1]).

    python benchmarks/gpu/record_dispatch_keys.py OUT.json

Run on the H200 (torch 2.11, CUDA build) on 2026-12-03; data/measurements/measure/dispatch_keys__h200.json keeps two
lists from it: the ops with an AutocastCUDA kernel (CUDA autocast's lists, which tests/memory/trace/
test_autocast_lists.py holds fake mode's lists to) and the ops with a CUDA kernel (where a CPU build composes what
the GPU runs as one kernel, such as _fused_rms_norm and _thnn_fused_lstm_cell)."""
import json, re, sys
import torch
out = {}
for name in torch._C._dispatch_get_all_op_names():
    if not name.startswith("aten::"):
        continue
    try:
        dump = torch._C._dispatch_dump(name)
    except Exception:
        continue
    keys = sorted({m.group(1) for m in re.finditer(r"^([A-Za-z0-9_]+)(?:\[alias\])?: registered", dump, re.M)})
    out[name] = keys
json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "ops": out}, open(sys.argv[1], "w"))
print(len(out))
