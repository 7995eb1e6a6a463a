"""Ground truth for the kernels of hand-built models (issue 27), recorded on the GPU:

1. **cuDNN RNN reserve and workspace** (``--part rnn``): for a grid of ``nn.LSTM`` / ``nn.GRU`` shapes
   (1 and 2 layers, hidden 256 and 1024, batch 64 (and 16), 64 and 256 steps, float32 and bfloat16,
   ``batch_first``), the reserve space ``torch._cudnn_rnn`` returns (its 4th output: a uint8 tensor of exactly
   cudnnGetRNNTempSpaceSizes' reserve bytes), and for the module's forward and backward as autograd runs them
   the bytes kept and the transient blocks (the allocator's own trace: the contiguous input copy, the
   workspaces), as ``record_vision.py`` measures convolutions (``measure_call``: the second call of each).
2. **3-D and transposed convolution workspaces** (``--part conv``): R3D-18's convolutions and a UNet's
   ``ConvTranspose2d`` (2x2, stride 2) at batch 8 and 16, float32 and bfloat16, contiguous, with
   ``cudnn.benchmark`` False: forward, backward-data and backward-filter (``torch.ops.aten.convolution`` and
   ``convolution_backward`` with ``transposed`` set where it applies), measured as ``record_vision.py``'s grid.
3. **More convolution workspaces** (``--part conv2``, not in the default parts): the same for the geometries the
   rules guess at in the corpus (``CONV_GEOMETRIES_2``: a UNet's top-level merge and its 3-channel stride-1 first
   convolution, R(2+1)D's factored 3-D convolutions, RegNet-Y's grouped ones) at batch 8, 16 and 128.
4. **The rules' open questions** (``--part conv3``, not in the default parts): ``CONV_GEOMETRIES_3`` at batch 16
   and 64: grouped 3x3 convolutions of 8, 16, 24 and 48 channels per group (are the groups' channels padded to a
   power of two?), 1x1 convolutions with odd and even output channel counts (21, 19, 58: which take the NHWC
   copies for the weight gradient?), and strided 1x1 shortcuts of 32 to 96 input channels (where does the
   no-workspace kernel stop?).
5. **1-D convolutions** (``--part conv1d``, not in the default parts): ``CONV_GEOMETRIES_1D`` at batch 8 and 64:
   PyTorch runs an ``nn.Conv1d`` / ``nn.ConvTranspose1d`` as a 2-D convolution of height 1 (``Convolution.cpp``,
   ``view1d_as_2d``); are its workspaces the 2-D rule's for that shape? The geometries: a waveform autoencoder's
   strided 8/4 convolutions and their transposes, its 1x1 head to one channel, Wav2Vec2's feature encoder (the
   10/5 stem from one channel, 3/2 and 2/2 convolutions of 512 channels) and its grouped positional convolution
   (kernel 128, 16 groups); and six of no corpus case, held out of any rule fitted on the others
   (``CONV_1D_HELD_OUT``: a TCN's stride-1 3- and 5-tap convolutions, a 4/2 convolution and its transpose, a 1x1).
6. **5x5 convolutions** (``--part conv5``, not in the default parts): ``CONV_GEOMETRIES_5`` at batch 16 and 64, with
   three geometries held out (``CONV_5_HELD_OUT``): which engine cuDNN's heuristics take for a 5x5 filter.

    PYTHONPATH=. python3 benchmarks/gpu/record_handmade.py --out DIR [--part rnn,conv,conv2,conv3,conv1d,conv5] [--smoke]

Writes (after every row: a run cut short keeps what finished) ``DIR/rnn_cudnn.json`` (kind ``cudnn_rnn``),
``DIR/conv_workspace_3d_transposed.json``, ``DIR/conv_workspace_more.json``, ``DIR/conv_workspace_rules.json``,
``DIR/conv_workspace_1d.json`` and ``DIR/conv_workspace_5x5.json`` (kind ``conv_workspace``) and ``DIR/log.txt``.
``--smoke``: one shape of each on the CPU (no memory figures), to check the script. ``--predict FILE`` with ``--part
conv1d`` or ``conv5``: fake mode's workspaces for that grid (the rules of the commit), written before it is recorded.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from labkit.core.provenance import header, write_measurement  # noqa: E402

T0 = time.perf_counter()
LOG: list[str] = []
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (mode, layers, hidden, batch, steps)
RNN_GRID = ([(m, L, h, 64, s) for m in ("lstm", "gru") for L in (1, 2) for h in (256, 1024) for s in (64, 256)]
            + [("lstm", 2, 1024, 16, 256), ("gru", 2, 1024, 16, 256)])
RNN_SMOKE = [("lstm", 2, 32, 2, 8), ("gru", 1, 32, 2, 8)]
CUDNN_MODE = {"lstm": 2, "gru": 3}       # cudnnRNNMode_t: RNN_RELU 0, RNN_TANH 1, LSTM 2, GRU 3
# (label, in channels, out channels, input spatial size, kernel, stride, padding, transposed)
CONV_GEOMETRIES: tuple[tuple[str, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], bool],
                       ...] = (
    ("r3d-stem", 3, 64, (16, 112, 112), (3, 7, 7), (1, 2, 2), (1, 3, 3), False),
    ("r3d-3x3x3-64", 64, 64, (16, 56, 56), (3, 3, 3), (1, 1, 1), (1, 1, 1), False),
    ("r3d-3x3x3s2-128", 64, 128, (16, 56, 56), (3, 3, 3), (2, 2, 2), (1, 1, 1), False),
    ("r3d-3x3x3-128", 128, 128, (8, 28, 28), (3, 3, 3), (1, 1, 1), (1, 1, 1), False),
    ("r3d-3x3x3-256", 256, 256, (4, 14, 14), (3, 3, 3), (1, 1, 1), (1, 1, 1), False),
    ("r3d-3x3x3-512", 512, 512, (2, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), False),
    ("r3d-down1x1x1s2-128", 64, 128, (16, 56, 56), (1, 1, 1), (2, 2, 2), (0, 0, 0), False),
    ("unet-up-1024", 1024, 512, (16, 16), (2, 2), (2, 2), (0, 0), True),
    ("unet-up-512", 512, 256, (32, 32), (2, 2), (2, 2), (0, 0), True),
    ("unet-up-256", 256, 128, (64, 64), (2, 2), (2, 2), (0, 0), True),
    ("unet-up-128", 128, 64, (128, 128), (2, 2), (2, 2), (0, 0), True),
    ("unet-3x3-64-256", 64, 64, (256, 256), (3, 3), (1, 1), (1, 1), False),
)
# ``--part conv2`` (issue 27, second batch): the geometries the rules guess at in the corpus: a UNet's top-level
# merge (128 -> 64 at 256x256) and its 3-channel stride-1 first convolution, R(2+1)D's factored 3-D convolutions
# (1x7x7/2 stem, 1x3x3 spatial, 3x1x1 temporal), and RegNet-Y's grouped 3x3 convolutions (group width 24; the
# reference tv-regnet_y_1_6gf-b128-fp32's reserved is 9.5% high), at batch 8, 16 and 128; the 9th field: groups
CONV_GEOMETRIES_2: tuple = (
    ("unet-3x3-128to64-256", 128, 64, (256, 256), (3, 3), (1, 1), (1, 1), False),
    ("unet-stem-3x3-3to64-256", 3, 64, (256, 256), (3, 3), (1, 1), (1, 1), False),
    ("r2p1d-stem-1x7x7s2-45", 3, 45, (16, 112, 112), (1, 7, 7), (1, 2, 2), (0, 3, 3), False),
    ("r2p1d-1x3x3-64to144", 64, 144, (16, 56, 56), (1, 3, 3), (1, 1, 1), (0, 1, 1), False),
    ("r2p1d-3x1x1-144to64", 144, 64, (16, 56, 56), (3, 1, 1), (1, 1, 1), (1, 0, 0), False),
    ("regnet-g2-3x3s2-48-112", 48, 48, (112, 112), (3, 3), (2, 2), (1, 1), False, 2),
    ("regnet-g2-3x3-48-56", 48, 48, (56, 56), (3, 3), (1, 1), (1, 1), False, 2),
    ("regnet-g5-3x3s2-120-56", 120, 120, (56, 56), (3, 3), (2, 2), (1, 1), False, 5),
)
CONV_BATCHES_2 = (8, 16, 128)
# ``--part conv3`` (issue 27, third batch): the open questions of the rules in fake/conv_workspace.py
CONV_GEOMETRIES_3: tuple = (
    ("g-w8-3x3-64-56", 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), False, 8),
    ("g-w16-3x3-128-28", 128, 128, (28, 28), (3, 3), (1, 1), (1, 1), False, 8),
    ("g-w16-3x3s2-64-112", 64, 64, (112, 112), (3, 3), (2, 2), (1, 1), False, 4),
    ("g-w24-3x3-96-28", 96, 96, (28, 28), (3, 3), (1, 1), (1, 1), False, 4),
    ("g-w24-3x3s2-72-56", 72, 72, (56, 56), (3, 3), (2, 2), (1, 1), False, 3),
    ("g-w48-3x3-192-28", 192, 192, (28, 28), (3, 3), (1, 1), (1, 1), False, 4),
    ("1x1-64to21-256", 64, 21, (256, 256), (1, 1), (1, 1), (0, 0), False),
    ("1x1-64to19-128", 64, 19, (128, 128), (1, 1), (1, 1), (0, 0), False),
    ("1x1-256to21-64", 256, 21, (64, 64), (1, 1), (1, 1), (0, 0), False),
    ("1x1-64to58-56", 64, 58, (56, 56), (1, 1), (1, 1), (0, 0), False),
    ("1x1-58to58-28", 58, 58, (28, 28), (1, 1), (1, 1), (0, 0), False),
    ("1x1s2-32to64-112", 32, 64, (112, 112), (1, 1), (2, 2), (0, 0), False),
    ("1x1s2-48to96-56", 48, 96, (56, 56), (1, 1), (2, 2), (0, 0), False),
    ("1x1s2-64to128-56", 64, 128, (56, 56), (1, 1), (2, 2), (0, 0), False),
    ("1x1s2-96to192-56", 96, 192, (56, 56), (1, 1), (2, 2), (0, 0), False),
)
CONV_BATCHES_3 = (16, 64)
# ``--part conv1d`` (issue 27, fifth batch): 1-D convolutions (kernel, stride, padding as 1-tuples)
CONV_GEOMETRIES_1D: tuple = (
    ("1d-k8s4-64to128-8192", 64, 128, (8192,), (8,), (4,), (2,), False),
    ("1d-k8s4-128to256-2048", 128, 256, (2048,), (8,), (4,), (2,), False),
    ("1d-k8s4-256to512-512", 256, 512, (512,), (8,), (4,), (2,), False),
    ("1d-k8s4-512to512-128", 512, 512, (128,), (8,), (4,), (2,), False),
    ("1d-T-k8s4-64to64-8192", 64, 64, (8192,), (8,), (4,), (2,), True),
    ("1d-T-k8s4-128to64-2048", 128, 64, (2048,), (8,), (4,), (2,), True),
    ("1d-T-k8s4-512to256-128", 512, 256, (128,), (8,), (4,), (2,), True),
    ("1d-1x1-64to1-32768", 64, 1, (32768,), (1,), (1,), (0,), False),
    ("1d-k10s5-1to512-160000", 1, 512, (160000,), (10,), (5,), (0,), False),
    ("1d-k3s2-512to512-31999", 512, 512, (31999,), (3,), (2,), (0,), False),
    ("1d-k3s2-512to512-3999", 512, 512, (3999,), (3,), (2,), (0,), False),
    ("1d-k2s2-512to512-1999", 512, 512, (1999,), (2,), (2,), (0,), False),
    ("1d-k128-g16-768-499", 768, 768, (499,), (128,), (1,), (64,), False, 16),
    ("1d-k3-256to256-4096", 256, 256, (4096,), (3,), (1,), (1,), False),
    ("1d-k3-64to64-16384", 64, 64, (16384,), (3,), (1,), (1,), False),
    ("1d-k5-128to128-8192", 128, 128, (8192,), (5,), (1,), (2,), False),
    ("1d-k4s2-128to256-4096", 128, 256, (4096,), (4,), (2,), (1,), False),
    ("1d-T-k4s2-256to128-2048", 256, 128, (2048,), (4,), (2,), (1,), True),
    ("1d-1x1-256to256-4096", 256, 256, (4096,), (1,), (1,), (0,), False),
)
CONV_BATCHES_1D = (8, 64)
# ``--part conv5`` (issue 27, fifth batch): Inception-v3's 5x5 convolutions, whose float32 weight gradient took 250 MiB
# in its H200 stream where the NHWC rule gives 38, with 5x5s of other widths and sizes, and its 1x7 / 7x1 and 3x3 ones
CONV_GEOMETRIES_5: tuple = (
    ("5x5-48to64-35", 48, 64, (35, 35), (5, 5), (1, 1), (2, 2), False),
    ("5x5-64to64-56", 64, 64, (56, 56), (5, 5), (1, 1), (2, 2), False),
    ("5x5-32to32-112", 32, 32, (112, 112), (5, 5), (1, 1), (2, 2), False),
    ("5x5-128to128-28", 128, 128, (28, 28), (5, 5), (1, 1), (2, 2), False),
    ("5x5-96to96-17", 96, 96, (17, 17), (5, 5), (1, 1), (2, 2), False),
    ("5x5s2-64to128-56", 64, 128, (56, 56), (5, 5), (2, 2), (2, 2), False),
    ("3x3-96to96-35", 96, 96, (35, 35), (3, 3), (1, 1), (1, 1), False),
    ("1x7-128to128-17", 128, 128, (17, 17), (1, 7), (1, 1), (0, 3), False),
    ("7x1-128to192-17", 128, 192, (17, 17), (7, 1), (1, 1), (3, 0), False),
)
CONV_BATCHES_5 = (16, 64)
# held out: a third of the geometries, none of Inception-v3's own
CONV_5_HELD_OUT = ("5x5-64to64-56", "5x5-128to128-28", "5x5s2-64to128-56")
# held out: the six geometries of no corpus case (a third of the grid)
CONV_1D_HELD_OUT = ("1d-k3-256to256-4096", "1d-k3-64to64-16384", "1d-k5-128to128-8192", "1d-k4s2-128to256-4096",
                    "1d-T-k4s2-256to128-2048", "1d-1x1-256to256-4096")
CONV_SMOKE = ("r3d-3x3x3-512", "unet-up-1024", "r2p1d-3x1x1-144to64", "regnet-g5-3x3s2-120-56", "g-w24-3x3-96-28",
              "1x1-64to21-256", "1d-k8s4-64to128-8192", "1d-T-k8s4-64to64-8192", "1d-k128-g16-768-499",
              "5x5-48to64-35")
CONV_BATCHES = (8, 16)


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


def rnn_probe(mode: str, layers: int, hidden: int, batch: int, steps: int, dtype_name: str, device: str) -> dict:
    from record_vision import measure_call

    dt = DTYPES[dtype_name]
    cuda = device == "cuda"
    row: dict[str, Any] = {"mode": mode, "layers": layers, "hidden": hidden, "input_size": hidden, "batch": batch,
                           "steps": steps, "dtype": dtype_name, "batch_first": True, "bidirectional": False}
    try:
        cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
        with torch.device(device):
            m = cls(hidden, hidden, layers, batch_first=True).to(dt)
        m.train()
        x = torch.randn(batch, steps, hidden, device=device, dtype=dt, requires_grad=True)
        if cuda:
            h0 = torch.zeros(layers, batch, hidden, device=device, dtype=dt)
            c0 = torch.zeros_like(h0) if mode == "lstm" else None
            out = torch._cudnn_rnn(x, m._flat_weights, 4, None, h0, c0, CUDNN_MODE[mode], hidden, 0, layers, True,
                                   0.0, True, False, [], None)
            row["reserve_bytes"] = int(out[3].numel() * out[3].element_size())
            row["weight_buf_numel"] = int(out[4].numel()) if out[4] is not None else None
            del out
        row["forward"] = measure_call(lambda: m(x)[0], cuda)
        y = m(x)[0]
        gy = torch.randn_like(y)
        row["backward"] = measure_call(lambda: torch.autograd.grad(y, [x] + list(m.parameters()), gy,
                                                                   retain_graph=True), cuda)
        del y, gy, x, m
    except Exception as exc:  # noqa: BLE001 - one failing shape must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if cuda:
        torch.cuda.empty_cache()
    return row


def rnn_section(device: str, smoke: bool, save: Any = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for shape in (RNN_SMOKE if smoke else RNN_GRID):
        for dtype_name in (("fp32",) if smoke else DTYPES):
            r = rnn_probe(*shape, dtype_name, device)
            rows.append(r)
            log(f"rnn {shape} {dtype_name}: reserve {r.get('reserve_bytes')}, fwd transient "
                f"{(r.get('forward') or {}).get('transient_blocks')}{' ' + r['error'] if 'error' in r else ''}")
            if save:
                save(_rnn_doc(device, smoke, rows))
    return _rnn_doc(device, smoke, rows)


def _rnn_doc(device: str, smoke: bool, rows: list) -> dict[str, Any]:
    return {"device": device, "smoke": smoke, "method": __doc__.split("\n\n")[1],
            "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "rows": rows}


def conv_probe(geom: tuple, n: int, dtype_name: str, device: str) -> dict[str, Any]:
    from record_vision import measure_call

    label, cin, cout, size, k, s, p, transposed = geom[:8]
    groups = geom[8] if len(geom) > 8 else 1
    dt = DTYPES[dtype_name]
    cuda = device == "cuda"
    x = torch.randn(n, cin, *size, device=device, dtype=dt)
    # a transposed convolution's weight is (in, out, *k); an ordinary one's (out, in, *k)
    w = torch.randn(*((cin, cout // groups) if transposed else (cout, cin // groups)), *k, device=device, dtype=dt)
    nd = len(size)
    dil, outpad = [1] * nd, [0] * nd
    row: dict[str, Any] = {"geometry": label, "batch": n, "dtype": dtype_name, "in_channels": cin,
                           "out_channels": cout, "spatial": list(size), "kernel": list(k), "stride": list(s),
                           "padding": list(p), "transposed": transposed, "groups": groups,
                           "input_shape": list(x.shape), "weight_shape": list(w.shape)}
    conv, bwd = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
    try:
        y = conv(x, w, None, list(s), list(p), dil, transposed, outpad, groups)
        row["output_shape"] = list(y.shape)
        gy = torch.randn_like(y)
        passes = {"forward": lambda: conv(x, w, None, list(s), list(p), dil, transposed, outpad, groups),
                  "backward_data": lambda: bwd(gy, x, w, None, list(s), list(p), dil, transposed, outpad, groups,
                                               [True, False, False]),
                  "backward_filter": lambda: bwd(gy, x, w, None, list(s), list(p), dil, transposed, outpad, groups,
                                                 [False, True, False])}
        for name, fn in passes.items():
            row[name] = measure_call(fn, cuda)
        del y, gy
    except Exception as exc:  # noqa: BLE001 - one failing geometry must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    del x, w
    if cuda:
        torch.cuda.empty_cache()
    return row


def conv_section(device: str, smoke: bool, save: Any = None, geometries: tuple = CONV_GEOMETRIES,
                 batches: tuple = CONV_BATCHES) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for geom in geometries:
        if smoke:
            label, cin, cout, size, k, s, p, t = geom[:8]
            if label not in CONV_SMOKE:
                continue
            g = geom[8] if len(geom) > 8 else 1
            geom = (label, max(g, cin // 16 // g * g), max(g, cout // 16 // g * g), tuple(max(2, d // 4) for d in size),
                    k, s, p, t, g)
        for dtype_name in (("fp32",) if smoke else DTYPES):
            for n in ((2,) if smoke else batches):
                r = conv_probe(geom, n, dtype_name, device)
                rows.append(r)
                log(f"conv {geom[0]} n={n} {dtype_name}: transient fwd "
                    f"{(r.get('forward') or {}).get('transient_peak_bytes')}, data "
                    f"{(r.get('backward_data') or {}).get('transient_peak_bytes')}, filter "
                    f"{(r.get('backward_filter') or {}).get('transient_peak_bytes')}"
                    f"{' ' + r['error'] if 'error' in r else ''}")
                if save:
                    save(_conv_doc(device, smoke, rows))
    return _conv_doc(device, smoke, rows)


def _conv_doc(device: str, smoke: bool, rows: list) -> dict[str, Any]:
    return {"device": device, "smoke": smoke, "method": __doc__.split("\n\n")[1],
            "settings": {"cudnn_benchmark_default": torch.backends.cudnn.benchmark,
                         "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                         else None},
            "rows": rows}


def predict_rows(geometries: tuple, batches: tuple) -> list[dict[str, Any]]:
    """Fake mode's workspace bytes (``conv_workspace_bytes``, the rules of this commit) for every row a conv part
    records, before it is recorded: shapes from meta tensors, no device needed."""
    from labkit.memory.trace.fake.conv_workspace import conv_workspace_bytes

    rows = []
    for geom in geometries:
        label, cin, cout, size, k, s, p, transposed = geom[:8]
        groups = geom[8] if len(geom) > 8 else 1
        for dtype_name, dt in DTYPES.items():
            for n in batches:
                x = torch.empty(n, cin, *size, device="meta", dtype=dt)
                w = torch.empty(*((cin, cout // groups) if transposed else (cout, cin // groups)), *k, device="meta",
                                dtype=dt)
                nd = len(size)
                y = torch.ops.aten.convolution(x, w, None, list(s), list(p), [1] * nd, transposed, [0] * nd, groups)
                row = {"geometry": label, "batch": n, "dtype": dtype_name, "input_shape": list(x.shape),
                       "weight_shape": list(w.shape), "output_shape": list(y.shape)}
                for pass_ in ("forward", "backward_data", "backward_filter"):
                    row[pass_] = conv_workspace_bytes(pass_, x.shape, w.shape, y.shape, s, p, [1] * nd, groups, dt,
                                                      transposed=transposed)[0]
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--part", default="rnn,conv", help="comma-separated: rnn, conv, conv2, conv3, conv1d, conv5")
    ap.add_argument("--smoke", action="store_true", help="one shape of each on the CPU (checks the script)")
    ap.add_argument("--predict", type=Path,
                    help="write fake mode's predicted workspaces of --part conv1d or conv5 to this file and stop")
    args = ap.parse_args(argv)
    parts = set(args.part.split(","))
    if parts - {"rnn", "conv", "conv2", "conv3", "conv1d", "conv5"}:
        ap.error(f"--part {args.part!r}: the parts are rnn, conv, conv2, conv3, conv1d and conv5")
    args.out.mkdir(parents=True, exist_ok=True)
    import record_plain

    if args.predict:
        if len(parts & {"conv1d", "conv5"}) != 1:
            ap.error("--predict: give one --part, conv1d or conv5")
        grid, batches, held = ((CONV_GEOMETRIES_1D, CONV_BATCHES_1D, CONV_1D_HELD_OUT) if "conv1d" in parts
                               else (CONV_GEOMETRIES_5, CONV_BATCHES_5, CONV_5_HELD_OUT))
        cmd = "python3 benchmarks/gpu/record_handmade.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        write_measurement(args.predict, "conv_workspace_predicted",
                          {"rule": "labkit.memory.trace.fake.conv_workspace.conv_workspace_bytes",
                           "held_out": list(held), "rows": predict_rows(grid, batches)},
                          provenance=header(cmd))
        return 0

    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    cmd = "python3 benchmarks/gpu/record_handmade.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    prov.update(record_plain.versions())
    log(f"device {device}; torch {torch.__version__}; {prov.get('gpu_name')}; cudnn {prov.get('cudnn')}")
    try:
        # each file is rewritten after every row: a run cut short keeps what finished
        if "rnn" in parts:
            rnn_section(device, args.smoke, lambda doc: write_measurement(args.out / "rnn_cudnn.json", "cudnn_rnn",
                                                                          doc, provenance=prov))
        if "conv" in parts:
            conv_section(device, args.smoke, lambda doc: write_measurement(
                args.out / "conv_workspace_3d_transposed.json", "conv_workspace", doc, provenance=prov))
        if "conv2" in parts:
            conv_section(device, args.smoke, lambda doc: write_measurement(
                args.out / "conv_workspace_more.json", "conv_workspace", doc, provenance=prov), CONV_GEOMETRIES_2,
                CONV_BATCHES_2)
        if "conv3" in parts:
            conv_section(device, args.smoke, lambda doc: write_measurement(
                args.out / "conv_workspace_rules.json", "conv_workspace", doc, provenance=prov), CONV_GEOMETRIES_3,
                CONV_BATCHES_3)
        if "conv1d" in parts:
            conv_section(device, args.smoke, lambda doc: write_measurement(
                args.out / "conv_workspace_1d.json", "conv_workspace", {**doc, "held_out": list(CONV_1D_HELD_OUT)},
                provenance=prov), CONV_GEOMETRIES_1D, CONV_BATCHES_1D)
        if "conv5" in parts:
            conv_section(device, args.smoke, lambda doc: write_measurement(
                args.out / "conv_workspace_5x5.json", "conv_workspace", {**doc, "held_out": list(CONV_5_HELD_OUT)},
                provenance=prov), CONV_GEOMETRIES_5, CONV_BATCHES_5)
        log("done: " + ", ".join(sorted(parts)))
    finally:
        (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
