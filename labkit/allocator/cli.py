"""``labkit alloc``: replay a memory snapshot under any allocator configuration, compare, diagnose OOMs.

    labkit alloc replay TRACE [--conf "expandable_segments:True,..."] [--cap-bytes N] [--gpu N] [--json]
    labkit alloc compare TRACE --conf A --conf B ... [--cap-bytes N] [--gpu N] [--json]
    labkit alloc doctor (--oom-text FILE | --stats FILE | --snapshot FILE | --capture FOLDER) [--json]

Every verb that reads a snapshot takes ``--max-snapshot-bytes`` (default 512 MiB decompressed).
``--device N`` is the old spelling of ``--gpu N`` (``--device`` names a target elsewhere in labkit).

TRACE is a ``torch.cuda.memory._snapshot()`` pickle (optionally gzip'd) recorded with
``torch.cuda.memory._record_memory_history()`` on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labkit.allocator.capture import diagnose_capture
from labkit.allocator.doctor import diagnose, format_diagnosis, load_stats_file
from labkit.allocator.sim.replay import compare, load_trace, replay
from labkit.allocator.snapshot import read_snapshot
from labkit.core.cliargs import Deprecated, nonnegative_int
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps, read_bytes
from labkit.core.table import render
from labkit.core.units import fmt_bytes, parse_bytes

REPLAY_KEYS = ("allocated_peak_bytes", "reserved_peak_bytes", "segments_peak", "num_device_alloc",
               "num_alloc_retries", "num_ooms")


def _add_snapshot_flags(p: argparse.ArgumentParser, gpu: bool = True) -> None:
    if gpu:
        p.add_argument("--gpu", type=nonnegative_int, default=None, metavar="N",
                       help="which GPU's trace (device index; default: the first with one)")
        p.add_argument("--device", dest="gpu", type=nonnegative_int, action=Deprecated, new="--gpu N")
    p.add_argument("--max-snapshot-bytes", default=None, metavar="SIZE",
                   help="refuse snapshots that decompress to more than this (default 512MiB; loading takes ~5x that "
                        "in memory)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alloc", help="replay memory snapshots under allocator configurations; the OOM doctor",
                       description="A faithful simulator of PyTorch's CUDA caching allocator: replay a snapshot's "
                                   "requests under any PYTORCH_ALLOC_CONF, compare configurations, diagnose OOMs.")
    s = p.add_subparsers(dest="alloc_command", metavar="VERB")
    r = s.add_parser("replay", help="replay TRACE under one configuration")
    r.add_argument("trace", help="snapshot pickle (.pickle or .pickle.gz) with trace history")
    r.add_argument("--conf", default="", help='PYTORCH_ALLOC_CONF value, e.g. "expandable_segments:True" (default: none)')
    r.add_argument("--cap-bytes", type=str, default=None, help="memory cap like set_per_process_memory_fraction "
                   "(bytes or e.g. 40GiB)")
    _add_snapshot_flags(r)
    r.add_argument("--json", action="store_true", help="print one JSON document")
    r.set_defaults(func=run_replay)
    c = s.add_parser("compare", help="replay TRACE under several configurations (a table)")
    c.add_argument("trace")
    c.add_argument("--conf", action="append", default=None,
                   help='a configuration (repeat); "" or default for the default. Default: a standard set')
    c.add_argument("--cap-bytes", type=str, default=None)
    _add_snapshot_flags(c)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_compare)
    d = s.add_parser("doctor", help="diagnose an out-of-memory case")
    d.add_argument("--oom-text", help="file holding the OOM error message")
    d.add_argument("--stats", help="JSON: memory_stats() dict, a list of them, or {'ranks': [...]} ")
    d.add_argument("--snapshot", help="snapshot pickle (.pickle / .pickle.gz)")
    d.add_argument("--capture", help="a rank folder written by labkit watch (message, statistics and snapshot)")
    d.add_argument("--no-sim", action="store_true", help="do not check with the simulator")
    _add_snapshot_flags(d, gpu=False)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=run_doctor)
    p.set_defaults(func=lambda a: (p.print_help(), 0)[1])


def _cap(text: str | None) -> int | None:
    if text is None:
        return None

    v = parse_bytes(text, what="--cap-bytes")
    if v <= 0:
        raise LabkitError(f"--cap-bytes must be positive, got {text!r}")
    return v


def _max_bytes(args: argparse.Namespace) -> int | None:
    text = getattr(args, "max_snapshot_bytes", None)
    if text is None:
        return None

    v = parse_bytes(text, what="--max-snapshot-bytes")
    if v <= 0:
        raise LabkitError(f"--max-snapshot-bytes must be positive, got {text!r}")
    return v


def _trace(args: argparse.Namespace):
    return load_trace(args.trace, args.gpu, max_bytes=_max_bytes(args))


#: An OOM message is a few hundred bytes; a log excerpt holding one may be longer, never megabytes.
MAX_OOM_TEXT_BYTES = 1 << 20


def read_oom_text(path: str | Path) -> str:
    """The text of a file holding an OOM message: UTF-8 text of at most 1 MiB (else a LabkitError naming it)."""
    p = Path(path)
    raw = read_bytes(p, "OOM message file (cut a longer log down to the error)", limit=MAX_OOM_TEXT_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabkitError(f"{p}: not a text file (byte {exc.start} is not UTF-8): give the OOM message as text") from None
    if "\x00" in text:
        raise LabkitError(f"{p}: not a text file (it holds NUL bytes): give the OOM message as text")
    return text


def run_replay(args: argparse.Namespace) -> int:
    tr = _trace(args)
    r = replay(tr, args.conf, cap_bytes=_cap(args.cap_bytes))
    if args.json:
        doc = {k: getattr(r, k) for k in REPLAY_KEYS}
        doc.update({"trace": r.trace, "config": r.config, "cap_bytes": r.cap_bytes, "requests": r.requests,
                    "events": r.events, "inactive_split_peak_bytes": r.inactive_split_peak_bytes,
                    "recorded_conf": tr.recorded_conf, "empty_cache_runs": tr.empty_cache_runs,
                    "ambiguous_release_runs": tr.ambiguous_runs, "source": "model: labkit allocator simulator"})
        print(dumps(doc))
        return 0
    print(f"{r.trace}: {r.requests} requests ({r.events} trace events), recorded under "
          f"{tr.recorded_conf or 'default'}; replayed under {r.config}"
          + (f", cap {fmt_bytes(r.cap_bytes)}" if r.cap_bytes else "") + " (simulated)")
    rows = [("allocated peak", fmt_bytes(r.allocated_peak_bytes)), ("reserved peak", fmt_bytes(r.reserved_peak_bytes)),
            ("segments peak", str(r.segments_peak)), ("device allocations", str(r.num_device_alloc)),
            ("alloc retries", str(r.num_alloc_retries)), ("OOMs", str(r.num_ooms))]

    print(render(["quantity", "value"], rows))
    for o in r.ooms[:3]:
        print(f"OOM at request {o.index}: {o.message}")
    if tr.ambiguous_runs:
        print(f"note: {tr.ambiguous_runs} of {tr.empty_cache_runs} cache releases in the trace were followed by a new "
              "segment: replayed as empty_cache() calls, though some may have been the allocator's own retry")
    return 0


MAX_COMPARE = 32
DEFAULT_COMPARE = ("", "expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:512",
                   "roundup_power2_divisions:4", "expandable_segments:True,roundup_power2_divisions:4")


def run_compare(args: argparse.Namespace) -> int:
    confs = ["" if c in ("default",) else c for c in (args.conf or DEFAULT_COMPARE)]
    if len(confs) > MAX_COMPARE:
        raise LabkitError(f"--conf given {len(confs)} times: compare replays the trace once per configuration, at most "
                          f"{MAX_COMPARE}")
    tr = _trace(args)
    res = compare(tr, confs, cap_bytes=_cap(args.cap_bytes))
    if args.json:
        print(dumps([{"config": r.config, **{k: getattr(r, k) for k in REPLAY_KEYS}} for r in res]))
        return 0
    base = res[0].reserved_peak_bytes or 1
    rows = [(r.config, fmt_bytes(r.allocated_peak_bytes), fmt_bytes(r.reserved_peak_bytes),
             f"{100 * (r.reserved_peak_bytes / base - 1):+.1f}%", str(r.segments_peak), str(r.num_device_alloc),
             str(r.num_alloc_retries), str(r.num_ooms)) for r in res]
    print(f"{tr.name}: {tr.n_ids} requests, recorded under {tr.recorded_conf or 'default'} (figures: simulated)")
    print(render(["configuration", "allocated peak", "reserved peak", "vs first", "segments", "device allocs",
                  "retries", "OOMs"], rows))
    if any("expandable_segments:True" in r.config for r in res):
        print("segments = memory_stats()['segment.all.peak']: cudaMalloc segments only; expandable segments map pages "
              "instead (each mapping is one device alloc), so PyTorch counts 0 there too")
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    if args.capture:
        if args.oom_text or args.stats or args.snapshot:
            raise LabkitError("alloc doctor: --capture reads the folder's own message, statistics and snapshot; "
                              "give it alone")
        d = diagnose_capture(args.capture, check_with_simulator=not args.no_sim)
        print(dumps(d) if args.json else format_diagnosis(d))
        return 0
    if not (args.oom_text or args.stats or args.snapshot):
        raise LabkitError("alloc doctor: give --oom-text FILE, --stats FILE, --snapshot FILE or --capture FOLDER")
    text = read_oom_text(args.oom_text) if args.oom_text else None
    stats = load_stats_file(args.stats) if args.stats else None
    mb = _max_bytes(args)
    snap = read_snapshot(args.snapshot, **({"max_bytes": mb} if mb else {})) if args.snapshot else None
    d = diagnose(oom_text=text, stats=stats, snapshot=snap, check_with_simulator=not args.no_sim)
    if args.json:
        print(dumps(d))
    else:
        print(format_diagnosis(d))
    sys.stdout.flush()
    return 0
