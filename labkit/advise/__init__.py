"""``labkit advise``: one plan for a training job on a machine, with the evidence for each part.

``advise(model, job, machine) -> Advice`` with ``ModelSource`` (a preset, a Hugging Face config or
a factory), ``Job`` (sequence, batch, precision, optimizer) and ``MachineSource`` (live, a file, a
sample, or GPU count and memory). See :mod:`labkit.advise.advice` for where each number comes from.
"""

from labkit.advise.advice import Advice, Evidence, advise, traced_step
from labkit.advise.request import Job, MachineSource, ModelSource
from labkit.memory.estimate import step_tracer

step_tracer.offer(traced_step)   # `labkit estimate --plan` headlines the same traced step

__all__ = ["Advice", "Evidence", "Job", "MachineSource", "ModelSource", "advise"]
