"""Ground truth for cuDNN's recurrent layers (issue 27): the workspace and reserve bytes ``_cudnn_rnn`` and its
backward take, over a grid wider than ``record_handmade.py --part rnn`` (which had unidirectional LSTM/GRU only).

For every configuration of :data:`GRID` (LSTM, GRU, RNN-tanh/relu; 1-3 layers; uni- and bidirectional; hidden 64 to
2048, input sizes of their own, batch 16-128, 64-512 steps, float32 / bfloat16 / float16 (what autocast runs:
``AutocastRNN.cpp`` casts to kHalf), packed (``batch_sizes`` from a fixed spread of lengths) and not, ``proj_size``,
inter-layer dropout), the ATen ops are called directly on contiguous, sequence-major inputs, so that the only
blocks a call takes and frees inside itself are cuDNN's workspaces (``aten/src/ATen/native/cudnn/RNN.cpp``):

* ``torch._cudnn_rnn`` with ``train=True``: the reserve (its 4th output, exactly cudnnGetRNNTempSpaceSizes'
  reserve bytes) and the forward workspace (the block taken and freed inside the call);
* ``torch.ops.aten._cudnn_rnn_backward``: its two workspaces (``_cudnn_rnn_backward_input``'s, then
  ``_cudnn_rnn_backward_weight``'s);
* ``torch._cudnn_rnn`` with ``train=False`` (a module in ``eval()``, as under ``inference_mode``): the inference
  workspace, and that no reserve is taken.

Each call runs twice and the second is measured with the caching allocator's own trace
(``torch.cuda.memory._record_memory_history``: every block's size as the allocator took it, rounded to 512 bytes),
all in one process (the sizes are cuDNN's answers to the descriptors; nothing depends on the process's history).
Also the bytes of cuDNN's dropout state (``torch._cudnn_init_dropout_state``, which ``RNN.cpp``'s
``get_dropout_state`` allocates once per process for a training RNN with inter-layer dropout) and the
algorithm ``RNN.cpp``'s ``get_algo`` picks for each configuration on this GPU (its heuristics, in Python).

    PYTHONPATH=. python3 benchmarks/gpu/record_rnn.py --out DIR [--budget 240] [--smoke]
    PYTHONPATH=. python3 benchmarks/gpu/record_rnn.py --predict-to FILE

Writes ``DIR/rnn_grid.json`` (kind ``cudnn_rnn_grid``; rewritten after every row: a run cut short keeps what
finished) and ``DIR/log.txt``. ``--smoke``: three tiny configurations through the modules on the CPU (no memory
figures), to check the script. ``--predict-to``: the rules of ``labkit/memory/trace/fake/cudnn_rnn.py`` for every
configuration, written before the recording (kind ``cudnn_rnn_grid_predicted``); each row names its split
(``labkit.workloads.corpus.split_of``: a third held out of any fitting by a hash of the name).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from labkit.core.provenance import header, write_measurement  # noqa: E402

T0 = time.perf_counter()
LOG: list[str] = []
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CUDNN_MODE = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}     # cudnnRNNMode_t


class Config(NamedTuple):
    mode: str
    layers: int
    dirs: int
    hidden: int
    input_size: int
    batch: int
    seq: int
    dtype: str
    packed: bool = False
    proj: int = 0
    dropout: float = 0.0

    @property
    def name(self) -> str:
        return (f"{self.mode}-L{self.layers}-D{self.dirs}-H{self.hidden}-I{self.input_size}-B{self.batch}-S{self.seq}"
                f"-{self.dtype}{'-packed' if self.packed else ''}{f'-P{self.proj}' if self.proj else ''}"
                f"{f'-drop{self.dropout}' if self.dropout else ''}")


def lengths(batch: int, seq: int) -> list[int]:
    """The packed batches' lengths: a fixed spread from ``seq`` down to about a quarter of it, sorted (as
    ``pack_padded_sequence`` sorts them)."""
    return sorted((seq - (i * 37) % (3 * seq // 4 + 1) for i in range(batch)), reverse=True)


def batch_sizes(lens: list[int]) -> list[int]:
    return [sum(1 for n in lens if n > t) for t in range(max(lens))]


def _grid() -> list[Config]:
    g: list[Config] = []
    modes = ("lstm", "gru", "rnn_tanh")
    # A. the layouts: mode x layers x directions x dtype at one size (hidden 512, batch 64, 128 steps)
    for m in modes:
        for L in (1, 2, 3):
            for D in (1, 2):
                for dt in ("fp32", "fp16"):
                    g.append(Config(m, L, D, 512, 512, 64, 128, dt))
    # B. what the sizes scale with, one factor at a time around a 2-layer bidirectional layer (and a 1-layer
    # unidirectional one), float32
    for m in ("lstm", "gru"):
        for L, D in ((2, 2), (1, 1)):
            for h in (256, 1024, 2048):
                g.append(Config(m, L, D, h, h, 64, 128, "fp32"))
            for b in (16, 128):
                g.append(Config(m, L, D, 512, 512, b, 128, "fp32"))
            for s in (64, 512):
                g.append(Config(m, L, D, 512, 512, 64, s, "fp32"))
            for i in (300, 1024):
                g.append(Config(m, L, D, 512, i, 64, 128, "fp32"))
    g += [Config("rnn_tanh", 2, 2, 1024, 1024, 64, 128, "fp32"), Config("rnn_tanh", 2, 2, 512, 512, 128, 256, "fp32"),
          Config("rnn_relu", 2, 2, 512, 512, 64, 128, "fp32"), Config("rnn_relu", 1, 1, 1024, 1024, 64, 128, "fp16")]
    # C. bfloat16 weights (a model cast with .to(torch.bfloat16))
    for m in modes:
        g += [Config(m, 2, 2, 512, 512, 64, 128, "bf16"), Config(m, 1, 1, 1024, 1024, 32, 256, "bf16")]
    # D. packed input (no persistent algorithm: RNN.cpp's get_algo)
    for m in modes:
        for L in (1, 2):
            for D in (1, 2):
                for dt in ("fp32", "fp16"):
                    g.append(Config(m, L, D, 512, 512, 64, 128, dt, packed=True))
        g += [Config(m, 2, 2, 1024, 768, 32, 256, "fp32", packed=True),
              Config(m, 3, 2, 256, 256, 128, 64, "fp16", packed=True)]
    # E. small hidden sizes (RNN.cpp: CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H below 192/128 for LSTM/GRU, 384/256
    # for plain RNNs)
    for m in modes:
        for h in (64, 128, 192, 384):
            g.append(Config(m, 1, 1, h, h, 64, 128, "fp32"))
            g.append(Config(m, 2, 2, h, h, 32, 256, "fp16"))
    # F. float16, one unidirectional layer, hidden a multiple of 128 (CUDNN_RNN_ALGO_PERSIST_STATIC for LSTM and
    # plain RNNs at batch <= 128, a multiple of 8)
    for m in ("lstm", "rnn_tanh", "gru"):
        for h, b in ((1024, 64), (512, 128), (768, 96), (1024, 200)):
            g.append(Config(m, 1, 1, h, h, b, 128, "fp16"))
    # G. LSTM with projections (the standard algorithm)
    for L, D, dt in ((1, 1, "fp32"), (2, 1, "fp32"), (2, 2, "fp32"), (2, 2, "fp16"), (3, 1, "fp16")):
        g.append(Config("lstm", L, D, 1024, 512, 64, 128, dt, proj=256))
    # H. inter-layer dropout
    for m, L, D in (("lstm", 2, 1), ("lstm", 3, 2), ("gru", 2, 2), ("rnn_tanh", 2, 1)):
        g.append(Config(m, L, D, 512, 512, 64, 128, "fp32", dropout=0.2))
    seen: set[Config] = set()
    return [c for c in g if not (c in seen or seen.add(c))]


GRID = _grid()
SMOKE = [Config("lstm", 2, 2, 16, 8, 3, 5, "fp32"), Config("gru", 1, 1, 16, 16, 3, 5, "fp32", packed=True),
         Config("lstm", 1, 2, 16, 8, 3, 5, "fp32", proj=8)]


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


def get_algo(c: Config, forward: bool) -> str:
    """``RNN.cpp``'s ``get_algo`` for this configuration on the current GPU (its heuristics, in Python)."""
    if c.proj:
        return "standard"
    if not c.packed:
        prop = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
        if prop is not None and prop.major >= 6:
            small = {True: (384, 192), False: (256, 128)}[forward]
            if c.hidden <= (small[0] if c.mode.startswith("rnn") else small[1]):
                return "persist_static_small_h"
        if c.dtype == "fp16" and prop is not None:
            common = (c.layers == 1 and c.hidden <= 1024 and c.dirs == 1 and c.hidden % 128 == 0
                      and c.input_size % 128 == 0)
            device = False
            if prop.major == 7:
                device = prop.minor != 5 and (((c.batch % 16 == 0 and c.batch not in (80, 112)) or c.batch == 8) and (
                    (c.seq >= 40 and c.batch <= 128) or (c.seq >= 20 and c.batch <= 96)
                    or (c.seq >= 10 and c.batch <= 32)))
            elif prop.major >= 8 and prop.multi_processor_count >= 98 and prop.minor != 6:
                if c.mode == "gru":
                    device = False
                elif c.mode == "lstm":
                    device = c.batch % 8 == 0 and c.batch <= 128
                else:
                    device = c.batch % 8 == 0 and c.batch <= 128 and (c.batch < 96 or c.hidden < 896)
            if common and device:
                return "persist_static"
    return "standard"


