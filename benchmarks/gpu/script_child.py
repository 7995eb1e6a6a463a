"""The child process of the script recorders (record_scripts.py, record_fakepg_paths.py), and how a recorder starts it.

A recorder runs ``python -c WRAPPER SCRIPT ARGS``, with this folder on the child's ``sys.path``. The wrapper sets up
what its recording needs, then calls :func:`run_script`. That function runs the user's script, unmodified, as
``python SCRIPT`` would, and prints one ``RECORD_RESULT`` line: the GPU's peaks and the allocator's counts. No labkit
code runs in the child. The parent calls :func:`run_child` and gets that line back as a dict.

Rank cases run on PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``), which leaves an
allreduce's future empty. DDP's reducer waits on that future, so :func:`ddp_comm_hook` registers a hook that returns
the bucket as an allreduce leaves it, with no allocation.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

RESULT = "RECORD_RESULT "
HERE = Path(__file__).resolve().parent


# -- in the child -----------------------------------------------------------------------------------

def fake_process_group(world: int) -> None:
    """``init_process_group`` of any backend becomes PyTorch's fake group: this rank (``RANK``) of ``world``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    init = dist.init_process_group

    def fake_init(backend: Any = None, *a: Any, **k: Any) -> Any:
        for key in ("store", "init_method", "rank", "world_size"):
            k.pop(key, None)
        return init("fake", store=FakeStore(), rank=int(os.environ["RANK"]), world_size=world, **k)

    dist.init_process_group = fake_init


def bucket_in_place(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses a bucket annotated otherwise
    """A DDP communication hook: the bucket as an allreduce leaves it, with no allocation."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def ddp_comm_hook(hook: Callable[[Any, Any], Any] = bucket_in_place) -> None:
    """Every ``DistributedDataParallel`` the script builds gets ``hook`` as its communication hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__

    def ddp_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.register_comm_hook(None, hook)

    DDP.__init__ = ddp_init


def run_script(path: str, **extra: Any) -> None:
    """Run ``path`` as ``__main__``, then print one ``RECORD_RESULT`` line.

    The line holds the status, the wall time and ``mem_get_info`` at the start. ``extra`` is added as given, or
    called first if it is a function. On a GPU it also holds the peaks and the allocator's counts at the end."""
    cuda = torch.cuda.is_available()
    free0, total0 = torch.cuda.mem_get_info() if cuda else (0, 0)
    t0 = time.perf_counter()
    status = "ok"
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            status = f"exit {e.code}"
    except BaseException as e:  # noqa: BLE001 - the script's own failure is this run's result
        status = f"error {type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc()
    row = {"status": status, "wall_s": round(time.perf_counter() - t0, 2), "mem_get_info_at_start": [free0, total0]}
    row.update({k: v() if callable(v) else v for k, v in extra.items()})
    if cuda:
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        row.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved(),
                   end_allocated=torch.cuda.memory_allocated(), allocations=int(st.get("allocation.all.allocated", 0)),
                   allocated_bytes_total=int(st.get("allocated_bytes.all.allocated", 0)),
                   segments=int(st.get("segment.all.allocated", 0)), peak_active=int(st.get("active_bytes.all.peak", 0)),
                   num_alloc_retries=int(st.get("num_alloc_retries", 0)), num_ooms=int(st.get("num_ooms", 0)),
                   total_memory=torch.cuda.get_device_properties(0).total_memory)
    print(RESULT + json.dumps(row), flush=True)


def record_memory_history() -> None:
    """Start the caching allocator's history (every alloc, free and segment event with its Python frames), for
    :func:`write_memory_trace` after the script ends."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=400_000)


TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "oom", "snapshot")
FRAMES_KEPT = 4           # innermost Python frames kept per event


def write_memory_trace(path: str) -> str:
    """The allocator's history as a compact JSON file at ``path``: ``trace`` rows ``[action, addr, size, stream,
    frame]`` (``action`` indexes ``actions``, ``frame`` indexes ``frames``: the innermost Python frames, file names
    cut to their last two parts), the segments live at the peak of reserved bytes (a replay of the trace's
    segment events: ``[addr, size, stream]``, and the blocks allocated in them then) and at the end. Returns the
    file's name."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    Path(path).write_text(json.dumps(compact_trace(snap), separators=(",", ":")))
    return Path(path).name


def compact_trace(snap: dict[str, Any]) -> dict[str, Any]:
    """:func:`write_memory_trace`'s document from a ``torch.cuda.memory._snapshot()`` of device 0."""
    frames: dict[str, int] = {}
    rows = []
    for e in (snap.get("device_traces") or [[]])[0]:
        key = " < ".join(f"{'/'.join(str(f.get('filename', '')).split('/')[-2:])}:{f.get('line', '')}:"
                         f"{f.get('name', '')}" for f in (e.get("frames") or [])[:FRAMES_KEPT])
        act = e.get("action")
        rows.append([TRACE_ACTIONS.index(act) if act in TRACE_ACTIONS else -1, int(e.get("addr", 0)),
                     int(e.get("size", 0)), int(e.get("stream", 0)), frames.setdefault(key, len(frames))])
    segs: dict[int, list[int]] = {}
    blocks: dict[int, int] = {}
    reserved = peak = 0
    at_peak: list = []
    for act, addr, size, stream, _ in rows:
        name = TRACE_ACTIONS[act] if act >= 0 else ""
        if name in ("segment_alloc", "segment_map"):
            segs[addr] = [addr, size, stream]
            reserved += size
            if reserved > peak:
                peak = reserved
                at_peak = [[*sg, sorted(sz for a, sz in blocks.items() if sg[0] <= a < sg[0] + sg[1])]
                           for sg in sorted(segs.values())]
        elif name in ("segment_free", "segment_unmap"):
            reserved -= segs.pop(addr, [0, 0, 0])[1]
        elif name == "alloc":
            blocks[addr] = size
        elif name == "free_completed":
            blocks.pop(addr, None)
    return {"actions": list(TRACE_ACTIONS), "frames": list(frames), "trace": rows,
            "peak_reserved_replayed": peak, "segments_at_peak_reserved": at_peak,
            "segments_at_end": [[int(sg["address"]), int(sg["total_size"]), int(sg["stream"]), sg.get("segment_type")]
                                for sg in snap.get("segments", [])]}


# -- in the recorder --------------------------------------------------------------------------------

def run_child(wrapper: str, argv: list[str], *, env: dict[str, str], cwd: Path,
              timeout: float) -> tuple[dict[str, Any], str, int]:
    """``python -c wrapper ARGV`` in a new process, this folder on its path.

    Returns the child's ``RECORD_RESULT`` row (``status`` ``no result (rc N)`` if it printed none), the child's
    stderr (``timeout`` if it ran out of time) and its exit code (-9 on a timeout)."""
    env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p))
    try:
        proc = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=str(cwd))
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = "timeout", -9
    row: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith(RESULT):
            row.update(json.loads(line[len(RESULT):]))
    row.setdefault("status", f"no result (rc {rc})")
    return row, err, rc
