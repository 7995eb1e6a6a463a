"""Starting the processes of a collective run: under ``torchrun`` or spawned here.

labkit adds no launcher of its own. A function ``fn(ctx, *args)`` runs once per rank:

* under ``torchrun --nnodes N --nproc-per-node M`` (``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` and the
  rendezvous set by torchrun), :func:`run_ranks` runs it in the current process;
* otherwise :func:`run_ranks` spawns ``world`` local processes with ``torch.multiprocessing`` and a
  free TCP port on 127.0.0.1.

Either way rank 0's return value is handed back (to the caller in the parent process when spawned).
The backend is ``gloo`` (CPU tensors) or ``nccl`` (one GPU per local rank).
"""

from __future__ import annotations

import datetime
import gc
import os
import pickle
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from labkit.core.errors import LabkitError

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about itself inside an initialised process group."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str
    device: str  # "cpu" or "cuda:<local_rank>"
    launched_by: str  # "torchrun" or "spawn"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


def under_torchrun(environ: dict[str, str] | None = None) -> bool:
    """True when this process was started by torchrun (or another launcher setting the env vars)."""
    env = os.environ if environ is None else environ
    return all(k in env for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_backend(backend: str, world: int) -> None:
    """Raise :class:`LabkitError` when ``backend`` cannot run ``world`` local ranks here."""
    if backend not in BACKENDS:
        raise LabkitError(f"backend {backend!r} is not supported; choose one of {', '.join(BACKENDS)}")
    if world < 1:
        raise LabkitError(f"--world must be >= 1, got {world}")
    if backend == "nccl":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise LabkitError("backend 'nccl' needs CUDA GPUs and this machine has none; use --backend gloo")
        if world > n and not under_torchrun():
            raise LabkitError(f"--world {world} with backend 'nccl' needs {world} GPUs, this machine has {n}")


def _die_with_parent() -> None:
    """Linux: have the kernel kill this spawned rank when its parent dies (no orphaned ranks)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _init(backend: str, rank: int, world: int, local_rank: int, local_world: int, launched_by: str,
          timeout_s: float | None = None) -> RankContext:
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device(device)
        if timeout_s:
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    return RankContext(rank=rank, world=world, local_rank=local_rank, local_world=local_world,
                       backend=backend, device=device, launched_by=launched_by)


def _spawned(local_rank: int, fn: Callable, backend: str, world: int, port: int, threads: int,
             result_path: str, args: tuple, timeout_s: float | None = None) -> None:
    _die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(world))
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    ctx = _init(backend, local_rank, world, local_rank, world, "spawn", timeout_s)
    try:
        out = fn(ctx, *args)
        if local_rank == 0:
            Path(result_path).write_bytes(pickle.dumps(out))
        _quiesce()
    finally:
        _teardown()


def _quiesce() -> None:
    """Bring this rank to rest with the process group still up: free what ``fn`` left behind (DDP
    reducers sit in reference cycles that only the garbage collector frees) while the interpreter is
    fully alive, then wait at a barrier until every rank is past its last collective."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.barrier()


def _teardown() -> None:
    """Destroy the process group and free what held it, before the interpreter starts to exit.

    Why: a DDP model outlives ``del`` (it sits in a reference cycle) and its reducer holds the process
    group; left to the interpreter's final garbage collection, the group's Gloo worker threads are
    torn down while Python finalizes, and a worker that then takes the GIL to release a tensor is
    ended by Python (``pthread_exit``) and the C++ runtime aborts the rank: "terminate called without
    an active exception", SIGABRT. So what held the group is collected before it is destroyed
    (:func:`_quiesce`), the group goes down here, and no rank exits with Gloo threads alive
    (``tests/comm/test_launch_teardown.py``)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def run_ranks(fn: Callable[..., Any], *args: Any, backend: str = "gloo", world: int = 2,
              threads_per_rank: int | None = None, timeout_s: float | None = None) -> Any:
    """Run ``fn(ctx, *args)`` on every rank and return rank 0's result (None on other ranks).

    Under torchrun ``world`` is ignored (torchrun decides); otherwise ``world`` local processes are
    spawned. ``fn`` must be a module-level function (it is pickled into the spawned processes).
    ``threads_per_rank`` limits intra-op threads of CPU ranks (default: cores // world, at least 1).
    ``timeout_s`` bounds every collective of spawned ranks (the process group's timeout), so a rank
    waiting for a peer that never comes fails instead of hanging.
    """
    if under_torchrun():
        env = os.environ
        world_env, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        check_backend(backend, 1)
        ctx = _init(backend, rank, world_env, int(env["LOCAL_RANK"]),
                    int(env.get("LOCAL_WORLD_SIZE", world_env)), "torchrun")
        out = fn(ctx, *args)
        return out if rank == 0 else None
    check_backend(backend, world)
    import torch.multiprocessing as mp

    if threads_per_rank is None:
        threads_per_rank = max(1, (os.cpu_count() or 1) // world) if backend == "gloo" else 0
    with tempfile.TemporaryDirectory(prefix="labkit-comm-") as tmp:
        result = os.path.join(tmp, "rank0.pkl")
        for attempt in range(3):
            try:
                mp.start_processes(_spawned, args=(fn, backend, world, free_port(), threads_per_rank, result, args,
                                                   timeout_s), nprocs=world, join=True, start_method="spawn")
                break
            except mp.ProcessRaisedException as exc:
                # the free port was taken by another process between our probe and rank 0's bind: retry
                if attempt == 2 or "address already in use" not in str(exc).lower():
                    raise
        if not os.path.exists(result):
            raise RuntimeError("rank 0 finished without a result")
        return pickle.loads(Path(result).read_bytes())


def shutdown() -> None:
    """Destroy this process's process group if one is up (the CLI's last step under torchrun)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        _quiesce()
        _teardown()
