"""One rank of a ``torchrun`` launch, on the fake GPU: the script sees the launcher's environment and a
process group; collectives go to PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``:
no peers, no communication; each collective's outputs are allocated as the real one allocates them), so
the rank's own allocations are what they are on that rank of the real job.

* the environment ``torchrun --nnodes M --nproc-per-node N`` sets for global rank R: ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT`` (torch/distributed/run.py, torch/distributed/elastic/agent/server/api.py);
* ``init_process_group(backend, ...)`` with any backend and init method becomes the fake group of that
  rank and world (``init_device_mesh("cuda", ...)`` builds on it);
* DDP's reducer waits on each bucket's allreduce future, which the fake group leaves without a value: a
  communication hook that returns the bucket itself stands in for the allreduce (it reduces in place; no
  allocation), registered on every ``DistributedDataParallel`` the script builds, unless it registers its own;
* ``torch.distributed.pipelining``'s schedules vote, at their first step, over every stage whether all gave their
  input and output shapes (``PipelineStage(input_args=..., output_args=...)``): a vote that needs the peers'
  answers, which the fake group leaves at zero (pipelining/schedules.py, ``_warmup_p2p``). Every rank runs the
  same script, so each stage is taken to vote as this rank's do: shapes given, the stages exchange none
  (``STATIC``); shapes not given would have them exchange Python objects (``send_object_list``), which a rank
  without peers cannot receive: one clear error says to give them.

What a real multi-GPU run holds besides, outside PyTorch's allocator, is stated beside the rank's figures
as a model (:func:`outside_allocator`): the CUDA context, and NCCL's buffers per communicator (a process
group of more than one rank that the script created).

Where NCCL's code path allocates otherwise (issue 26; ``benchmarks/gpu/record_fakepg_paths.py`` ran a rank's
collectives through a real ``ProcessGroupNCCL`` on one H200, ``data/measurements/script/fakepg_paths.json``):

* FSDP2 allocates the same bytes on either group (measured to the byte): its collectives are sync ops, which
  NCCL runs on the caller's stream with no ``recordStream`` and no stash since PyTorch 2.8 (ProcessGroupNCCL.cpp,
  ``collective()``: "in asyncOp=false [default] mode, we use currentStream as ncclStream"; pytorch#148590);
* DDP's allreduce is an async op: NCCL keeps the bucket referenced past the collective (``collective()``:
  ``work->stashed_for_allocator_safety_->stash(inputs)``; the reducer waits on the work's future, never on the
  work; which reference held the buckets below in torch 2.11 was not pinned down). DDP rebuilds its
  buckets once, before the second iteration's forward (``_pre_forward``: ``reducer._rebuild_buckets()``), and on
  NCCL's path (torch 2.11) the old buckets stayed allocated through the rest of the run: GPT-2 medium held its
  float32 gradients a second time from step 2 on (+1.42 GB), the same with the GPU idle 0.3 s between steps
  (longer than the watchdog's 100 ms), and NCCL's group still held that much after the script's end
  (``fakepg_paths_pause.json``). The rank's figures are the fake group's; ``nccl_path`` beside them
  (:func:`nccl_path`) is the NCCL path's, the old buckets held from the rebuild on (what both recordings
  measured). In a real launch the rebuild's own broadcast goes through that NCCL group too (here it went to
  the fake group), which was not recorded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.distributed.fake_pg import FakeStore

from labkit.core.errors import LabkitError
from labkit.memory.estimate.buffers import CUDA_CONTEXT_BYTES, DEFAULTS_SOURCE, NCCL_BYTES_PER_COMMUNICATOR
from labkit.memory.trace.storage import round_up

# torch.distributed.pipelining (7 s to import on top of torch: python -X importtime) where a stage is traced.

MAX_WORLD = 1 << 16


@dataclass(frozen=True)
class Launch:
    """A ``torchrun`` launch: ``nnodes`` x ``nproc_per_node`` ranks."""

    nproc_per_node: int = 1
    nnodes: int = 1

    def __post_init__(self) -> None:
        for name in ("nproc_per_node", "nnodes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LabkitError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {v!r}")
        if self.world_size > MAX_WORLD:
            raise LabkitError(f"--nnodes x --nproc-per-node is {self.world_size}; at most {MAX_WORLD} ranks")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def env(self, rank: int) -> dict[str, str]:
        local = rank % self.nproc_per_node
        return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(self.world_size),
                "LOCAL_WORLD_SIZE": str(self.nproc_per_node), "GROUP_RANK": str(rank // self.nproc_per_node),
                "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(self.world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "labkit-fake"}

    def parse_ranks(self, text: str | None) -> list[int]:
        """``--ranks``: ``all``, or a comma-separated list of ranks (default: rank 0)."""
        if text is None or text == "":
            return [0]
        if text == "all":
            if self.world_size > 64:
                raise LabkitError(f"--ranks all would trace {self.world_size} ranks; list the ones that differ "
                                  "(e.g. one per pipeline stage), at most 64")
            return list(range(self.world_size))
        out = []
        for part in text.split(","):
            try:
                r = int(part)
            except ValueError:
                raise LabkitError(f"--ranks {text!r}: {part!r} is not a rank number (use all or e.g. 0,3)") from None
            if not 0 <= r < self.world_size:
                raise LabkitError(f"--ranks {text!r}: rank {r} is outside 0..{self.world_size - 1}")
            if r not in out:
                out.append(r)
        if len(out) > 64:
            raise LabkitError(f"--ranks {text!r}: at most 64 ranks at once")
        return out


def outside_allocator(communicators: int) -> dict[str, Any]:
    """Device memory a rank holds outside PyTorch's caching allocator: a model, with its sources
    (:mod:`labkit.memory.estimate.buffers`: the CUDA context measured on the H200; NCCL's buffers per
    communicator assumed, not measured here)."""
    return {"cuda_context_bytes": CUDA_CONTEXT_BYTES, "nccl_communicators": communicators,
            "nccl_bytes": communicators * NCCL_BYTES_PER_COMMUNICATOR,
            "total_bytes": CUDA_CONTEXT_BYTES + communicators * NCCL_BYTES_PER_COMMUNICATOR,
            "source": "model: " + DEFAULTS_SOURCE}


NCCL_PATH_SOURCE = ("rule: PyTorch ProcessGroupNCCL.cpp collective() stashes an async op's tensors past the op; "
                    "nn/parallel/distributed.py _pre_forward rebuilds DDP's buckets once; measured on 1 x NVIDIA H200, "
                    "torch 2.11 (data/measurements/script/fakepg_paths.json, fakepg_paths_pause.json)")


class _BucketStash:
    """What NCCL's stash would hold of one DDP's gradient buckets (see the module docstring): the bytes of each
    bucket as last reduced; at the bucket rebuild, ``gpu.ddp_rebuilds`` gets the tracker's event index there and
    the old buckets' bytes (not applied to the rank's figures)."""

    def __init__(self, gpu: Any) -> None:
        self.gpu = gpu
        self.bytes: dict[int, int] = {}

    def reduced(self, index: int, buffer: torch.Tensor) -> None:
        self.bytes[index] = round_up(buffer.numel() * buffer.element_size(), self.gpu.tracker.rounding)

    def rebuilt(self) -> None:
        self.gpu.ddp_rebuilds.append((len(self.gpu.tracker.events), sum(self.bytes.values())))


def _bucket_hook(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
    # no annotations: DDP checks a hook's annotations against dist.GradBucket, and this module's are strings
    if state is not None:
        state.reduced(bucket.index(), bucket.buffer())
    fut: Any = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def nccl_path(gpu: Any, peak_bytes: int) -> dict[str, Any] | None:
    """The rank's peak on NCCL's code path where it differs from the fake group's (DDP's bucket rebuild; None
    elsewhere): ``peak_bytes_upper`` with the old buckets held from the rebuild on, as recorded on NCCL's path,
    beside ``peak_bytes`` (the fake group's, the rank's headline figure)."""
    rebuilds = [(start, held) for start, held in gpu.ddp_rebuilds if held > 0]
    if not rebuilds:
        return None
    after = list(itertools.accumulate(delta for _, delta, _ in gpu.tracker.events))   # allocated after each event
    top = max(after, default=0)
    upper = max([top] + [max(after[max(start - 1, 0):] or [0]) + held for start, held in rebuilds])
    return {"peak_bytes": peak_bytes, "peak_bytes_upper": peak_bytes + upper - top,
            "held_bytes": sum(held for _, held in rebuilds),
            "what": "DDP's old gradient buckets, which NCCL's path kept allocated from the bucket rebuild before "
                    "step 2 on (recorded on one H200 with DDP's allreduce through a real NCCL group; the rebuild's "
                    "own broadcast went to the fake group there)",
            "source": NCCL_PATH_SOURCE}


def _pipeline_warmup() -> tuple[Any, Any]:
    """The pipelining schedules' base class and its warm-up vote, where this torch has them."""
    try:
        from torch.distributed.pipelining.schedules import _PipelineSchedule
    except ImportError:
        return None, None
    warmup = _PipelineSchedule.__dict__.get("_warmup_p2p")
    return (_PipelineSchedule, warmup) if warmup is not None else (None, None)


