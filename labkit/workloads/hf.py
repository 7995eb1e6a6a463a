"""Hugging Face ``transformers`` models built from a configuration (no weights are downloaded).

``transformers`` is a dependency of labkit (also ``pip install labkit[hf]``); it is imported only here,
and only when a function is called.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from labkit.core.errors import LabkitError
from labkit.workloads.vision import prepare_torchvision

# transformers (10 s to import: python -X importtime, 2-core machine) is imported where a model is built.

# GPT-2 family dimensions (layers, hidden, heads), as published with the checkpoints.
HF_GPT2_SIZES: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}


@dataclass(frozen=True)
class HFGPT2Spec:
    """A GPT-2 configuration for ``transformers.GPT2LMHeadModel`` (dropout off by default)."""

    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    n_positions: int = 1024
    vocab_size: int = 50257
    dropout: float = 0.0

    @classmethod
    def named(cls, name: str, **overrides: Any) -> "HFGPT2Spec":
        try:
            L, h, a = HF_GPT2_SIZES[name]
        except KeyError:
            raise LabkitError(f"unknown GPT-2 size {name!r}; choose one of {', '.join(HF_GPT2_SIZES)}") from None
        return cls(n_layer=L, n_embd=h, n_head=a, **overrides)

    @property
    def num_params(self) -> int:
        h, L, V, S = self.n_embd, self.n_layer, self.vocab_size, self.n_positions
        per_layer = 12 * h * h + 13 * h
        return V * h + S * h + L * per_layer + 2 * h

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_transformers() -> Any:
    prepare_torchvision()   # transformers imports torchvision when it is installed
    try:
        import transformers
    except ImportError:
        raise LabkitError("Hugging Face models need transformers: pip install 'labkit[hf]' "
                          "(the transformers package)") from None
    return transformers


def hf_gpt2_factory(spec: HFGPT2Spec) -> Callable[[], torch.nn.Module]:
    """A zero-argument callable building ``GPT2LMHeadModel`` from ``spec`` (SDPA attention, no KV cache)."""
    transformers = require_transformers()
    cfg = transformers.GPT2Config(
        n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, n_positions=spec.n_positions,
        vocab_size=spec.vocab_size, resid_pdrop=spec.dropout, embd_pdrop=spec.dropout,
        attn_pdrop=spec.dropout, use_cache=False,
        bos_token_id=min(50256, spec.vocab_size - 1), eos_token_id=min(50256, spec.vocab_size - 1),
    )
    cfg._attn_implementation = "sdpa"

    def build() -> torch.nn.Module:
        model = transformers.GPT2LMHeadModel(cfg)
        model.config.use_cache = False
        return model

    return build


def hf_lm_batch(vocab_size: int, batch_size: int, seq_len: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A CPU batch for a causal LM: ``input_ids`` and ``labels`` (the model shifts them itself)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}
