"""What transformers' Gemma 4 text model (model type `gemma4_text`) adds to config.json and to the tensor names.

config.json: the full-attention layers' `global_head_dim`, `num_global_key_value_heads` and `attention_k_eq_v`
(no v_proj there: the key is the value), rope per layer type (sliding: default, theta 1e4; full: "proportional",
rope on the first `partial_rotary_factor` of each head), the features transformers defaults on that a model
without them must switch off (per-layer input embeddings, hidden_size_per_layer_input 256 by default).
Tensors: every layer's `layer_scalar` [1] beside the Gemma 3 names.

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("gemma4", 6, 64, 4, 2, 16, 64, 256, sliding_window_pattern=6, global_head_dim=32,
...                  global_num_kv_heads=1, global_k_eq_v=True, global_partial_rotary_factor=0.25)
>>> config_keys(spec)["rope_parameters"]["full_attention"]["partial_rotary_factor"]
0.25
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.layouts.base import ModelSpec

# Keys the gemma config writer states that Gemma4TextConfig has no field for.
_NOT_GEMMA4 = ("query_pre_attn_scalar", "attn_logit_softcapping", "rope_local_base_freq", "rope_scaling",
               "rope_theta", "hidden_act")


def config_keys(spec: ModelSpec) -> dict[str, Any]:
    """config.json keys of a Gemma 4 text model (on top of the Gemma ones; see :func:`drop_keys`)."""
    full = {"rope_type": "proportional", "partial_rotary_factor": float(spec.global_partial_rotary_factor),
            "rope_theta": float(spec.rope_theta)}
    sliding = {"rope_type": "default", "rope_theta": float(spec.local_rope_theta or spec.rope_theta)}
    return {
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
        "global_head_dim": spec.global_head_dim or spec.head_dim,
        "num_global_key_value_heads": spec.global_num_kv_heads or spec.num_kv_heads,
        "attention_k_eq_v": bool(spec.global_k_eq_v),
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": spec.final_logit_softcap,
        "hidden_size_per_layer_input": spec.per_layer_input_dim,
        "vocab_size_per_layer_input": spec.per_layer_vocab_size or spec.vocab_size,
        "num_kv_shared_layers": spec.num_kv_shared_layers,
        "use_double_wide_mlp": bool(spec.double_wide_mlp),
        "enable_moe_block": bool(spec.num_experts),
        **({"top_k_experts": spec.num_experts_per_tok} if spec.num_experts else {}),
        "use_bidirectional_attention": None,
    }


def drop_keys(config: dict[str, Any]) -> None:
    """Remove the keys other Gemma model types read that Gemma4TextConfig has no field for."""
    for key in _NOT_GEMMA4:
        config.pop(key, None)


def hints(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields a Gemma 4 config.json states beyond the common ones."""
    out: dict[str, Any] = {"rope_scaling": None}
    types = config.get("layer_types")
    if isinstance(types, list) and "full_attention" in types:  # hub configs state the pattern only here
        out["sliding_window_pattern"] = types.index("full_attention") + 1
    full = (config.get("rope_parameters") or {}).get("full_attention") or {}
    if "partial_rotary_factor" in full:
        out["global_partial_rotary_factor"] = float(full["partial_rotary_factor"])
    keys = (("top_k_experts", "num_experts_per_tok"), ("global_head_dim", "global_head_dim"),
            ("num_global_key_value_heads", "global_num_kv_heads"), ("attention_k_eq_v", "global_k_eq_v"),
            ("hidden_size_per_layer_input", "per_layer_input_dim"),
            ("vocab_size_per_layer_input", "per_layer_vocab_size"),
            ("num_kv_shared_layers", "num_kv_shared_layers"), ("use_double_wide_mlp", "double_wide_mlp"))
    for key, field in keys:
        if config.get(key) is not None:
            out[field] = config[key]
    return out


