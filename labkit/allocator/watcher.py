"""``labkit.allocator.watch``: catch an out-of-memory error where it happens, in the user's own training loop.

    from labkit.allocator import watch

    with watch("labkit-watch") as w:        # or decorate the training function: @watch("labkit-watch")
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()   # opt.step() is hooked: one sample per step
            # (without an optimizer, call w.step() once per step)

What it does, on one CUDA GPU per process (each rank of a job writes its own folder, see
:mod:`labkit.allocator.capture`):

* turns on the allocator's history, ``torch.cuda.memory._record_memory_history``, with a bounded ring
  buffer (``max_entries``, default 200,000 entries: a few hundred steps of a small model, tens of MB of host
  memory) and, by default, no stack traces (``detail="trace"``): the doctor and the simulator need only each
  request's size, address and stream, and Python stacks are what makes recording expensive;
* samples ten ``memory_stats()`` figures after every optimizer step (or each ``step()`` call);
* on an OOM, before the exception leaves the ``with`` block: the snapshot (taken inside the allocator's OOM
  observer, while the failing step's tensors are still alive), the full ``memory_stats()``, the message, and the
  doctor's verdict (text and JSON), checked by replaying the captured requests in the simulator under the
  suggested ``PYTORCH_ALLOC_CONF``.

Settings that trade detail for speed: ``detail="stacks"`` (Python stacks for every allocation, for
``torch.cuda.memory._memory_viz``), ``detail="trace"`` (the default), ``detail="stats"`` (no history:
only the per-step statistics and the message; no snapshot, so no simulator check). Recorded on an H200
(``data/measurements/allocator/watch__overhead.json``, GPT-2 small, 30 ms bf16 steps): no setting moved the
step time by more than the baseline's own spread, and device memory is unchanged (the history is host memory).
The ring buffer's size bounds host memory and the snapshot written at an OOM; 200,000 entries keep the last
tens of steps of a small model, enough for the replay as long as the history reaches back to the allocation
of every segment still in use (otherwise the doctor says the trace is incomplete and judges without a replay).

Without a CUDA GPU, ``watch`` does nothing and says so in one line.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import labkit.allocator.capture as cap
from labkit.allocator.doctor import format_diagnosis
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

DEFAULT_MAX_ENTRIES = 200_000
DETAILS = ("trace", "stacks", "stats")

_OBSERVER_ATTACHED = False
_ACTIVE: list["Watch"] = []  # the watches currently started in this process (innermost last)


def _torch():
    import torch

    return torch


def is_oom(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    t = _torch()
    cls = getattr(t, "OutOfMemoryError", None) or getattr(t.cuda, "OutOfMemoryError", None)
    return (cls is not None and isinstance(exc, cls)) or "CUDA out of memory" in str(exc)


def _rank_from_env() -> int:
    for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        v = os.environ.get(k)
        if v is not None and v.strip().isdigit():
            return int(v)
    return 0


def _observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """Called by the CUDA caching allocator when a request fails, before the exception is raised."""
    for w in reversed(_ACTIVE):
        try:
            w._on_oom_observed(int(device), int(alloc), int(device_allocated), int(device_free))
        except Exception as exc:  # noqa: BLE001 - never raise inside the allocator's OOM path
            w._problem(f"capturing at the OOM: {type(exc).__name__}: {exc}")
        return


def _attach_observer() -> None:
    global _OBSERVER_ATTACHED
    if _OBSERVER_ATTACHED:
        return
    attach = getattr(_torch()._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None:
        attach(_observer)  # there is no detach: one process-wide observer dispatches to the active watch
        _OBSERVER_ATTACHED = True


def reduce_snapshot(snap: dict) -> dict:
    """Keep only what the doctor and the simulator read (no stack frames): a much smaller file."""
    segs = []
    for s in snap.get("segments", []):
        keep = {k: s[k] for k in ("device", "address", "total_size", "allocated_size", "active_size",
                                  "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable")
                if k in s}
        keep["blocks"] = [{k: b[k] for k in ("size", "requested_size", "state") if k in b} for b in s.get("blocks", [])]
        segs.append(keep)
    traces = [[{k: e[k] for k in ("action", "addr", "size", "stream", "time_us") if k in e} for e in tr]
              for tr in snap.get("device_traces", [])]
    return {"segments": segs, "device_traces": traces, "allocator_settings": snap.get("allocator_settings", {})}


def _with_oom_entry(snap: dict, device: int, size: int, free: int) -> dict:
    """A snapshot taken after the OOM lacks nothing; one taken by a fallback path may lack the failed request:
    add it, so that a replay tries that request too."""
    traces = snap.get("device_traces") or []
    if device < len(traces) and traces[device] and not any(e.get("action") == "oom" for e in traces[device][-50:]):
        traces[device].append({"action": "oom", "addr": free, "size": size, "stream": 0})
    return snap


class Watch:
    """One watched region of a training run (see the module docstring). Use :func:`watch` to make one."""

    def __init__(self, out: str | Path = "labkit-watch", *, detail: str = "trace",
                 max_entries: int = DEFAULT_MAX_ENTRIES, hook_optimizer: bool = True,
                 check_with_simulator: bool = True, reduce: bool = False, rank: int | None = None,
                 quiet: bool = False, run_id: str | None = None):
        if detail not in DETAILS:
            raise LabkitError(f"watch: detail must be one of {', '.join(DETAILS)}, got {detail!r}")
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1000:
            raise LabkitError(f"watch: max_entries must be an integer >= 1000, got {max_entries!r}")
        self.out = Path(out)
        self.detail = detail
        self.max_entries = max_entries
        self.hook_optimizer = hook_optimizer
        self.check_with_simulator = check_with_simulator
        self.reduce = reduce
        self.rank = rank
        self.quiet = quiet
        self.run_id = run_id
        self.active = False
        self.folder: Path | None = None
        self.writer: cap.CaptureWriter | None = None
        self.steps = 0
        self.verdict: Any = None
        self._hook = None
        self._manual = False
        self._oom_seen = False
        self._oom_info: dict[str, Any] = {}
        self._finished = False
        self._history_started = False
        self._t_last = None

    # -- settings ------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {"detail": self.detail, "history": self.detail != "stats",
                "max_entries": self.max_entries if self.detail != "stats" else 0,
                "context": "alloc" if self.detail == "stacks" else None,
                "stacks": "python" if self.detail == "stacks" else None,
                "hook_optimizer": self.hook_optimizer, "check_with_simulator": self.check_with_simulator,
                "reduce": self.reduce}

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"labkit watch: {msg}", file=sys.stderr, flush=True)

    def _problem(self, text: str) -> None:
        if self.writer is not None:
            self.writer.meta["problems"].append(text)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "Watch":
        if self.active or self._finished:
            return self
        torch = _torch()
        if not torch.cuda.is_available():
            self._say("no CUDA GPU here: nothing is recorded (watch is a no-op)")
            self._finished = True
            return self
        rank = self.rank if self.rank is not None else _rank_from_env()
        self.rank = rank
        run = cap.run_folder(self.out, self.run_id)
        try:
            self.folder = cap.make_rank_folder(run, rank)
        except OSError as exc:
            self._say(f"cannot create a capture folder under {run} ({exc}): nothing is recorded")
            self._finished = True
            return self
        dev = torch.cuda.current_device()
        self.writer = cap.CaptureWriter(self.folder, {
            "rank": rank, "local_rank": os.environ.get("LOCAL_RANK"), "world_size": os.environ.get("WORLD_SIZE"),
            "device": dev, "device_name": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")),
            "command": " ".join(sys.argv), "settings": self.settings()})
        s = self.settings()
        if s["history"]:
            torch.cuda.memory._record_memory_history(enabled="all", context=s["context"], stacks=s["stacks"] or "python",
                                                     max_entries=self.max_entries)
            self._history_started = True
        _attach_observer()
        if self.hook_optimizer:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._auto_step())
        _ACTIVE.append(self)
        self.active = True
        return self

    def _auto_step(self) -> None:
        if not self._manual:
            self._sample()

    def step(self) -> None:
        """Mark the end of a training step (needed only without an optimizer, or to sample elsewhere)."""
        if not self.active:
            return
        if not self._manual and self._hook is not None:
            self._hook.remove()  # the user marks steps: do not count optimizer steps too
            self._hook = None
        self._manual = True
        self._sample()

    def _sample(self) -> None:
        if not self.active or self.writer is None:
            return
        torch = _torch()
        try:
            st = torch.cuda.memory_stats(torch.cuda.current_device())
        except Exception as exc:  # noqa: BLE001
            self._problem(f"memory_stats() at step {self.steps}: {exc}")
            return
        now = time.perf_counter()
        row = {"step": self.steps, "t_s": round(now - self._t_last, 6) if self._t_last else None}
        self._t_last = now
        row.update({k: int(st.get(k, 0)) for k in cap.STEP_KEYS})
        self.writer.append_step(row)
        self.steps += 1

    def _on_oom_observed(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        if not self.active or self._oom_seen or self.writer is None:
            return  # the first OOM of this watch is captured; later ones (a retry loop) are only counted
        self._oom_seen = True
        self._oom_info = {"device": device, "request_bytes": alloc, "device_allocated_bytes": device_allocated,
                          "device_free_bytes": device_free}
        self.writer.meta.update(oom=True, oom_info=self._oom_info, oom_time=cap.utc_stamp())
        self._capture_state(device)
        self.writer.write_manifest()

    def _capture_state(self, device: int) -> None:
        torch = _torch()
        w = self.writer
        assert w is not None
        try:
            w.write_json(cap.STATS_AT_OOM, {k: v for k, v in torch.cuda.memory_stats(device).items()})
        except Exception as exc:  # noqa: BLE001
            self._problem(f"memory_stats() at the OOM: {exc}")
        if self._history_started:
            try:
                snap = torch.cuda.memory._snapshot()
            except Exception as exc:  # noqa: BLE001
                self._problem(f"torch.cuda.memory._snapshot(): {exc}")
                return
            if self._oom_info:
                snap = _with_oom_entry(snap, device, self._oom_info["request_bytes"],
                                       self._oom_info["device_free_bytes"])
            if self.reduce:
                snap = reduce_snapshot(snap)
            w.write_gzip(cap.SNAPSHOT, pickle.dumps(snap, protocol=4))

    def record_exception(self, exc: BaseException) -> None:
        """An OOM reached the watched region's boundary: write the message and the verdict, then finish."""
        if not self.active or self.writer is None or not is_oom(exc):
            return
        torch = _torch()
        if not self._oom_seen:  # no observer call (an older torch, or an OOM raised outside the allocator)
            self._oom_seen = True
            self.writer.meta.update(oom=True, oom_time=cap.utc_stamp(), oom_info={"observer": False})
            self._capture_state(torch.cuda.current_device())
        self.writer.write_text(cap.MESSAGE, str(exc) + "\n")
        self.writer.write_manifest()
        self._write_verdict()

    def _write_verdict(self) -> None:
        assert self.writer is not None and self.folder is not None
        try:
            d = cap.diagnose_capture(self.folder, check_with_simulator=self.check_with_simulator, while_writing=True)
        except Exception as exc:  # noqa: BLE001 - a verdict that fails must not hide the user's OOM
            self._problem(f"the doctor: {type(exc).__name__}: {exc}")
            return
        self.verdict = d
        self.writer.write_text(cap.VERDICT_TXT, format_diagnosis(d) + "\n")
        self.writer.write_text(cap.VERDICT_JSON, dumps(d) + "\n")
        self.writer.meta["verdict"] = d.primary
        f = d.findings[0] if d.findings else None
        self._say(f"rank {self.rank}: out of memory captured in {self.folder}"
                  + (f": [{f.kind}] {f.title}" + (" (checked by the simulator)" if f.verified else "") if f else ""))

    def stop(self, reason: str | None = None) -> str | None:
        """Stop recording, remove the hooks and mark the folder complete (or incomplete, with ``reason``)."""
        if not self.active:
            self._finished = True
            return None
        torch = _torch()
        self.active = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._history_started:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception as exc:  # noqa: BLE001
                self._problem(f"stopping the history: {exc}")
            self._history_started = False
        if self._oom_seen and self.verdict is None and not (self.folder / cap.VERDICT_JSON).exists():
            self._write_verdict()  # an OOM the program caught itself: judge from what was captured
        state = self.writer.finish(reason=reason) if self.writer else None
        self._finished = True
        return state

    # -- context manager and decorator ----------------------------------------------------------
    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and is_oom(exc):
            self.record_exception(exc)
        elif exc is not None and self.writer is not None:
            self.writer.meta["ended_by"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.stop()
        return False

    def __call__(self, fn: Callable) -> Callable:
        kw = dict(detail=self.detail, max_entries=self.max_entries, hook_optimizer=self.hook_optimizer,
                  check_with_simulator=self.check_with_simulator, reduce=self.reduce, rank=self.rank,
                  quiet=self.quiet, run_id=self.run_id)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Watch(self.out, **kw):
                return fn(*args, **kwargs)

        return wrapper


def watch(out: str | Path = "labkit-watch", **kwargs) -> Watch:
    """A :class:`Watch`: ``with watch(DIR): ...`` or ``@watch(DIR)``; see the module docstring."""
    return Watch(out, **kwargs)


# ------------------------------------------------------------------------------------- script form

def install_from_env() -> Watch | None:
    """Called right after ``import torch`` in a script started by ``labkit watch -- ...`` (through the
    sitecustomize in ``labkit/allocator/_watch_boot``). Starts watching when CUDA initialises (a launcher
    process that never touches CUDA writes nothing), hooks the optimizer, and records an OOM that ends the
    script (sys.excepthook) or is caught by it (at exit)."""
    run_dir = os.environ.get("LABKIT_WATCH_RUN_DIR")
    if not run_dir:
        return None
    try:
        opts = json.loads(os.environ.get("LABKIT_WATCH_OPTS") or "{}")
    except json.JSONDecodeError:
        opts = {}
    torch = _torch()
    w = Watch(run_dir, detail=opts.get("detail", "trace"), max_entries=int(opts.get("max_entries", DEFAULT_MAX_ENTRIES)),
              check_with_simulator=bool(opts.get("check_with_simulator", True)), reduce=bool(opts.get("reduce", False)),
              quiet=bool(opts.get("quiet", False)))

    def begin() -> None:
        try:
            w.start()
        except Exception as exc:  # noqa: BLE001 - the user's run goes on without the watch
            print(f"labkit watch: could not start ({type(exc).__name__}: {exc})", file=sys.stderr)

    if torch.cuda.is_initialized():
        begin()
    else:
        torch.cuda._lazy_call(begin)

    previous = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            w.record_exception(value)
            w.stop()
        finally:
            previous(etype, value, tb)

    sys.excepthook = excepthook
    atexit.register(w.stop)
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            def on_term(signum, frame):
                w.stop(reason="terminated by SIGTERM (e.g. torchrun stopping the other ranks after a failure)")
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        pass
    if opts.get("verbose"):
        print(f"labkit watch: hooked into pid {os.getpid()} (rank {_rank_from_env()})", file=sys.stderr)
    return w