@contextlib.contextmanager
def fake_launch(launch: Launch | None, rank: int, gpu: Any) -> Iterator[None]:
    """The launcher's environment and a fake process group for ``rank`` (see the module docstring); the number
    of communicators the script created is left in ``gpu.communicators``. Without a launch (a plain ``python
    script.py``), no environment is set and a process group the script makes itself (a one-process group for
    ``ZeroRedundancyOptimizer``, say) is the fake one of the rank and world it asks for."""
    env = launch.env(rank) if launch is not None else {}
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    init, ddp_init, ddp_pre = dist.init_process_group, DDP.__init__, DDP._pre_forward

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        nonlocal rank
        for key in ("store", "init_method"):
            kwargs.pop(key, None)
        asked_rank, asked_world = kwargs.pop("rank", -1), kwargs.pop("world_size", -1)
        if launch is not None:
            world = launch.world_size
        else:
            world = asked_world if asked_world not in (None, -1) else int(os.environ.get("WORLD_SIZE", "1"))
            rank = asked_rank if asked_rank not in (None, -1) else int(os.environ.get("RANK", "0"))
        gpu.note(f"init_process_group({backend!r}): rank {rank} of {world} on a fake process group (collectives "
             "allocate their outputs and move no data; no peers exist)")
        return init("fake", store=FakeStore(), rank=rank, world_size=world, **kwargs)

    def ddp(self: Any, *a: Any, **k: Any) -> None:
        ddp_init(self, *a, **k)
        self._labkit_stash = _BucketStash(gpu)
        self.register_comm_hook(self._labkit_stash, _bucket_hook)
        gpu.note("DistributedDataParallel: each bucket's allreduce stands in place (the fake group's future has no "
             "value); a script's own communication hook cannot be registered on top of it")

    def ddp_pre_forward(self: Any, *a: Any, **k: Any) -> Any:
        rebuilt = getattr(self, "_has_rebuilt_buckets", False)
        out = ddp_pre(self, *a, **k)
        stash = getattr(self, "_labkit_stash", None)
        if stash is not None and not rebuilt and getattr(self, "_has_rebuilt_buckets", False):
            stash.rebuilt()
        return out

    destroy = dist.destroy_process_group
    schedule_cls, warmup = _pipeline_warmup()

    def warmup_p2p(self: Any, stages: list, has_backward: bool, p2p_done: bool) -> None:
        from torch.distributed.pipelining._utils import InferenceMode
        from torch.distributed.pipelining.stage import PipelineStage

        if not all(isinstance(st, PipelineStage) for st in stages):
            return warmup(self, stages, has_backward, p2p_done)
        if any(InferenceMode.needs_dynamic(st._user_meta, has_backward) for st in stages):
            raise LabkitError("torch.distributed.pipelining: a stage without its shapes would exchange them with "
                              "its peers, which a traced rank does not have; give PipelineStage input_args= and "
                              "output_args= (a tensor of each micro-batch's input and output shape)")
        for st in stages:
            st._inference_mode = InferenceMode.STATIC
        gpu.note("pipelining: every stage gives its input and output shapes, as this rank's stage does (the "
                 "schedule's warm-up vote needs the peers' answers; no peers exist)")
        return None

    def count() -> None:
        if dist.is_initialized():
            groups = dist.distributed_c10d._world.pg_map
            gpu.communicators = max(gpu.communicators or 0, sum(1 for g in groups if g.size() > 1))

    def destroy_process_group(group: Any = None) -> None:
        count()
        destroy(group)

    dist.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    DDP.__init__ = ddp                                             # type: ignore[method-assign]
    DDP._pre_forward = ddp_pre_forward                             # type: ignore[method-assign]
    if schedule_cls is not None:
        schedule_cls._warmup_p2p = warmup_p2p
    if launch is not None:
        gpu.communicators = 0
    try:
        yield
    finally:
        dist.init_process_group = init
        dist.destroy_process_group = destroy
        DDP.__init__ = ddp_init                                    # type: ignore[method-assign]
        DDP._pre_forward = ddp_pre                                 # type: ignore[method-assign]
        if schedule_cls is not None:
            schedule_cls._warmup_p2p = warmup
        count()
        if dist.is_initialized():
            destroy()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
