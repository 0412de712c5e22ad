"""config.json keys of a "cycle" family (llama4's `llama4_text`): NoPE, chunked-attention and MoE layer patterns.

transformers' Llama4TextConfig reads, per layer, `no_rope_layers` (1: rope, 0: NoPE), `moe_layers` (the MoE
layer indices; the others a dense MLP of `intermediate_size_mlp`) and `layer_types` (`chunked_attention` on
rope layers when `attention_chunk_size` is set, else `full_attention`), plus `use_qk_norm` (the weight-free
L2 norm of q/k on rope layers) and `attn_temperature_tuning`. `intermediate_size` is one expert's width and
the shared expert's. What maxckpt computes is a pattern (every n-th layer NoPE, every m-th MoE): a config
whose lists say another one is refused rather than converted into other logits.

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("llama4", 4, 64, 4, 2, 16, 96, 256, num_experts=4, moe_mlp_dim=64, nope_layer_interval=4,
...                  attention_chunk_size=8192)
>>> cycle_config(spec)["layer_types"]
['chunked_attention', 'chunked_attention', 'chunked_attention', 'full_attention']
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec


def has_rope(spec: ModelSpec, i: int) -> bool:
    """Layer i applies rope (with nope_layer_interval n, layer i is NoPE iff (i + 1) % n == 0)."""
    n = spec.nope_layer_interval or 0
    return n <= 0 or (i + 1) % n != 0


def _moe_layers(num_layers: int, step: int) -> list[int]:
    return list(range(step - 1, num_layers, step))


def cycle_config(spec: ModelSpec) -> dict[str, Any]:
    """The config.json keys transformers' Llama4TextConfig reads for `spec`'s layer patterns."""
    layers = range(spec.num_layers)
    step = max(spec.interleave_moe_layer_step or 1, 1)
    rope = [int(has_rope(spec, i)) for i in layers]
    chunk = spec.attention_chunk_size or None
    return {
        "intermediate_size": spec.moe_mlp_dim,
        "intermediate_size_mlp": spec.mlp_dim,
        "interleave_moe_layer_step": step,
        "moe_layers": _moe_layers(spec.num_layers, step),
        "no_rope_layers": rope,
        "no_rope_layer_interval": spec.nope_layer_interval if (spec.nope_layer_interval or 0) > 0 else 0,
        "use_qk_norm": bool(spec.qk_l2_norm),
        "attention_chunk_size": chunk,
        "layer_types": ["chunked_attention" if r and chunk else "full_attention" for r in rope],
        "attn_temperature_tuning": bool(spec.attn_temperature_tuning),
    }


def cycle_hints(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelSpec fields a `llama4_text` config.json states, its per-layer lists checked against a pattern."""
    hints: dict[str, Any] = {}
    layers = config.get("num_hidden_layers")
    dense = config.get("moe_layers") is not None and len(config["moe_layers"]) < (layers or 0) or int(
        config.get("interleave_moe_layer_step") or 1) > 1
    if dense and config.get("intermediate_size_mlp") is not None:  # all-MoE: the expert width stands for it
        hints["mlp_dim"] = config["intermediate_size_mlp"]
    for key, field in (("use_qk_norm", "qk_l2_norm"), ("attn_temperature_tuning", "attn_temperature_tuning")):
        if config.get(key) is not None:
            hints[field] = bool(config[key])
    hints["attention_chunk_size"] = config.get("attention_chunk_size") or None
    tuning = config.get("attn_temperature_tuning", True)
    for key, fixed in (("floor_scale", 8192), ("attn_scale", 0.1)):
        if tuning and config.get(key) is not None and config[key] != fixed:
            raise UnsupportedModelError(
                f"config.json's {key}={config[key]!r}: MaxText's llama4 tunes NoPE layers' queries with {key} "
                f"{fixed} (fixed in its code); converting it would compute other logits past that many tokens")
    if not isinstance(layers, int) or layers <= 0:
        return hints
    rope = config.get("no_rope_layers")
    interval = int(config.get("no_rope_layer_interval") or 0)
    if rope:
        if not isinstance(rope, list) or len(rope) < layers:
            raise CorruptCheckpointError(f"config.json's no_rope_layers must list all {layers} layers; fix the file")
        nope = [i for i in range(layers) if not rope[i]]
        interval = nope[0] + 1 if nope else 0
        want = [int(interval <= 0 or (i + 1) % interval != 0) for i in range(layers)]
        if [int(bool(r)) for r in rope[:layers]] != want:
            raise UnsupportedModelError(
                f"config.json's no_rope_layers {rope[:layers]} are not every {interval}th layer NoPE; maxckpt "
                "converts llama4 layer patterns only (nope_layer_interval)")
    hints["nope_layer_interval"] = interval
    step = int(config.get("interleave_moe_layer_step") or 1)
    moe = config.get("moe_layers")
    if moe is not None:
        if not isinstance(moe, list):
            raise CorruptCheckpointError("config.json's moe_layers must be a list of layer indices; fix the file")
        step = moe[0] + 1 if moe else layers + 1
        if list(moe) != _moe_layers(layers, step):
            raise UnsupportedModelError(
                f"config.json's moe_layers {moe} are not every {step}th layer; maxckpt converts llama4 layer "
                "patterns only (interleave_moe_layer_step)")
    hints["interleave_moe_layer_step"] = step
    types = config.get("layer_types")
    if types is not None:
        chunk = hints["attention_chunk_size"]
        want_types = ["chunked_attention" if (interval <= 0 or (i + 1) % interval) and chunk else "full_attention"
                      for i in range(layers)]
        if list(types)[:layers] != want_types:
            raise UnsupportedModelError(
                f"config.json's layer_types {list(types)[:layers]} are not chunked attention on the rope layers and "
                f"full attention on the NoPE ones ({want_types}); converting it would compute other logits")
    return hints
