"""One fake-mode step of the user's real model (a Hugging Face config or their factory), through
``measure_step`` exactly as ``labkit measure`` runs it, with the allocation stream replayed under
the candidate allocator settings."""

from __future__ import annotations

from typing import Any

from labkit.advise.roofline import Roofline
from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes
from labkit.memory.estimate.hf_config import load_hf_config
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy
from labkit.workloads.hf import hf_lm_batch, require_transformers
from labkit.workloads.user_model import load_factory


def hf_causal_lm_factory(cfg: dict[str, Any], layers: int | None = None, hidden: int | None = None):
    """A zero-argument builder of ``AutoModelForCausalLM.from_config`` for a config dict."""
    tr = require_transformers()
    cfg = dict(cfg)
    mt = cfg.pop("model_type", None)
    if not mt:
        raise LabkitError("hf config: no model_type")
    if layers is not None:
        for k in ("num_hidden_layers", "n_layer"):
            if k in cfg or k == "num_hidden_layers":
                cfg[k] = layers
    if hidden is not None:
        for k in ("hidden_size", "n_embd"):
            if k in cfg:
                cfg[k] = hidden
    config = tr.AutoConfig.for_model(mt, **{k: v for k, v in cfg.items() if not k.startswith("_")})
    return lambda: tr.AutoModelForCausalLM.from_config(config), int(getattr(config, "vocab_size", 32000))


#: The host batch of the traced step (as `labkit measure`'s): token ids and labels of at most 1 GiB.
MAX_BATCH_BYTES = 1 << 30


def trace_step(model, job, *, micro_batch: int, recompute: str, alloc_confs: tuple[str, ...]):
    """The fake-mode report of one unsharded step, with ``.roofline``: that step priced op by op."""
    if model.hf_config:
        build, vocab = hf_causal_lm_factory(load_hf_config(model.hf_config), model.layers, model.hidden)
    else:
        build, vocab = load_factory(model.factory), 32000

    precision = job.precision if job.precision in ("fp32", "amp-bf16", "amp-fp16", "bf16") else "bf16"
    if micro_batch * job.seq * 16 > MAX_BATCH_BYTES:   # token ids and labels, int64, built on the host

        raise LabkitError(f"--micro-batch {micro_batch} x --seq {job.seq}: the traced step's batch would take "
                          f"{fmt_bytes(micro_batch * job.seq * 16)} on the host, more than "
                          f"{fmt_bytes(MAX_BATCH_BYTES)}; give a smaller --micro-batch (or --trace off)")
    batch = hf_lm_batch(vocab, micro_batch, job.seq)
    with Roofline() as roofline:
        rep = measure_step(build, batch,
                           StepPolicy(precision=precision, optimizer=job.optimizer, recompute=recompute),
                           device="fake-cuda", steps=2, fake=FakeCuda(alloc_confs=alloc_confs),
                           probes=Probes(observers=(roofline,)))
    rep.roofline = roofline.describe()
    return rep
