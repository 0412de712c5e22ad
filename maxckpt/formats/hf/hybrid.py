"""HF tensors of the Gated DeltaNet hybrids (qwen3-next): which layers are linear attention, and their tensors.

transformers' Qwen3NextGatedDeltaNet keeps `in_proj_qkvz` and `in_proj_ba` packed per key-head group
([q, k, v, z] and [b, a] of each key head, value heads of a group together), exactly as MaxText's
kernels are: the mapping is a transpose. qwen3.5 holds them head-major and apart
(:mod:`maxckpt.layouts.gated_deltanet`). `conv1d.weight` is [channels, 1, kernel] over [q | k | v].

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("qwen3-next", 4, 64, 4, 2, 16, 32, 256, full_attention_interval=4)
>>> [is_linear_layer(spec, i) for i in range(4)]
[True, True, True, False]
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.layouts.base import ModelSpec

# One Gated DeltaNet layer's token mixer: suffix -> shape symbols (see maxckpt.layouts.dims).
LINEAR_ATTENTION_TENSORS: dict[str, tuple[str, ...]] = {
    "linear_attn.in_proj_qkvz.weight": ("GQKVZ", "E"),
    "linear_attn.in_proj_ba.weight": ("GBA", "E"),
    "linear_attn.conv1d.weight": ("GC", "1", "GCK"),
    "linear_attn.dt_bias": ("GVH",),
    "linear_attn.A_log": ("GVH",),
    "linear_attn.norm.weight": ("GVD",),
    "linear_attn.out_proj.weight": ("E", "GV"),
}

# qwen3.5 (Family.hf_gdn_projections "split"): the input projections head-major, q | k | v apart from z, b, a.
SPLIT_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "linear_attn.in_proj_qkv.weight": ("GC", "E"),
    "linear_attn.in_proj_z.weight": ("GV", "E"),
    "linear_attn.in_proj_b.weight": ("GVH", "E"),
    "linear_attn.in_proj_a.weight": ("GVH", "E"),
}
GROUPED = ("linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight")


def linear_attention_tensors(split: bool) -> dict[str, tuple[str, ...]]:
    """One Gated DeltaNet layer's HF tensors, its input projections grouped (qwen3-next) or `split` (qwen3.5)."""
    if not split:
        return dict(LINEAR_ATTENTION_TENSORS)
    rest = {k: v for k, v in LINEAR_ATTENTION_TENSORS.items() if k not in GROUPED}
    return {**SPLIT_PROJECTIONS, **rest}


def is_linear_layer(spec: ModelSpec, i: int) -> bool:
    """Layer i is a Gated DeltaNet layer (every layer but each full_attention_interval-th)."""
    n = spec.full_attention_interval
    return bool(n) and i % n != n - 1


def layer_type(spec: ModelSpec, i: int) -> str:
    """HF's `layer_types` entry of a hybrid's layer i."""
    return "linear_attention" if is_linear_layer(spec, i) else "full_attention"


def hybrid_dims(infos: Mapping[str, Any], layer_name) -> dict[str, Any]:
    """ModelSpec fields the HF tensors of a hybrid show: the interval, value heads, widths, full attention's heads.

    The key heads' count and width (their product only is shown) come from the config or a preset.
    """
    layers = sorted({int(n.split(".")[2]) for n in infos if n.startswith("model.layers.")})
    full = [i for i in layers if layer_name(i, "self_attn.q_proj.weight") in infos]
    linear = [i for i in layers if layer_name(i, "linear_attn.A_log") in infos]
    if not full or not linear:
        return {}
    dims: dict[str, Any] = {"full_attention_interval": full[0] + 1}
    i = linear[0]
    dims["gdn_num_value_heads"] = infos[layer_name(i, "linear_attn.A_log")].shape[0]
    dims["gdn_value_head_dim"] = infos[layer_name(i, "linear_attn.norm.weight")].shape[0]
    dims["gdn_conv_kernel_dim"] = infos[layer_name(i, "linear_attn.conv1d.weight")].shape[-1]
    j = full[0]

    head_dim = infos[layer_name(j, "self_attn.q_norm.weight")].shape[0]
    gated = infos[layer_name(j, "self_attn.q_proj.weight")].shape[0] // head_dim
    dims.update(head_dim=head_dim, num_heads=gated // 2, qk_norm=True,
                num_kv_heads=infos[layer_name(j, "self_attn.k_proj.weight")].shape[0] // head_dim)
    return dims


def hybrid_config(spec: ModelSpec) -> dict[str, Any]:
    """config.json keys of a hybrid (transformers' Qwen3NextConfig / Qwen3_5MoeTextConfig names)."""
    rope = {"partial_rotary_factor": spec.partial_rotary_factor}
    if spec.mrope_section is not None:
        rope.update(mrope_section=list(spec.mrope_section), mrope_interleaved=True)
    return {
        "_rope_parameters": rope,
        "layer_types": [layer_type(spec, i) for i in range(spec.num_layers)],
        "linear_num_key_heads": spec.gdn_num_key_heads,
        "linear_num_value_heads": spec.gdn_num_value_heads,
        "linear_key_head_dim": spec.gdn_key_head_dim,
        "linear_value_head_dim": spec.gdn_value_head_dim,
        "linear_conv_kernel_dim": spec.gdn_conv_kernel_dim,
        "partial_rotary_factor": spec.partial_rotary_factor,
        "shared_expert_intermediate_size": spec.moe_mlp_dim * spec.num_shared_experts,
    }


def hybrid_hints(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelSpec fields a hybrid's config.json states (the inverse of :func:`hybrid_config`)."""
    names = {"linear_num_key_heads": "gdn_num_key_heads", "linear_num_value_heads": "gdn_num_value_heads",
             "linear_key_head_dim": "gdn_key_head_dim", "linear_value_head_dim": "gdn_value_head_dim",
             "linear_conv_kernel_dim": "gdn_conv_kernel_dim"}
    hints = {field: config[key] for key, field in names.items() if config.get(key) is not None}
    rope = config.get("rope_parameters")
    factor = rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None
    factor = factor if factor is not None else config.get("partial_rotary_factor")
    if factor is not None:
        hints["partial_rotary_factor"] = float(factor)
    if isinstance(rope, Mapping) and rope.get("mrope_section") is not None:
        hints["mrope_section"] = list(rope["mrope_section"])
    types = config.get("layer_types")
    if isinstance(types, list) and "full_attention" in types:
        hints["full_attention_interval"] = types.index("full_attention") + 1
    elif config.get("full_attention_interval") is not None:
        hints["full_attention_interval"] = config["full_attention_interval"]
    shared, width = config.get("shared_expert_intermediate_size"), config.get("moe_intermediate_size")
    if shared is not None and width:
        hints["num_shared_experts"] = shared // width if shared % width == 0 else shared / width
    return hints
