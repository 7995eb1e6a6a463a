"""The user's own model for ``labkit measure``: a Hugging Face configuration (a local
``config.json``, its folder, or a model type) with size overrides, or ``module:function`` of the
user's code, and a batch of the asked shape."""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from labkit.core.errors import LabkitError
from labkit.core.serialize import path_is, read_json
from labkit.workloads.hf import require_transformers
from labkit.workloads.vision import prepare_torchvision


#: A Hugging Face config.json is a few KB; a tokenizer-sized one is not a config.
CONFIG_LIMIT = 4 << 20

_META_KEYS = ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
              "auto_map", "quantization_config", "_attn_implementation_autoset")
_TASK_MAPPINGS = (("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
                  ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
                  ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
                  ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"))
_ARCH_SUFFIX = (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                ("ForConditionalGeneration", "seq2seq-lm"), ("ForImageClassification", "image-classification"))


def config_source(spec: str, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                  vocab: int | None = None, image_size: int | None = None) -> tuple[str, dict[str, Any], str]:
    """``(model_type, configuration overrides, task)`` for a local ``config.json`` (or its folder)
    or a transformers model type, with the size flags applied under the config's own field names."""
    if not isinstance(spec, str) or not spec.strip():
        raise LabkitError("--hf-config: empty; give a config.json path or a transformers model type")
    transformers = require_transformers()
    path = Path(spec)
    archs: list[str] = []
    if path_is(path, "dir"):
        path = path / "config.json"
    if path.suffix == ".json" or path_is(path, "exists") or "/" in spec or len(spec) > 100:
        doc = read_json(path, "Hugging Face config", limit=CONFIG_LIMIT)
        if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
            raise LabkitError(f"{path}: a Hugging Face config.json names its model_type; this one does not")
        arch = doc["model_type"]
        archs = doc.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise LabkitError(f"{path}: 'architectures' is {str(archs)[:60]}, not a list of class names")
        overrides = {k: v for k, v in doc.items() if k not in _META_KEYS}
    else:
        arch, overrides = spec, {}
    mapping = transformers.CONFIG_MAPPING
    if arch not in mapping:
        near = difflib.get_close_matches(arch, list(mapping.keys()), n=3)
        raise LabkitError(f"--hf-config {spec!r}: not a file and not a transformers model type"
                          + (f" (did you mean {', '.join(near)}?)" if near else ""))
    cls = mapping[arch]
    amap = getattr(cls, "attribute_map", {}) or {}
    for canon, value in (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads),
                         ("vocab_size", vocab), ("image_size", image_size)):
        if value is not None:
            overrides[amap.get(canon, canon)] = value
            if canon == "num_hidden_layers" and arch in ("t5", "mt5", "umt5", "bart", "mbart"):
                for k in ("num_decoder_layers", "encoder_layers", "decoder_layers"):
                    overrides[k] = value
    if heads is not None:   # fewer heads than the default kv heads: keep the kv grouping valid
        kv_key = next((k for k in ("num_key_value_heads", "num_kv_heads") if hasattr(cls(), k)), None)
        kv = overrides.get(kv_key, getattr(cls(), kv_key, None)) if kv_key else None
        if isinstance(kv, int) and (kv > heads or heads % kv):
            overrides[kv_key] = heads
    _check_config(cls, overrides, str(spec)[:120])
    return arch, overrides, _task_of(arch, archs)


#: Fields that count something (layers, widths, heads, vocabulary, experts): a positive integer, bounded so that
#: building the model is (the largest published models have 126 layers, 16,384 hidden, a 256k vocabulary).
_SIZE_BOUNDS = {"num_hidden_layers": 512, "n_layer": 512, "num_layers": 512, "encoder_layers": 512,
                "decoder_layers": 512, "num_decoder_layers": 512, "hidden_size": 1 << 17, "n_embd": 1 << 17,
                "d_model": 1 << 17, "num_attention_heads": 1024, "n_head": 1024, "num_heads": 1024,
                "num_key_value_heads": 1024, "vocab_size": 1 << 22, "intermediate_size": 1 << 20, "n_inner": 1 << 20,
                "d_ff": 1 << 20, "ffn_dim": 1 << 20, "head_dim": 1 << 14, "image_size": 8192, "patch_size": 8192,
                "num_local_experts": 4096, "num_experts": 4096, "num_experts_per_tok": 4096,
                "max_position_embeddings": 1 << 24, "n_positions": 1 << 24}


def _check_config(cls: Any, overrides: dict[str, Any], name: str) -> None:
    """The configuration's values, checked before a model is built: sizes are positive integers within bounds,
    and what transformers' own validation refuses (a string where an integer goes, heads that do not divide
    the width) is one line naming the field."""
    for k, v in overrides.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise LabkitError(f"--hf-config {name}: {k} is {v}, not a finite number")
        hi = _SIZE_BOUNDS.get(k)
        if hi is not None and v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise LabkitError(f"--hf-config {name}: {k} must be an integer, got {str(v)[:40]!r} "
                                  f"({type(v).__name__})")
            lo = 0 if "expert" in k else 1   # a dense variant may say it has no experts
            if not lo <= v <= hi:
                raise LabkitError(f"--hf-config {name}: {k} must be from {lo} to {hi}, got {v}")
    try:
        cfg = cls(**overrides)
    except Exception as exc:  # noqa: BLE001 - transformers' validation errors (StrictDataclass...Error) included
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise LabkitError(f"--hf-config {name}: transformers refuses the configuration: "
                          f"{(lines[-1] if lines else type(exc).__name__)[:200]}") from None
    hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None)
    if _is_count(hidden) and _is_count(heads) and getattr(cfg, "head_dim", None) is None and hidden % heads:
        raise LabkitError(f"--hf-config {name}: hidden size {hidden} is not divisible by {heads} attention heads")
    if _is_count(heads) and _is_count(kv) and heads % kv:
        raise LabkitError(f"--hf-config {name}: {heads} attention heads are not divisible by {kv} key/value heads")


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _task_of(arch: str, archs: list[str]) -> str:
    for name in archs:
        for suffix, task in _ARCH_SUFFIX:
            if name.endswith(suffix):
                return task

    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    for task, mapping in _TASK_MAPPINGS:
        if arch in getattr(auto, mapping, {}):
            return task
    raise LabkitError(f"model type {arch!r} has no causal-LM, masked-LM, seq2seq or image-classification head "
                      "in transformers: give --factory with your own model")