def dims(infos: Mapping[str, Any], layer_name, num_layers: int) -> dict[str, Any]:
    """Shapes' say on the full-attention layers (the first layer whose q_norm is wider than layer 0's)."""
    width = lambda i: infos[layer_name(i, "self_attn.q_norm.weight")].shape[0]  # noqa: E731
    out: dict[str, Any] = {"layer_scalar": layer_name(0, "layer_scalar") in infos}
    experts = infos.get(layer_name(0, "experts.down_proj"))
    if experts is not None:  # [X, E, M]
        out.update(num_experts=experts.shape[0], moe_mlp_dim=experts.shape[2], num_shared_experts=0,
                   first_dense_layers=0)
    wide = next((i for i in range(num_layers) if width(i) != width(0)), None)
    if wide is not None and layer_name(wide, "self_attn.k_proj.weight") in infos:
        k = infos[layer_name(wide, "self_attn.k_proj.weight")].shape[0]
        out.update(global_head_dim=width(wide), global_num_kv_heads=k // width(wide),
                   global_k_eq_v=layer_name(wide, "self_attn.v_proj.weight") not in infos,
                   sliding_window_pattern=wide + 1)
    table = infos.get("model.embed_tokens_per_layer.weight")
    if table is not None:  # e2b/e4b: per-layer inputs, KV-shared layers (no k_proj), maybe double-wide
        gate = infos[layer_name(0, "per_layer_input_gate.weight")]
        shared = [i for i in range(num_layers) if layer_name(i, "self_attn.k_proj.weight") not in infos]
        out.update(per_layer_input_dim=gate.shape[0], per_layer_vocab_size=table.shape[0],
                   num_kv_shared_layers=len(shared))
        up = lambda i: infos[layer_name(i, "mlp.gate_proj.weight")].shape[0]  # noqa: E731
        out["double_wide_mlp"] = bool(shared) and up(shared[0]) == 2 * up(0)
    return out


def moe_tensors() -> dict[str, tuple[str, ...]]:
    """One MoE layer's MLP tensors (Gemma4TextDecoderLayer with enable_moe_block): suffix -> shape symbols."""
    return {
        "mlp.gate_proj.weight": ("F", "E"),
        "mlp.up_proj.weight": ("F", "E"),
        "mlp.down_proj.weight": ("E", "F"),
        "router.proj.weight": ("X", "E"),
        "router.scale": ("E",),
        "router.per_expert_scale": ("X",),
        "experts.gate_up_proj": ("X", "2*M", "E"),
        "experts.down_proj": ("X", "E", "M"),
        "post_feedforward_layernorm_1.weight": ("E",),
        "post_feedforward_layernorm_2.weight": ("E",),
        "pre_feedforward_layernorm_2.weight": ("E",),
    }


def per_layer_input_tensors() -> dict[str, tuple[str, ...]]:
    """One layer's per-layer input tensors (e2b/e4b): suffix -> shape symbols."""
    return {
        "per_layer_input_gate.weight": ("P", "E"),
        "per_layer_projection.weight": ("E", "P"),
        "post_per_layer_input_norm.weight": ("E",),
    }


def per_layer_embedder_tensors() -> dict[str, tuple[str, ...]]:
    """The per-layer input embedder (e2b/e4b): name -> shape symbols."""
    return {
        "model.embed_tokens_per_layer.weight": ("VP", "L*P"),
        "model.per_layer_model_projection.weight": ("L*P", "E"),
        "model.per_layer_projection_norm.weight": ("P",),
    }


def unloadable_reason(spec: ModelSpec) -> str | None:
    """Why transformers' Gemma 4 cannot compute this model, or None."""
    if spec.global_num_kv_heads and spec.global_num_kv_heads != spec.num_kv_heads and not spec.global_k_eq_v:
        return (f"its full-attention layers have {spec.global_num_kv_heads} kv heads and a value kernel; transformers "
                f"gives them num_global_key_value_heads only with attention_k_eq_v, else {spec.num_kv_heads}")
    return None


def is_gemma4(infos: Mapping[str, Any]) -> bool:
    return any(n.endswith(".layer_scalar") for n in infos)