def _module(c: Config, device: str) -> torch.nn.Module:
    kw: dict[str, Any] = dict(num_layers=c.layers, bidirectional=c.dirs == 2, dropout=c.dropout)
    if c.mode == "lstm":
        m = torch.nn.LSTM(c.input_size, c.hidden, proj_size=c.proj, **kw)
    elif c.mode == "gru":
        m = torch.nn.GRU(c.input_size, c.hidden, **kw)
    else:
        m = torch.nn.RNN(c.input_size, c.hidden, nonlinearity=c.mode[4:], **kw)
    return m.to(device=device, dtype=DTYPES[c.dtype])


def probe(c: Config, device: str) -> dict[str, Any]:
    from record_vision import AllocTrace

    row: dict[str, Any] = {"name": c.name, **c._asdict(), "algo_forward": get_algo(c, True),
                           "algo_backward": get_algo(c, False)}
    dt, cuda = DTYPES[c.dtype], device == "cuda"
    lens = lengths(c.batch, c.seq) if c.packed else None
    sizes = batch_sizes(lens) if lens else []
    if lens:
        row["tokens"] = sum(lens)
    try:
        m = _module(c, device)
        out_h = c.proj or c.hidden
        x = torch.randn(sum(lens) if lens else c.seq, *(() if lens else (c.batch,)), c.input_size, device=device,
                        dtype=dt)
        h0 = torch.zeros(c.layers * c.dirs, c.batch, out_h, device=device, dtype=dt)
        c0 = torch.zeros(c.layers * c.dirs, c.batch, c.hidden, device=device, dtype=dt) if c.mode == "lstm" else None
        if not cuda:                               # --smoke: the module on the CPU, no memory figures
            m.train()
            inp = torch.nn.utils.rnn.PackedSequence(x, torch.tensor(sizes)) if lens else x
            y = m(inp, (h0, c0) if c0 is not None else h0)[0]
            (y.data if lens else y).sum().backward()
            row["smoke_output_shape"] = list((y.data if lens else y).shape)
            return row
        w = m._flat_weights
        stride0 = len(w) // (c.layers * c.dirs)
        wbuf = None
        state = None
        if c.dropout:
            state = torch._cudnn_init_dropout_state(c.dropout, True, 0, dtype=torch.uint8, device=device)
            row["dropout_state_bytes"] = state.numel()

        def fwd(train: bool) -> Any:
            return torch._cudnn_rnn(x, w, stride0, wbuf, h0, c0, CUDNN_MODE[c.mode], c.hidden, c.proj, c.layers,
                                    False, c.dropout, train, c.dirs == 2, sizes, state)

        def measured(fn: Any) -> tuple[Any, list[int] | None, list[int] | None]:
            fn()
            torch.cuda.synchronize()
            with AllocTrace(True) as tr:
                out = fn()
                torch.cuda.synchronize()
            return out, tr.transients(), tr.allocs()

        out, tr, allocs = measured(lambda: fwd(True))
        y, hy, cy, reserve, new_wbuf = out
        wbuf = new_wbuf                     # the flat buffer the call made: later calls view it (no copy)
        row["reserve_bytes"] = reserve.numel()
        row["forward"] = {"transient_blocks": tr, "alloc_blocks": allocs}
        gy, ghy = torch.randn_like(y), torch.zeros_like(hy)
        gcy = torch.zeros_like(cy) if c0 is not None else None
        mask = [True, True, c0 is not None, True]

        def bwd() -> Any:
            return torch.ops.aten._cudnn_rnn_backward.default(
                x, w, stride0, wbuf, h0, c0, y, gy, ghy, gcy, CUDNN_MODE[c.mode], c.hidden, c.proj, c.layers,
                False, c.dropout, True, c.dirs == 2, sizes, state, reserve, mask)

        _, tr, allocs = measured(bwd)
        row["backward"] = {"transient_blocks": tr, "alloc_blocks": allocs}
        del out, y, hy, cy, reserve, gy, ghy, gcy
        out, tr, allocs = measured(lambda: fwd(False))
        row["inference_reserve_bytes"] = out[3].numel()
        row["inference"] = {"transient_blocks": tr, "alloc_blocks": allocs}
        del out, m, x, h0, c0, w, wbuf
    except Exception as exc:  # noqa: BLE001 - one failing configuration must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if cuda:
        torch.cuda.empty_cache()
    return row


