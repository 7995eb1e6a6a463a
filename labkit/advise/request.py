"""What ``labkit advise`` is asked: the model, the job and the machine, as typed, checked inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.core.errors import LabkitError
from labkit.core.spec import default
from labkit.core.vocab import PRECISIONS, Recompute, canonical

# The largest cluster the search is built for (the planner's and the placement's budgets).
MAX_GPUS = 4096


@dataclass(frozen=True)
class ModelSource:
    """Exactly one of: a preset name, a Hugging Face config (file or model type), a factory."""

    preset: str | None = None
    hf_config: str | None = None
    factory: str | None = None           # "module:function" returning an nn.Module
    layers: int | None = None            # overrides of the config's depth and width
    hidden: int | None = None

    def __post_init__(self) -> None:
        for k in ("preset", "hf_config", "factory"):
            v = getattr(self, k)
            if v is not None and not str(v).strip():
                flag = "--model" if k == "preset" else "--" + k.replace("_", "-")
                raise LabkitError(f"{flag}: empty; name the model")
        given = [k for k in ("preset", "hf_config", "factory") if getattr(self, k) is not None]
        if len(given) != 1:
            raise LabkitError("advise: give exactly one of --model PRESET, --hf-config CONFIG or --factory "
                              f"module:function (got {', '.join('--' + g.replace('_', '-') for g in given) or 'none'})")
        if self.factory and ":" not in self.factory:
            raise LabkitError(f"--factory {self.factory!r}: expected module:function")
        for k in ("layers", "hidden"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LabkitError(f"--{k} must be a positive integer, got {v!r}")
        if self.factory and (self.layers or self.hidden):
            raise LabkitError("--layers and --hidden override a preset's or a config's size; a --factory model "
                              "is built by your function")


@dataclass(frozen=True)
class Job:
    """The training job: sequence, batch, precision, optimizer, recompute."""

    seq: int
    global_batch: int
    micro_batch: int | None = None       # None: searched
    precision: str = default("precision")    # the one default of each: labkit.core.spec
    optimizer: str = default("optimizer")
    recompute: str | None = None         # None: searched (none, selective, full)

    def __post_init__(self) -> None:
        for k in ("seq", "global_batch"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LabkitError(f"--{k.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.micro_batch is not None:
            if isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int) or self.micro_batch < 1:
                raise LabkitError(f"--micro-batch must be a positive integer, got {self.micro_batch!r}")
            if self.global_batch % self.micro_batch:
                raise LabkitError(f"--global-batch {self.global_batch} is not a multiple of --micro-batch "
                                  f"{self.micro_batch}")
        object.__setattr__(self, "precision", canonical("precision", self.precision, what="--precision"))
        if self.precision not in PRECISIONS:
            raise LabkitError(f"--precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        object.__setattr__(self, "optimizer", canonical("optimizer", self.optimizer, what="--optimizer"))
        if self.recompute is not None:
            object.__setattr__(self, "recompute", str(Recompute.parse(self.recompute, what="--recompute")))


@dataclass(frozen=True)
class MachineSource:
    """Where the machine comes from: the live server, a saved topology file or a bundled sample;
    or no topology at all (then ``gpus`` and ``gpu_memory_bytes`` describe identical GPUs on NVSwitch)."""

    live: bool = False
    file: str | None = None
    sample: str | None = None
    gpus: int | None = None              # total GPUs (all nodes); None: the topology's, times nodes
    gpu_memory_bytes: int | None = None
    nodes: int = 1
    margin: float = 0.10                 # memory kept free on every GPU

    def __post_init__(self) -> None:
        given = [k for k in ("live", "file", "sample") if getattr(self, k)]
        if len(given) > 1:
            raise LabkitError(f"advise: --{given[0]} and --{given[1]} both name the machine; give one")
        if not given and self.gpus is None:
            raise LabkitError("advise: say which machine: --sample NAME, --file PATH, --live, or --gpus N "
                              "with --gpu-memory")
        for k in ("gpus", "nodes"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LabkitError(f"--{k} must be a positive integer, got {v!r}")
        if self.gpus is not None and self.gpus > MAX_GPUS:
            raise LabkitError(f"--gpus {self.gpus}: more than the {MAX_GPUS} GPUs advise searches")
        if self.gpus is not None and self.nodes > 1 and self.gpus % self.nodes:
            raise LabkitError(f"--gpus {self.gpus} is not a multiple of --nodes {self.nodes} (identical nodes)")
        if self.gpu_memory_bytes is not None and (not isinstance(self.gpu_memory_bytes, int) or self.gpu_memory_bytes <= 0):
            raise LabkitError(f"--gpu-memory must be a positive size, got {self.gpu_memory_bytes!r}")
        if not given and self.gpu_memory_bytes is None:
            raise LabkitError("advise: --gpus without a topology needs --gpu-memory (e.g. 80GiB or 141GB)")
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and 0 <= self.margin < 0.9):
            raise LabkitError(f"--margin must be a fraction in [0, 0.9), got {self.margin!r}")
