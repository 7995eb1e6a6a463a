"""Model presets as data (``data/presets/models.json``): dimensions of the GPT-2 family, the GPT-3
sizes, Llama 2/3, Mistral, TinyLlama, Qwen2.5, Phi-3 and the lab's reference workloads. No weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.memory.estimate.spec import ModelSpec

_FIELDS = ("layers", "hidden", "heads", "vocab", "seq", "kv_heads", "ffn", "gated_mlp", "head_dim", "tied_embeddings",
           "norm", "bias", "learned_pos_emb")


@dataclass(frozen=True)
class Preset:
    name: str
    family: str
    model: ModelSpec
    source: str
    params: int | None = None   # the published parameter count, where known


def presets_file() -> Path:
    p = paths.DATA_DIR / "presets" / "models.json"
    return p if p.exists() else paths.REPO_ROOT / "data" / "presets" / "models.json"


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Preset]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LabkitError(f"{path}: model presets file not found") from None
    except json.JSONDecodeError as exc:
        raise LabkitError(f"{path}: not valid JSON ({exc})") from None
    out: dict[str, Preset] = {}
    for i, d in enumerate(doc.get("presets", [])):
        if "name" not in d:
            raise LabkitError(f"{path}: preset #{i} has no name")
        unknown = set(d) - set(_FIELDS) - {"name", "family", "source", "params"}
        if unknown:
            raise LabkitError(f"{path}: preset {d['name']!r} has unknown fields {sorted(unknown)}")
        kw = {k: d[k] for k in _FIELDS if k in d}
        out[d["name"]] = Preset(name=d["name"], family=d.get("family", ""), source=d.get("source", ""),
                                params=d.get("params"), model=ModelSpec(name=d["name"], **kw))
    return out


def presets() -> dict[str, Preset]:
    """All presets by name, in file order."""
    return dict(_load(str(presets_file())))


def get_preset(name: str) -> ModelSpec:
    """The ModelSpec of a named preset; LabkitError naming the choices for an unknown name."""
    ps = _load(str(presets_file()))
    try:
        return ps[name].model
    except KeyError:
        raise LabkitError(f"unknown model preset {name!r}; choose one of {', '.join(ps)}") from None


def preset_names() -> list[str]:
    return list(_load(str(presets_file())))