def predict_rows() -> list[dict[str, Any]]:
    """The rules of fake/cudnn_rnn.py for every configuration (before the recording), and each row's split."""
    from labkit.memory.trace.fake import cudnn_rnn as rules
    from labkit.workloads.corpus import split_of

    rows = []
    for c in GRID:
        elem = DTYPES[c.dtype].itemsize
        seq, batch = (len(batch_sizes(lengths(c.batch, c.seq))), c.batch) if c.packed else (c.seq, c.batch)
        rows.append({"name": c.name, "split": split_of(c.name), **c._asdict(),
                     "reserve_bytes": rules.reserve_bytes(c.mode, c.layers, c.dirs, seq, batch, c.hidden, elem),
                     "workspace_bytes": rules.workspace_bytes(c.mode, c.layers, c.dirs, seq, batch, c.hidden, elem,
                                                              c.input_size)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; configurations past it are skipped")
    ap.add_argument("--smoke", action="store_true", help="three tiny configurations on the CPU (checks the script)")
    ap.add_argument("--predict-to", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    cmd = "python3 benchmarks/gpu/record_rnn.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.predict_to:
        prov = header(cmd)
        prov["note"] = ("fake/cudnn_rnn.py's reserve and workspace rules for every configuration of the grid, "
                        "written before the grid was recorded on any GPU")
        write_measurement(args.predict_to, "cudnn_rnn_grid_predicted", {"rows": predict_rows()}, provenance=prov)
        return 0
    if args.out is None:
        ap.error("--out is required (or --predict-to)")
    args.out.mkdir(parents=True, exist_ok=True)
    import record_plain

    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    prov = header(cmd)
    prov.update(record_plain.versions())
    doc: dict[str, Any] = {"device": device, "smoke": args.smoke, "method": __doc__.split("\n\n")[1],
                           "cudnn_version": torch.backends.cudnn.version() if cuda else None, "rows": []}
    if cuda:
        doc["dropout_state_bytes"] = torch._cudnn_init_dropout_state(0.2, True, 0, dtype=torch.uint8,
                                                                      device="cuda").numel()
        p = torch.cuda.get_device_properties(0)
        doc["sm"] = [p.major, p.minor, p.multi_processor_count]
    log(f"device {device}; torch {torch.__version__}; {prov.get('gpu_name')}; cudnn {doc['cudnn_version']}")
    try:
        for c in (SMOKE if args.smoke else GRID):
            if time.perf_counter() - T0 > args.budget:
                doc.setdefault("skipped", []).append(c.name)
                continue
            r = probe(c, device)
            doc["rows"].append(r)
            log(f"{c.name}: reserve {r.get('reserve_bytes')}, fwd {(r.get('forward') or {}).get('transient_blocks')}, "
                f"bwd {(r.get('backward') or {}).get('transient_blocks')}, inf "
                f"{(r.get('inference') or {}).get('transient_blocks')}{' ' + r['error'] if 'error' in r else ''}")
            write_measurement(args.out / "rnn_grid.json", "cudnn_rnn_grid", doc, provenance=prov)
        write_measurement(args.out / "rnn_grid.json", "cudnn_rnn_grid", doc, provenance=prov)
        log(f"done: {len(doc['rows'])} rows, {len(doc.get('skipped', []))} skipped")
    finally:
        (args.out / "log.txt").write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
