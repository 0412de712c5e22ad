"""Per-layer geometry: the head width and kv-head count of one layer, where they differ between layer types.

Gemma 4's full-attention layers have their own head width (`global_head_dim`) and kv-head count
(`global_num_kv_heads`) beside the sliding layers' `head_dim` / `num_kv_heads`. Every mapping that sizes a
layer's tensors (HF, MaxText) asks :func:`layer_spec` for that layer's spec, so one table of dimension
symbols (`D`, `Hkv`) serves both kinds of layer.

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("gemma4", 6, 64, 4, 2, 16, 64, 256, sliding_window_pattern=6, global_head_dim=32,
...                  global_num_kv_heads=1)
>>> layer_spec(spec, 0).head_dim, layer_spec(spec, 5).head_dim, layer_spec(spec, 5).num_kv_heads
(16, 32, 1)
"""

from __future__ import annotations

import dataclasses

from maxckpt.layouts.base import ModelSpec


def is_full_attention(spec: ModelSpec, i: int) -> bool:
    """Layer i attends to the whole sequence: with sliding_window_pattern n, iff i % n == n - 1."""
    n = spec.sliding_window_pattern
    return not n or i % n == n - 1


def has_own_geometry(spec: ModelSpec) -> bool:
    """The full-attention layers' heads differ from the sliding layers' (gemma4)."""
    return bool(spec.global_head_dim or spec.global_num_kv_heads or spec.global_k_eq_v)


def global_spec(spec: ModelSpec) -> ModelSpec:
    """`spec` as a full-attention layer sees it: its head width, kv heads and rotary share."""
    if not has_own_geometry(spec):
        return spec
    return dataclasses.replace(
        spec,
        head_dim=spec.global_head_dim or spec.head_dim,
        num_kv_heads=spec.global_num_kv_heads or spec.num_kv_heads,
        partial_rotary_factor=spec.global_partial_rotary_factor,
    )


def layer_spec(spec: ModelSpec, i: int) -> ModelSpec:
    """The spec sizing layer i's tensors: `global_spec` for a full-attention layer of such a model, else spec;
    a KV-shared layer of a double-wide model has twice the MLP width."""
    sized = global_spec(spec) if has_own_geometry(spec) and is_full_attention(spec, i) else spec
    if spec.double_wide_mlp and is_kv_shared(spec, i):
        sized = dataclasses.replace(sized, mlp_dim=2 * spec.mlp_dim)
    return sized


def first_kv_shared(spec: ModelSpec) -> int:
    """The first layer that reuses an earlier layer's keys/values (num_layers when none does)."""
    return spec.num_layers - spec.num_kv_shared_layers if spec.num_kv_shared_layers > 0 else spec.num_layers


def is_kv_shared(spec: ModelSpec, i: int) -> bool:
    """Layer i has no k/v projections: it reuses its donor's keys and values (gemma4 e2b/e4b)."""
    return 0 < first_kv_shared(spec) <= i


def kv_donor(spec: ModelSpec, i: int) -> int | None:
    """The layer whose keys/values layer i reuses: the last non-shared layer of its attention type."""
    if not is_kv_shared(spec, i):
        return None
    full = is_full_attention(spec, i)
    return next((j for j in range(first_kv_shared(spec) - 1, -1, -1) if is_full_attention(spec, j) == full), None)


def value_is_key(spec: ModelSpec, i: int) -> bool:
    """Layer i has no value projection: its (normed) key is also its value (gemma4's global layers)."""
    return spec.global_k_eq_v and is_full_attention(spec, i)


def is_moe_layer(spec: ModelSpec, i: int) -> bool:
    """Layer i routes to experts (MoE families, after DeepSeek's leading dense layers; with
    interleave_moe_layer_step n, llama4's, only layers with (i + 1) % n == 0)."""
    step = max(spec.interleave_moe_layer_step or 1, 1)
    return spec.num_experts > 0 and i >= spec.first_dense_layers and (i + 1) % step == 0
