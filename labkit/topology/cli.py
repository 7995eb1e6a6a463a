"""``labkit topo`` (read a topology) and ``labkit place`` (map tp/pp/dp ranks onto it)."""

from __future__ import annotations

import argparse

from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps
from labkit.core.table import render
from labkit.core.units import parse_bytes
from labkit.topology.links import LEGEND
from labkit.topology.load import list_samples, load_file, load_live, load_p2p_table, load_sample
from labkit.topology.placement import Sizes, place


def _source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--file", metavar="PATH", help="saved `nvidia-smi topo -m` text or NCCL topology XML")
    g.add_argument("--sample", metavar="NAME", help="a bundled sample (see `labkit topo --list`)")
    p.add_argument("--gpu-name", metavar="NAME", help="GPU model for the bandwidth table (e.g. 'A100'), "
                   "when the source does not name it")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="this server's GPU interconnect (or a saved file / sample)",
                       description="Read the GPU link matrix: live (NVML + nvidia-smi), a saved file, or a bundled sample.")
    _source_args(p)
    p.add_argument("--list", action="store_true", help="list the bundled samples")
    p.add_argument("--p2p", action="store_true", help="the source is p2pBandwidthLatencyTest output: show its bandwidth table")
    p.set_defaults(func=run_topo)

    q = sub.add_parser("place", help="map tensor/pipeline/data-parallel ranks onto the GPUs",
                       description="Choose the rank-to-GPU mapping: TP groups on the fastest links, pipeline "
                                   "neighbours close, DP last; compare with the naive order 0, 1, 2, ...")
    q.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    q.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    q.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    q.add_argument("--tp-bytes", default="64MiB", help="TP all-reduce size for the estimate (default 64MiB)")
    q.add_argument("--pp-bytes", default="64MiB", help="pipeline send size for the estimate (default 64MiB)")
    q.add_argument("--dp-bytes", default="1GiB", help="DP all-reduce size for the estimate (default 1GiB)")
    _source_args(q)
    q.set_defaults(func=run_place)


def _load(args):
    if args.file:
        return load_file(args.file, gpu_name=args.gpu_name)
    if args.sample:
        return load_sample(args.sample, gpu_name=args.gpu_name)
    return load_live()


def _gbs(bps: float) -> str:
    return "-" if bps == float("inf") else f"{bps / 1e9:.1f}"


def run_topo(args: argparse.Namespace) -> int:
    if args.list:
        other = [f for f, v in (("--file", args.file), ("--sample", args.sample), ("--p2p", args.p2p)) if v]
        if other:
            raise LabkitError(f"--list lists the bundled samples; {', '.join(other)} does not apply")
        samples = list_samples()
        if args.json:
            print(dumps(samples))
        else:
            print(render(["sample", "format", "source"], [(s.name, s.format, (s.origin or "")[:90]) for s in samples]))
        return 0
    if args.p2p:
        if not (args.file or args.sample):
            raise LabkitError("--p2p needs --file PATH or --sample NAME (p2pBandwidthLatencyTest output)")
        t = load_p2p_table(args.file or args.sample)
        if args.json:
            print(dumps(t))
            return 0
        for title, d in (("unidirectional", t.uni_Bps), ("bidirectional", t.bi_Bps)):
            for mode, m in d.items():
                print(f"\n{title} bandwidth, {mode} (GB/s, decimal):")
                print(render(["GPU"] + [str(j) for j in range(t.n)],
                             [[str(i)] + [("-" if v is None else f"{v / 1e9:.1f}") for v in row] for i, row in enumerate(m)]))
        print(f"\nsource: {t.source}" + (f" ({t.origin})" if t.origin else ""))
        return 0
    topo = _load(args)
    if args.json:
        print(dumps(topo))
        return 0
    heads = ["", *[f"GPU{i}" for i in range(topo.n)], "CPU Affinity", "NUMA"]
    rows = [[f"GPU{i}", *topo.matrix[i], g.cpu_affinity or "?", "?" if g.numa is None else g.numa]
            for i, g in enumerate(topo.gpus)]
    rows += [[nic.name, *nic.to_gpus, "", ""] for nic in topo.nics]
    print(topo.describe())
    print(render(heads, rows))
    labels = sorted({lab for r in topo.matrix for lab in r if lab != "X"})
    if labels:
        print("\nnominal per-direction bandwidth (model, GB/s = 1e9 B/s; " + topo.generation.family + "):")

        bw_rows = []
        for lab in labels:
            i, j = next((i, j) for i in range(topo.n) for j in range(topo.n) if topo.matrix[i][j] == lab)
            lk = topo.link(i, j)
            bw_rows.append((lab, _gbs(lk.bandwidth_Bps), LEGEND[lk.kind]))
        print(render(["link", "GB/s", "meaning"], bw_rows))
    for nic in topo.nics:
        if nic.device and nic.device != nic.name:
            print(f"{nic.name}: {nic.device}")
    if topo.origin:
        print(f"\n{topo.origin}")
    for w in topo.warnings:
        print(f"warning: {w}")
    return 0


#: One collective's or send's size: more than one GPU's memory (1 TiB) is not a message size.
MAX_MESSAGE_BYTES = 1 << 40


def _message_bytes(text: str, flag: str) -> int:
    v = parse_bytes(text, what=flag)
    if not 0 < v <= MAX_MESSAGE_BYTES:
        raise LabkitError(f"{flag} {text!r}: a message size from 1 byte to 1 TiB (one GPU's memory at most)")
    return v


def run_place(args: argparse.Namespace) -> int:
    sizes = Sizes(tp_bytes=_message_bytes(args.tp_bytes, "--tp-bytes"), pp_bytes=_message_bytes(args.pp_bytes, "--pp-bytes"),
                  dp_bytes=_message_bytes(args.dp_bytes, "--dp-bytes"))
    topo = _load(args)
    p = place(topo, args.tp, args.pp, args.dp, sizes=sizes)
    if args.json:
        print(dumps(p))
        return 0
    print(topo.describe())
    print(f"tp={p.tp} pp={p.pp} dp={p.dp}: {p.verdict}")
    for s in p.suggestions:
        print(f"suggestion: {s}")
    c = p.comparison
    rows = [("CUDA_VISIBLE_DEVICES", ",".join(map(str, c.naive.gpu_of_rank)), p.cuda_visible_devices),
            ("TP groups (GPUs)", c.naive.tp_groups, p.tp_groups),
            ("PP groups (GPUs)", c.naive.pp_groups, p.pp_groups),
            ("DP groups (GPUs)", c.naive.dp_groups, p.dp_groups),
            ("weakest TP link", c.naive.weakest_tp_link or "-", p.weakest_tp_link or "-"),
            ("TP all-reduce ms (model)", f"{c.naive.tp_allreduce_s * 1e3:.3f}", f"{c.placed.tp_allreduce_s * 1e3:.3f}"),
            ("PP send ms (model)", f"{c.naive.pp_send_s * 1e3:.3f}", f"{c.placed.pp_send_s * 1e3:.3f}"),
            ("DP all-reduce ms (model)", f"{c.naive.dp_allreduce_s * 1e3:.3f}", f"{c.placed.dp_allreduce_s * 1e3:.3f}")]
    print(render(["", "naive 0,1,2,...", "placed"], rows))
    print(c.summary)
    print("per-rank CPU affinity:")
    print(render(["rank", "GPU", "NUMA", "CPUs", "run with"],
                 [(a.rank, a.gpu, "?" if a.numa is None else a.numa, a.cpus or "?", a.advice) for a in p.affinity]))
    print(f"search: {p.method}; {p.source}")
    return 0