def load_factory(spec: str) -> Callable[[], nn.Module]:
    """``module:function`` -> the function (importable from the current directory)."""
    mod_name, sep, fn_name = str(spec).strip().partition(":")
    shown = str(spec)[:120]
    if not sep or not mod_name or not fn_name:
        raise LabkitError(f"--factory {shown!r}: expected MODULE:FUNCTION, e.g. mypkg.models:build")
    if mod_name.startswith("."):
        raise LabkitError(f"--factory {shown!r}: a relative module name; give the module's absolute name "
                          "(importable from the current directory)")
    if not all(part.isidentifier() for part in mod_name.split(".")) or not fn_name.isidentifier():
        raise LabkitError(f"--factory {shown!r}: MODULE is dotted Python names and FUNCTION a Python name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    prepare_torchvision()  # the user's module may import transformers (and so torchvision) itself
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise LabkitError(f"--factory {shown!r}: cannot import {mod_name} ({exc})") from None
    except SyntaxError as exc:
        raise LabkitError(f"--factory {shown!r}: {mod_name} has a syntax error ({exc.filename}, line {exc.lineno}: "
                          f"{exc.msg})") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed on import: say so in one line
        raise LabkitError(f"--factory {shown!r}: importing {mod_name} raised {_what(exc)}") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise LabkitError(f"--factory {shown!r}: {mod_name} has no function {fn_name}")
    try:
        inspect.signature(fn).bind()
    except TypeError:
        raise LabkitError(f"--factory {shown!r}: {fn_name} needs arguments; labkit calls {fn_name}() with none "
                          "(wrap it in a function of no arguments)") from None
    except ValueError:  # no signature to read (a builtin): the call says
        pass

    def build() -> nn.Module:
        try:
            model = fn()
        except LabkitError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's function failed: one line naming it
            raise LabkitError(f"--factory {shown!r}: {fn_name}() raised {_what(exc)}") from None
        if not isinstance(model, nn.Module):
            raise LabkitError(f"--factory {shown!r}: {fn_name}() returned a {type(model).__name__}, not a "
                              "torch.nn.Module")
        return model

    return build


def _what(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (it called sys.exit)"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def make_shaped_batch(task: str, *, micro_batch: int, seq: int, vocab: int | None = None,
                      factory: Callable[[], nn.Module] | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """A CPU batch for a model given by a factory: token ids (vocabulary from ``vocab``, else the
    model's ``config.vocab_size`` or first embedding, read from a copy built on the meta device)
    or images with labels."""
    g = torch.Generator().manual_seed(seed)
    if task == "image-classification":
        return {"pixel_values": torch.randn(micro_batch, 3, seq, seq, generator=g),
                "labels": torch.randint(0, 2, (micro_batch,), generator=g)}
    if vocab is None and factory is not None:
        with torch.device("meta"):
            m = factory()
        vocab = getattr(getattr(m, "config", None), "vocab_size", None)
        if vocab is None:
            emb = next((x for x in m.modules() if isinstance(x, nn.Embedding)), None)
            vocab = emb.num_embeddings if emb is not None else None
    if vocab is None:
        raise LabkitError("the model's vocabulary size is unknown (no config.vocab_size, no nn.Embedding): give --vocab")
    ids = torch.randint(0, vocab, (micro_batch, seq), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if task in ("masked-lm", "seq2seq-lm"):
        batch["attention_mask"] = torch.ones_like(ids)
    return batch


__all__ = ["config_source", "load_factory", "make_shaped_batch"]
