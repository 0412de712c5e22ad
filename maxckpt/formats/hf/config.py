"""What an HF config.json says, in ModelSpec terms, both ways (no I/O).

:func:`hints_from_config` reads the ModelSpec fields (and the family) a config.json states, in the
transformers 5.x `rope_parameters` form or the 4.x `rope_theta`/`rope_scaling` form;
:func:`config_json` and :func:`generation_config_json` are what a written model directory states
(both rope forms, consistently). The files themselves are :mod:`maxckpt.formats.hf.files`.

>>> from maxckpt.layouts.base import ModelSpec
>>> config = config_json(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 256))
>>> config["model_type"], hints_from_config(config)["num_layers"]
('llama', 2)
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Mapping

import numpy as np

from maxckpt.errors import UnsupportedModelError
from maxckpt.families import FAMILIES, Family
from maxckpt.formats.hf.layer_patterns import layer_pattern
from maxckpt.formats.hf.layer_types import layer_types_notes
from maxckpt.formats.hf.layout import is_global_layer
from maxckpt.layouts.base import ModelSpec


def hints_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields an HF config.json states (plus `family`)."""
    if isinstance(config.get("text_config"), Mapping):  # a multimodal wrapper (gemma3): the text model's settings
        config = {**config, **config["text_config"], "model_type": config.get("model_type")}
    family = family_from_hf_config(config)
    theta, scaling = hf_rope(config)
    hints: dict[str, Any] = {"family": family.name, "rope_theta": theta, "rope_scaling": scaling}
    local_theta = hf_local_rope_theta(config)
    if family.hf_rope_per_layer_type:
        _check_rope_alike(config, family)
        local_theta = None  # the sliding layers' rope is the model's
        params = config.get("rope_parameters")
        if scaling and not (isinstance(params, Mapping) and isinstance(params.get("sliding_attention"), Mapping)):
            hints["notes"] = [
                f"config.json states its {scaling.get('rope_type', scaling.get('type'))} rope once (not per layer "
                f"type); it is read as {family.name}'s MaxText model and transformers 4.x run it, on every layer "
                "(transformers 5 would apply it to the full-attention layers only)"
            ]
    if local_theta is not None:
        hints["local_rope_theta"] = local_theta
    mapping = {
        "num_hidden_layers": "num_layers",
        "hidden_size": "emb_dim",
        "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "intermediate_size": "mlp_dim",
        "vocab_size": "vocab_size",
        "rms_norm_eps": "rms_norm_eps",
        "max_position_embeddings": "max_position_embeddings",
        "tie_word_embeddings": "tie_word_embeddings",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
    }
    if family.maxtext_moe is not None:
        mapping.pop("intermediate_size")  # what it means is the family's (Family.hf_intermediate_size)
        mapping.update({
            family.hf_num_experts_key: "num_experts",
            "num_experts_per_tok": "num_experts_per_tok", "norm_topk_prob": "norm_topk_prob",
            "routed_scaling_factor": "routed_scaling_factor", "n_shared_experts": "num_shared_experts",
            "moe_intermediate_size": "moe_mlp_dim", "first_k_dense_replace": "first_dense_layers",
            "n_group": "n_group", "topk_group": "topk_group",
        })
        if family.hf_intermediate_size == "expert":
            mapping["intermediate_size"] = "moe_mlp_dim"
        elif family.hf_intermediate_size == "mlp":
            mapping["intermediate_size"] = "mlp_dim"
    if family.attention == "mla":
        mapping.update(
            {k: k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        )
        mapping.pop("head_dim")  # MLA's head_dim is the rope width, from qk_rope_head_dim
        mapping.update(index_n_heads="indexer_n_heads", index_head_dim="indexer_head_dim", index_topk="indexer_topk")
    if family.hf_layer_types or family.settings.get("sliding_window"):
        mapping["sliding_window"] = "sliding_window"
    mapping.update({
        "query_pre_attn_scalar": "query_pre_attn_scalar",
        "attn_logit_softcapping": "attn_logit_softcap",
        "final_logit_softcapping": "final_logit_softcap",
    })
    for key, field_name in mapping.items():
        if config.get(key) is not None:
            hints[field_name] = config[key]
    if family.attention == "mla":
        hints["num_kv_heads"] = hints.get("num_heads")
        if "qk_rope_head_dim" in hints:
            hints["head_dim"] = hints["qk_rope_head_dim"]
    if family.hf_intermediate_size != "mlp" and "moe_mlp_dim" in hints:
        hints["mlp_dim"] = hints["moe_mlp_dim"]  # every layer is MoE: the expert width stands for the MLP width
    layers = layer_pattern(family)
    hints.update(layers.hints(config, hints))  # a layer pattern's own keys (DeepSeek's, a hybrid's, llama4's ...)
    alias = config.get("experts_per_token")  # gpt-oss's original name for the top-k
    if alias is not None and config.get("num_experts_per_tok") is not None and alias != config["num_experts_per_tok"]:
        hints["notes"] = [
            f"config.json says experts_per_token={alias} but num_experts_per_tok={config['num_experts_per_tok']}; "
            "transformers routes with num_experts_per_tok, so that one is used (maxckpt's output states both alike)"
        ]
    pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or hints.get(
        "sliding_window_pattern")
    if pattern:
        hints["sliding_window_pattern"] = int(pattern)
    # a pattern that reads layer_types itself (a hybrid's linear / full attention) has checked it already
    cut = [] if layers.reads_layer_types else layer_types_notes(
        config, int(pattern or family.settings.get("sliding_window_pattern", 0)), family.name)
    if cut:
        hints["notes"] = [*hints.get("notes", []), *cut]
    if "num_kv_heads" not in hints and "num_heads" in hints:
        hints["num_kv_heads"] = hints["num_heads"]
    if "head_dim" not in hints and "num_heads" in hints and "emb_dim" in hints:
        hints["head_dim"] = hints["emb_dim"] // hints["num_heads"]
    if "tie_word_embeddings" not in hints:
        hints["tie_word_embeddings"] = False  # transformers' default for these models
    return hints


def _rope_json(spec: ModelSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
    scaling = dict(spec.rope_scaling) if spec.rope_scaling else None
    params = {"rope_theta": float(spec.rope_theta), "rope_type": "default"}
    if scaling:
        params.update({k: v for k, v in scaling.items() if k != "type"})
        params.setdefault("rope_type", scaling.get("type", "default"))
    return params, scaling


def _dtype_name(dtype: np.dtype | None) -> str:
    return (
        {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}.get(np.dtype(dtype).name, "float32")
        if dtype is not None
        else "float32"
    )


def config_json(spec: ModelSpec, dtype: np.dtype | None = None) -> dict[str, Any]:
    """The config.json transformers loads for `spec` (5.x form plus the 4.x rope keys)."""
    family = FAMILIES[spec.family]
    rope_parameters, rope_scaling = _rope_json(spec)
    config: dict[str, Any] = {
        "architectures": [family.hf_architecture],
        "model_type": family.hf_model_type,
        "hidden_act": "silu",
        "hidden_size": spec.emb_dim,
        "intermediate_size": spec.mlp_dim,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": rope_parameters,
        # transformers 4.x reads these two; 5.x prefers rope_parameters (same values).
        "rope_theta": float(spec.rope_theta),
        "rope_scaling": rope_scaling,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "pad_token_id": None,
        "dtype": _dtype_name(dtype),
        "torch_dtype": _dtype_name(dtype),
    }
    config.update(family.hf_config_extra)
    for key in family.hf_num_layers_keys:
        config[key] = spec.num_layers
    if family.hf_layer_types:
        config["layer_types"] = [
            "full_attention" if is_global_layer(spec, i) else "sliding_attention" for i in range(spec.num_layers)
        ]
    config.update(_family_config(spec, family))
    layer_pattern(family).write(spec, config)
    pad = config.get("pad_token_id")
    if isinstance(pad, int) and not 0 <= pad < spec.vocab_size:
        # a full-size model's pad id would not fit this vocabulary (nn.Embedding refuses it)
        config["pad_token_id"] = None
    version = _transformers_version()
    if version:
        config["transformers_version"] = version
    return dict(sorted(config.items()))


def _family_config(spec: ModelSpec, family) -> dict[str, Any]:
    """config.json keys of the MoE, MLA and Gemma families, each under the name its model type reads."""
    out: dict[str, Any] = {}
    if spec.num_experts:
        out[family.hf_num_experts_key] = spec.num_experts
        out["num_experts_per_tok"] = spec.num_experts_per_tok
        if family.hf_intermediate_size == "expert":
            out["intermediate_size"] = spec.moe_mlp_dim
        else:
            out["moe_intermediate_size"] = spec.moe_mlp_dim
            out["norm_topk_prob"] = spec.norm_topk_prob
        if family.hf_model_type == "gpt_oss":
            out["experts_per_token"] = spec.num_experts_per_tok  # the original gpt-oss name; must agree
    if spec.kv_lora_rank:  # MLA; q_lora_rank null is transformers' "no query LoRA" (deepseek2-16b)
        out.update(q_lora_rank=spec.q_lora_rank or None, kv_lora_rank=spec.kv_lora_rank,
                   qk_nope_head_dim=spec.qk_nope_head_dim, qk_rope_head_dim=spec.qk_rope_head_dim,
                   v_head_dim=spec.v_head_dim,
                   qk_head_dim=spec.qk_nope_head_dim + spec.qk_rope_head_dim, head_dim=spec.qk_rope_head_dim,
                   num_key_value_heads=spec.num_heads)
    if spec.indexer_n_heads:  # DeepSeek-V3.2's sparse-attention indexer
        out.update(index_n_heads=spec.indexer_n_heads, index_head_dim=spec.indexer_head_dim,
                   index_topk=spec.indexer_topk)
    if spec.attention_bias:
        out["attention_bias"] = True
    if spec.activation == "gelu_tanh":
        out["hidden_act"] = out["hidden_activation"] = "gelu_pytorch_tanh"
    if family.hf_model_type.startswith("gemma"):
        out["query_pre_attn_scalar"] = spec.query_pre_attn_scalar or spec.head_dim
        out["attn_logit_softcapping"] = spec.attn_logit_softcap
        out["final_logit_softcapping"] = spec.final_logit_softcap
    if spec.sliding_window_pattern:
        out["sliding_window"] = spec.sliding_window
        out["sliding_window_pattern"] = spec.sliding_window_pattern
    if family.hf_rope_per_layer_type and spec.local_rope_theta is None:  # olmo3: the model's rope on both types
        full, _ = _rope_json(spec)
        out["rope_parameters"] = {"full_attention": full, "sliding_attention": dict(full)}
    if spec.local_rope_theta is not None:  # rope per layer type: global layers the model's, sliding ones their own
        full, _ = _rope_json(spec)
        out["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": float(spec.local_rope_theta)},
        }
        out["rope_local_base_freq"] = float(spec.local_rope_theta)  # transformers 4.x's name
    return out


def generation_config_json(spec: ModelSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "_from_model_config": True,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }
    version = _transformers_version()
    if version:
        config["transformers_version"] = version
    return config


def _transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def family_from_hf_config(config: Mapping[str, Any]) -> Family:
    """The family an HF config.json describes: its model type, then (where families share one) its rope.

    Among the families of that model type, those with the config's rope type are preferred; of those, the
    one whose rope theta is the largest not above the config's (llama: theta 1e4 is llama2, 5e5 llama3,
    llama3 scaling llama3.1), else the one with the smallest theta; ties go to the first in the registry.
    """
    model_type = str(config.get("model_type", "")).lower()
    candidates = [f for f in FAMILIES.values() if model_type in (f.hf_model_type, f.hf_wrapper_model_type)]
    if not candidates:
        raise UnsupportedModelError(
            f"config.json has model_type {model_type!r}; maxckpt converts "
            f"{', '.join(sorted({f.hf_model_type for f in FAMILIES.values()}))} models."
        )
    if len(candidates) == 1:
        return candidates[0]
    # one model type, dense and MoE families (gemma4): the config's expert count tells them apart
    experts = [f for f in candidates if (f.maxtext_moe is not None) == bool(config.get(f.hf_num_experts_key or
                                                                                      "num_experts"))]
    candidates = experts or candidates
    # ... and per-layer input embeddings (gemma4 e2b/e4b) the small ones
    small = [f for f in candidates if f.per_layer_inputs == bool(config.get("hidden_size_per_layer_input"))]
    candidates = small or candidates
    if len(candidates) == 1:
        return candidates[0]
    theta, scaling = hf_rope(config)
    kind = _rope_kind(scaling)
    candidates = [f for f in candidates if _rope_kind(f.rope_scaling) == kind] or candidates
    below = [f for f in candidates if f.rope_theta <= theta]
    if below:
        return max(below, key=lambda f: f.rope_theta)  # max() keeps the first of equals
    return min(candidates, key=lambda f: f.rope_theta)


def _rope_kind(scaling: Mapping[str, Any] | None) -> str:
    return str(scaling.get("rope_type", scaling.get("type", "default"))).lower() if scaling else "default"


def hf_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope scaling or None) from either config.json form.

    transformers 5.x writes `rope_parameters: {rope_type, rope_theta, ...}`;
    4.x wrote a top-level `rope_theta` and `rope_scaling`.
    """
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]  # per layer type (gemma3): global layers' rope is the model's
    if isinstance(params, Mapping) and params:
        theta = float(params.get("rope_theta", config.get("rope_theta", 10_000.0)))
        kind = str(params.get("rope_type", params.get("type", "default")))
        scaling = None if kind == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, scaling
    theta = float(config.get("rope_theta", 10_000.0))
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and str(scaling.get("rope_type", scaling.get("type", "default"))) != "default":
        return theta, dict(scaling)
    return theta, None


def _check_rope_alike(config: Mapping[str, Any], family: Family) -> None:
    """A family whose MaxText model applies one rope to every layer (olmo3) refuses a config.json whose
    rope_parameters give its sliding layers another (transformers would run that; MaxText cannot)."""
    params = config.get("rope_parameters")
    if not (isinstance(params, Mapping) and isinstance(params.get("sliding_attention"), Mapping)
            and isinstance(params.get("full_attention"), Mapping)):
        return
    full, sliding = dict(params["full_attention"]), dict(params["sliding_attention"])
    for p in (full, sliding):
        p.setdefault("rope_type", p.pop("type", "default"))
    if full != sliding:
        raise UnsupportedModelError(
            f"config.json's rope_parameters give {family.name}'s sliding layers {sliding} but its full-attention "
            f"layers {full}; MaxText's {family.name} applies one rope (the full layers') to every layer, so this "
            "model cannot be converted exactly"
        )


def hf_local_rope_theta(config: Mapping[str, Any]) -> float | None:
    """The sliding layers' rope theta when a config.json states one apart (gemma3), else None."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("sliding_attention"), Mapping):
        return float(params["sliding_attention"].get("rope_theta", 10_000.0))
    if config.get("rope_local_base_freq") is not None:  # transformers 4.x gemma3
        return float(config["rope_local_base_freq"])
    return None
