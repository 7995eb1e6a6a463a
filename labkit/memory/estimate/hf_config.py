"""A Hugging Face ``config.json`` (or a model type's default config) as the analytical model's
:class:`ModelSpec`: the dimensions only, no weights, no transformers needed for a file.

The field names follow the configs of the families below (as ``transformers`` writes them);
anything else with the common names (``num_hidden_layers``, ``hidden_size``,
``num_attention_heads``, ``vocab_size``) is read the Llama way. Mixtral and Qwen2-MoE mixtures of experts,
BERT / RoBERTa / DeBERTa-v2 encoders, BART, T5 / mT5 and ViT are read with their own traits (``HfTraits``); other
mixture-of-experts configs and other encoder-decoders are refused in one line (the tracer handles them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.serialize import path_is, read_json
from labkit.memory.estimate.spec import HfTraits, ModelSpec

# transformers (10 s to import: python -X importtime, 2-core machine) is imported where a configuration is read.

# families whose MLP is gated (SwiGLU/GeGLU) and whose norm is RMSNorm, with rotary positions
_LLAMA_LIKE = {"llama", "mistral", "mixtral", "qwen2_moe", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
               "olmo", "olmo2", "cohere", "granite", "stablelm", "internlm2", "deepseek_v2", "starcoder2", "smollm3"}
# Llama-like decoders whose norms are torch's nn.LayerNorm (weight and bias, the input's dtype, mean and rstd saved), not
# an RMSNorm computed in float32 (transformers' modeling_stablelm.py and modeling_starcoder2.py: nn.LayerNorm with
# layer_norm_eps / norm_epsilon); StarCoder2's MLP is c_fc -> act -> c_proj, ungated (Starcoder2MLP)
_NN_LAYERNORM = {"stablelm", "starcoder2"}
_UNGATED = {"starcoder2"}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# mixture-of-experts model types the estimator reads (transformers' grouped_mm experts, integrations/moe.py)
_MOE_TYPES = {"mixtral", "qwen2_moe"}


def load_hf_config(source: str | Path) -> dict[str, Any]:
    """A config dict from a ``config.json`` path (or a folder holding one), or the default config
    of a model type (``llama``, ``gpt2``...) through ``transformers.AutoConfig.for_model``."""
    if not str(source).strip():
        raise LabkitError("--hf-config: empty; give a config.json path or a transformers model type")
    p = Path(source)
    if path_is(p, "dir"):
        p = p / "config.json"
    if p.suffix == ".json" or path_is(p, "exists") or "/" in str(source) or len(str(source)) > 100:
        doc = read_json(p, "Hugging Face config", limit=4 << 20)
        if not isinstance(doc, dict):
            raise LabkitError(f"--hf-config {source}: expected a JSON object, got {type(doc).__name__}")
        return doc
    try:
        from transformers import AutoConfig
    except ImportError:
        raise LabkitError(f"--hf-config {source}: not a file, and a model type needs transformers installed") from None
    try:
        return AutoConfig.for_model(str(source)).to_dict()
    except ValueError:
        raise LabkitError(f"--hf-config {source}: not a file and not a transformers model type") from None


#: Bounds on what a config may give (a model built from it is traced by advise): the largest published models have
#: 126 layers, 16,384 hidden, 128 heads and 256k vocabularies.
_BOUNDS = {"num_hidden_layers": 512, "n_layer": 512, "hidden_size": 1 << 17, "n_embd": 1 << 17,
           "num_attention_heads": 1024, "n_head": 1024, "vocab_size": 1 << 22, "intermediate_size": 1 << 20,
           "ffn_dim": 1 << 20, "num_layers": 512, "num_decoder_layers": 512, "d_model": 1 << 17, "num_heads": 1024,
           "d_ff": 1 << 20, "d_kv": 1 << 14}


def _int(cfg: dict, key: str, *alts: str, default: int | None = None, required: bool = True) -> int | None:
    for k in (key,) + alts:
        v = cfg.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LabkitError(f"hf config: {k} must be a positive integer, got {str(v)[:40]!r}")
            hi = _BOUNDS.get(key)
            if hi is not None and v > hi:
                raise LabkitError(f"hf config: {k} is {v}, more than labkit takes ({hi}): not a model's configuration")
            return v
    if default is not None or not required:
        return default
    raise LabkitError(f"hf config ({cfg.get('model_type', 'unknown type')}): missing {key}")


def spec_from_hf_config(cfg: dict[str, Any], *, seq: int | None = None, name: str | None = None,
                        layers: int | None = None, hidden: int | None = None) -> ModelSpec:
    """The ModelSpec of a transformers config (decoder-only LMs, Mixtral / Qwen2-MoE, BERT / RoBERTa / DeBERTa-v2, BART,
    T5 / mT5, ViT); ``layers``/``hidden`` override the file."""
    if not isinstance(cfg, dict):
        raise LabkitError(f"hf config: expected a dict, got {type(cfg).__name__}")
    mt = str(cfg.get("model_type") or "")
    for k in _MOE_KEYS:
        dense_layers = cfg.get("mlp_only_layers") or (cfg.get("decoder_sparse_step") or 1) != 1
        if cfg.get(k) and (mt not in _MOE_TYPES or dense_layers):
            raise LabkitError(f"hf config {mt}: a mixture-of-experts model ({k}={cfg[k]}) the analytical model does "
                              f"not read (it reads {', '.join(sorted(_MOE_TYPES))} with every layer sparse): use "
                              "`labkit measure --hf-config` (the tracer) instead")
    if cfg.get("is_encoder_decoder") and mt not in ("bart",) + _T5:
        raise LabkitError(f"hf config {mt}: an encoder-decoder model other than BART and T5; the analytical model does not "
                          "read it: use `labkit measure --hf-config` (the tracer) instead")
    name = name or cfg.get("_name_or_path") or mt or "hf-config"
    tied = bool(cfg.get("tie_word_embeddings", True))
    if mt == "gpt2":
        L = _int(cfg, "n_layer")
        h = _int(cfg, "n_embd")
        spec = dict(layers=L, hidden=h, heads=_int(cfg, "n_head"), vocab=_int(cfg, "vocab_size"),
                    seq=seq or _int(cfg, "n_positions", default=1024), ffn=cfg.get("n_inner") or None,
                    norm="layernorm", bias=True, learned_pos_emb=True, tied_embeddings=tied)
    elif mt == "opt":
        spec = dict(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"),
                    heads=_int(cfg, "num_attention_heads"), vocab=_int(cfg, "vocab_size"),
                    seq=seq or _int(cfg, "max_position_embeddings", default=2048), ffn=_int(cfg, "ffn_dim"),
                    norm="layernorm", bias=True, learned_pos_emb=True, tied_embeddings=tied)
    elif mt in _ENCODERS:
        # BERT-like encoders (modeling_bert.py): post-norm LayerNorm layers with biased linears, learned position
        # embeddings, the masked-LM head's decoder tied to the word embeddings
        spec = dict(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"),
                    heads=_int(cfg, "num_attention_heads"), vocab=_int(cfg, "vocab_size"),
                    seq=seq or _int(cfg, "max_position_embeddings", default=512),
                    ffn=_int(cfg, "intermediate_size", required=False), norm="layernorm", bias=True,
                    # DeBERTa-v2 adds no absolute positions where position_biased_input is false (v3's configs)
                    learned_pos_emb=bool(cfg.get("position_biased_input", True)), tied_embeddings=tied)
    elif mt == "bart":
        # BART (Lewis et al. 2019, arXiv:1910.13461; modeling_bart.py): post-norm encoder and decoder stacks of
        # BERT's layer, the decoder's with a cross-attention block; read as one stack of both, the decoder last
        enc, dec = _int(cfg, "encoder_layers"), _int(cfg, "decoder_layers")
        if (cfg.get("encoder_attention_heads") != cfg.get("decoder_attention_heads")
                or cfg.get("encoder_ffn_dim") != cfg.get("decoder_ffn_dim")):
            raise LabkitError(f"hf config {mt}: encoder and decoder of different widths; the analytical model reads "
                              "BART's stacks as one: use `labkit measure --hf-config` (the tracer) instead")
        spec = dict(layers=enc + dec, hidden=_int(cfg, "d_model"), heads=_int(cfg, "encoder_attention_heads"),
                    vocab=_int(cfg, "vocab_size"), seq=seq or _int(cfg, "max_position_embeddings", default=1024),
                    ffn=_int(cfg, "encoder_ffn_dim"), norm="layernorm", bias=True, learned_pos_emb=True,
                    tied_embeddings=tied)
    elif mt in _T5:
        # T5 (Raffel et al. 2019, arXiv:1910.10683; modeling_t5.py): pre-norm encoder and decoder stacks with T5LayerNorm
        # (RMS, no bias), no biases in the linears, a relative-position bias instead of position embeddings, d_kv per
        # head (mT5-small: 6 x 64 = 384 for d_model 512); the decoder's layers also cross-attend. Read as one stack
        # of both, the decoder last (as BART); v1.1, mT5 and Flan-T5 gate the MLP (feed_forward_proj "gated-gelu")
        enc = _int(cfg, "num_layers")
        dec = _int(cfg, "num_decoder_layers", default=enc)
        spec = dict(layers=enc + dec, hidden=_int(cfg, "d_model"), heads=_int(cfg, "num_heads"),
                    head_dim=_int(cfg, "d_kv", default=64), vocab=_int(cfg, "vocab_size"), seq=seq or 512,
                    ffn=_int(cfg, "d_ff"), gated_mlp=str(cfg.get("feed_forward_proj", "relu")).startswith("gated-"),
                    norm="rmsnorm", bias=False, learned_pos_emb=False, tied_embeddings=tied)
    elif mt == "vit":
        # ViT (Dosovitskiy et al. 2020, arXiv:2010.11929; modeling_vit.py): pre-norm LayerNorm layers over the
        # patches and a [CLS] token, the classifier on [CLS]: seq is patches + 1, vocab the number of labels
        side, patch = _int(cfg, "image_size", default=224), _int(cfg, "patch_size", default=16)
        labels = cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 2
        spec = dict(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"),
                    heads=_int(cfg, "num_attention_heads"), vocab=int(labels), seq=(side // patch) ** 2 + 1,
                    ffn=_int(cfg, "intermediate_size", required=False), norm="layernorm",
                    bias=bool(cfg.get("qkv_bias", True)), learned_pos_emb=True, tied_embeddings=False)
    elif mt in ("gpt_neox", "bloom", "falcon", "gptj", "phi"):
        heads = _int(cfg, "num_attention_heads", "n_head")
        kv = None
        if mt == "falcon":
            kv = (_int(cfg, "num_kv_heads", required=False) if cfg.get("new_decoder_architecture")
                  else (1 if cfg.get("multi_query", True) else None))
        spec = dict(layers=_int(cfg, "num_hidden_layers", "n_layer"), hidden=_int(cfg, "hidden_size", "n_embd"),
                    heads=heads, kv_heads=kv, vocab=_int(cfg, "vocab_size"),
                    seq=seq or _int(cfg, "max_position_embeddings", "n_positions", default=2048),
                    ffn=_int(cfg, "intermediate_size", "n_inner", "ffn_hidden_size", required=False),
                    norm="layernorm", bias=bool(cfg.get("bias", True)), learned_pos_emb=False,
                    tied_embeddings=bool(cfg.get("tie_word_embeddings", mt == "bloom")))
    else:
        heads = _int(cfg, "num_attention_heads")
        spec = dict(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"), heads=heads,
                    kv_heads=_int(cfg, "num_key_value_heads", required=False), vocab=_int(cfg, "vocab_size"),
                    seq=seq or _int(cfg, "max_position_embeddings", default=2048),
                    ffn=_int(cfg, "intermediate_size", required=False), head_dim=_int(cfg, "head_dim", required=False),
                    gated_mlp=mt not in _UNGATED and (mt in _LLAMA_LIKE
                                                      or str(cfg.get("hidden_act", "")) in ("silu", "swiglu")),
                    norm="layernorm" if mt in _NN_LAYERNORM else
                    "rmsnorm" if mt in _LLAMA_LIKE or "rms_norm_eps" in cfg else "layernorm",
                    bias=bool(cfg.get("attention_bias", cfg.get("bias", False))), learned_pos_emb=False,
                    tied_embeddings=bool(cfg.get("tie_word_embeddings", False)))
    if layers is not None:
        spec["layers"] = layers
    if hidden is not None:
        spec["hidden"] = hidden
        spec.pop("head_dim", None)
        spec["ffn"] = None
    if spec.get("kv_heads") == spec["heads"]:
        spec["kv_heads"] = None
    return ModelSpec(name=str(name), hf=hf_traits(cfg), **spec)


def _float(cfg: dict, *keys: str) -> float:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return 0.0


# encoder-only models the estimator reads (BERT's layout; DeBERTa-v2's with its disentangled attention, HfTraits.rel_span)
_ENCODERS = ("bert", "roberta", "deberta-v2")
# T5's family (modeling_t5.py; modeling_mt5.py is the same code)
_T5 = ("t5", "mt5")

# model types whose attention projects queries, keys and values with three linears (the others fuse them:
# GPT-2's c_attn, BLOOM's, Falcon's and GPT-NeoX's query_key_value, Phi-3's qkv_proj, InternLM2's wqkv), and
# whose gated MLP has separate gate and up linears (Phi-3 fuses them in gate_up_proj; StarCoder2 has c_fc alone)
_SEPARATE_QKV = (_LLAMA_LIKE - {"phi3", "internlm2"}) | {"opt", "vit", "bart"} | set(_ENCODERS) | set(_T5)
_SEPARATE_GATE_UP = _LLAMA_LIKE - {"phi3", "starcoder2"}

# model types whose transformers implementation has no SDPA path (their own softmax(QK^T)V): BLOOM adds
# its ALiBi bias with baddbmm and upcasts the scores (modeling_bloom.py, BloomAttention.forward); DeBERTa-v2 adds its
# c2p/p2c scores with bmm and gather (modeling_deberta_v2.py, DisentangledSelfAttention.forward)
_EAGER_ONLY = {"bloom", "deberta-v2"}


def _with_defaults(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    """``cfg`` over its model type's transformers defaults (a config.json may leave out GPT-2's
    dropouts, which the model then takes from GPT2Config); ``cfg`` alone without transformers."""
    try:
        from transformers import AutoConfig

        base = AutoConfig.for_model(mt).to_dict()
    except (ImportError, ValueError):  # no transformers, or a model type it does not know: the keys alone
        return cfg
    return {**base, **cfg}


def hf_traits(cfg: dict[str, Any]) -> HfTraits:
    """What the transformers implementation of ``cfg`` does beyond the dimensions (see HfTraits)."""
    mt = str(cfg.get("model_type") or "")
    # T5Config makes num_decoder_layers num_layers where a config leaves it out (the default config's 6 would not)
    t5_decoder = int(cfg.get("num_decoder_layers") or cfg.get("num_layers") or 6) if mt in _T5 else 0
    cfg = _with_defaults(cfg, mt) if mt else cfg
    act = str(cfg.get("activation_function") or cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation")
              or ("gelu_new" if mt == "gpt2" else "silu"))
    t5 = mt in _T5
    if t5:
        # T5Config.__init__ derives dense_act_fn and is_gated_act from feed_forward_proj: "relu", "gated-gelu" (whose
        # activation is gelu_new, for backwards compatibility) or "[gated-]ACT"
        ff = str(cfg.get("feed_forward_proj") or "relu")
        act = "gelu_new" if ff == "gated-gelu" else ff.split("-")[-1]
    impl = "eager" if mt in _EAGER_ONLY else str(cfg.get("_attn_implementation") or cfg.get("attn_implementation")
                                                 or "sdpa")
    softcap = cfg.get("final_logit_softcapping")
    pos_att = cfg.get("pos_att_type") or []
    pos_att = pos_att.lower().split("|") if isinstance(pos_att, str) else list(pos_att)  # older configs: "p2c|c2p"
    # DeBERTa-v2's relative embeddings: 2 x position_buckets rows (or 2 x max_relative_positions, itself
    # max_position_embeddings where below 1: DisentangledSelfAttention.__init__, pos_ebd_size)
    buckets = int(cfg.get("position_buckets") or -1)
    span = buckets if buckets > 0 else (int(cfg.get("max_relative_positions") or -1) if int(
        cfg.get("max_relative_positions") or -1) >= 1 else int(cfg.get("max_position_embeddings") or 512))
    rel_att = mt == "deberta-v2" and bool(cfg.get("relative_attention"))
    return HfTraits(model_type=mt, act=act, attn_impl="eager" if impl == "eager" else "sdpa",
                    attn_dropout=_float(cfg, *(("dropout_rate",) if t5 else ()), "attn_pdrop", "attention_dropout",
                                        "attention_probs_dropout_prob"),
                    hidden_dropout=_float(cfg, *(("dropout_rate",) if t5 else ()), "resid_pdrop", "hidden_dropout",
                                          "dropout", "hidden_dropout_prob"),
                    # BERT's embeddings end in a dropout of hidden_dropout_prob (modeling_bert.py, BertEmbeddings); T5's
                    # stacks start with a dropout of dropout_rate (T5Stack.forward)
                    embd_dropout=_float(cfg, *(("hidden_dropout_prob",) if mt in _ENCODERS else ("dropout_rate",) if t5
                                               else ("dropout",) if mt == "bart" else ("embd_pdrop", "embed_dropout"))),
                    # an encoder builds no KV cache (BertModel: only a decoder, is_decoder=True, does)
                    # BartForConditionalGeneration turns the cache off when given labels; T5Stack builds one only when
                    # the caller passes use_cache=True (its forward reads the argument, not the config)
                    use_cache=bool(cfg.get("use_cache", True)) and mt not in ("vit", "bart") + _T5 and (
                        mt not in _ENCODERS or bool(cfg.get("is_decoder"))),
                    mlm_head=mt in _ENCODERS,
                    patch=int(cfg.get("patch_size") or 16) if mt == "vit" else 0,
                    channels=int(cfg.get("num_channels") or 3),
                    decoder_layers=(int(cfg.get("decoder_layers") or 0) if mt == "bart" else
                                    t5_decoder),
                    # BartLearnedPositionalEmbedding: max_position_embeddings + 2 rows (its offset of 2)
                    positions=int(cfg.get("max_position_embeddings") or 1024) + 2 if mt == "bart" else 0,
                    logit_softcap=float(softcap) if isinstance(softcap, (int, float)) and softcap else None,
                    qk_norm=mt in ("qwen3", "gemma3_text", "olmo2", "qwen3_moe"),
                    attn_in_linears=3 if mt in _SEPARATE_QKV else 1,
                    mlp_in_linears=2 if mt in _SEPARATE_GATE_UP or (t5 and ff.startswith("gated-")) else 1,
                    parallel_residual=mt == "gpt_neox" and bool(cfg.get("use_parallel_residual", True)),
                    rel_bias=int(cfg.get("relative_attention_num_buckets") or 32) if t5 else 0,
                    mlp_dropout=t5, norm_keeps_input=t5,
                    rel_span=2 * span if rel_att else 0,
                    pos_att=sum(t in ("c2p", "p2c") for t in pos_att) if rel_att else 0,
                    share_att_key=bool(cfg.get("share_att_key")),
                    **moe_traits(cfg, mt))


def moe_traits(cfg: dict[str, Any], mt: str) -> dict[str, int]:
    """Mixtral's (modeling_mixtral.py: ``num_local_experts`` experts of ``intermediate_size``) and Qwen2-MoE's
    (modeling_qwen2_moe.py: ``num_experts`` of ``moe_intermediate_size``, a shared expert of
    ``shared_expert_intermediate_size``) experts; empty for a dense model."""
    if mt not in _MOE_TYPES:
        return {}
    if mt == "mixtral":
        return dict(experts=int(cfg.get("num_local_experts") or 8), top_k=int(cfg.get("num_experts_per_tok") or 2),
                    expert_ffn=int(cfg.get("intermediate_size") or 14336))
    return dict(experts=int(cfg.get("num_experts") or 60), top_k=int(cfg.get("num_experts_per_tok") or 4),
                expert_ffn=int(cfg.get("moe_intermediate_size") or 1408),
                shared_ffn=int(cfg.get("shared_expert_intermediate_size") or 0))
