"""Attention of a "cycle" family (llama4) as MaxText's `Attention` computes it for `decoder_block: llama4`.

Per layer, by the ModelSpec's patterns (:func:`maxckpt.formats.hf.layer_cycle.has_rope`):

1. q, k, v projections (`query/kernel [E, H, D]`);
2. rope layers: MaxText's `LLaMARotaryEmbedding` (interleaved pairs, llama3 frequency scaling when the spec
   has it), then, with `qk_l2_norm`, the weight-free L2 norm x * rsqrt(mean(x^2) + eps) of q and k;
3. q * head_dim**-0.5 (query_pre_attn_scalar: not folded into the kernel);
4. NoPE layers with `attn_temperature_tuning`: q * (log(floor((pos + 1) / 8192) + 1) * 0.1 + 1);
5. causal softmax attention, rope layers within chunks of `attention_chunk_size` tokens (MaxText's
   ChunkedCausalMask: query and key in the same chunk), NoPE layers over the whole sequence;
6. the weighted values through `out/kernel [H, D, E]`.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from maxckpt.formats.hf.layer_cycle import has_rope
from maxckpt.reference.attention import NEG_INF
from maxckpt.reference.forward import _llama3_scaled, _rotary
from maxckpt.reference.model import Model

NOPE, CHUNKED, FULL = "nope_attention", "chunked_attention", "full_attention"
FLOOR_SCALE, ATTN_SCALE = 8192.0, 0.1  # MaxText's temperature_tuning_floor_scale / _scale (HF floor_scale / attn_scale)


def cycle_layer_type(model: Model, i: int) -> str:
    """Layer i's attention: NoPE (whole sequence), or rope within chunks, or rope over the whole sequence."""
    if not has_rope(model.spec, i):
        return NOPE
    return CHUNKED if model.attention_chunk_size else FULL


def _timescale(model: Model) -> jnp.ndarray:
    """MaxText `LLaMARotaryEmbedding.timescale`: theta**(2i/D), each repeated for its pair (the family's
    rotary order, Family.hf_rotary, is interleaved), llama3-scaled."""
    d = model.head_dim
    fraction = 2 * jnp.arange(0, d // 2) / d
    if model.family.hf_rotary == "interleaved":
        fraction = jnp.repeat(fraction, 2)
    timescale = model.rope_theta ** fraction
    scaling = model.rope_scaling_dict
    if str(scaling.get("rope_type", scaling.get("type", ""))) == "llama3":
        timescale = 1.0 / _llama3_scaled(1.0 / timescale, scaling)
    return timescale.astype(jnp.float32)


def _l2norm(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def cycle_attention(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model,
                    layer_type: str, prefix: str = "self_attention") -> jnp.ndarray:
    """Attention output [B, S, E] of the normed input x [B, S, E] for one layer of `layer_type`."""
    q, k, v = (jnp.einsum("bse,ehd->bshd", x, p[f"{prefix}/{n}/kernel"]) for n in ("query", "key", "value"))
    if layer_type != NOPE:
        timescale, order = _timescale(model), model.family.hf_rotary
        q, k = _rotary(q, positions, timescale, order), _rotary(k, positions, timescale, order)
        if model.qk_l2_norm:
            q, k = _l2norm(q, model.rms_norm_eps), _l2norm(k, model.rms_norm_eps)
    q = q * model.head_dim ** -0.5
    if layer_type == NOPE and model.attn_temperature_tuning:
        scales = jnp.log(jnp.floor((positions.astype(jnp.float32) + 1.0) / FLOOR_SCALE) + 1.0) * ATTN_SCALE + 1.0
        q = q * scales[:, :, None, None]
    rep = model.num_heads // model.num_kv_heads
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    seq = x.shape[1]
    i, j = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
    allowed = j <= i
    if layer_type == CHUNKED:
        allowed = allowed & (i // model.attention_chunk_size == j // model.attention_chunk_size)
    probs = jax.nn.softmax(jnp.where(allowed, scores, NEG_INF), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return jnp.einsum("bqhd,hde->bqe", out, p[f"{prefix}/out/kernel"])


__all__ = ["cycle_attention", "cycle_layer_type"]
