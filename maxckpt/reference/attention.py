"""Grouped-query attention as MaxText's `Attention` / `GptOssAttention` compute it.

One function covers mixtral, qwen3-moe, gemma2, gemma3 and gpt-oss; the
family differences are ModelSpec fields (through :class:`~maxckpt.reference.model.Model`),
applied in MaxText's order:

1. q, k, v projections (`query/kernel [E, H, D]`), plus biases for gpt-oss and qwen2.5;
2. per-head RMSNorm of q and k (qwen3-moe, gemma3), before RoPE;
3. RoPE with the layer type's base and scaling (see :mod:`.rope`);
4. q * query_pre_attn_scalar**-0.5 when the scale is not folded into the
   query kernel (mixtral and gemma2 fold it; MaxText initialises and trains
   that kernel with the factor inside, so it must not be applied twice);
5. logits q.k, softcapped as cap*tanh(s/cap) (gemma2), masked causally and,
   in sliding layers, to keys with i - j < window (MaxText's mask value is
   -0.7 * float32 max, not -inf);
6. softmax, with gpt-oss's per-head sink logit joining the denominator only;
7. the weighted values through `out/kernel [H, D, E]` (+ `out/bias`).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.reference.forward import rms_norm
from maxckpt.reference.model import Model
from maxckpt.reference.rope import default_timescale, rotate_half, yarn, yarn_attention_factor, yarn_frequencies

NEG_INF = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, model: Model, sliding: bool) -> jnp.ndarray:
    """RoPE of a GQA family for one layer type (sliding layers of gemma3 use their own base, unscaled)."""
    d = x.shape[-1]
    scaling = model.rope_scaling_dict
    if sliding and model.local_rope_theta is not None:
        return rotate_half(x, positions, default_timescale(d, model.local_rope_theta))
    kind = scaling.get("rope_type", "default")
    if kind == "yarn":
        freqs = yarn_frequencies(d, model.rope_theta, scaling)
        factor = yarn_attention_factor(scaling)
        return yarn(x, positions, freqs, interleave=model.rope_interleave, attention_factor=factor)
    linear = float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0
    return rotate_half(x, positions, default_timescale(d, model.rope_theta, linear))


def attention_mask(seq: int, window: int | None) -> jnp.ndarray:
    """[S, S] bool: causal, and i - j < window when the layer slides."""
    i = jnp.arange(seq)[:, None]
    j = jnp.arange(seq)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    return allowed


def gqa_attention(
    x: jnp.ndarray,
    p: Mapping[str, jnp.ndarray],
    positions: jnp.ndarray,
    model: Model,
    *,
    sliding: bool,
    prefix: str = "self_attention",
) -> jnp.ndarray:
    """Attention output [B, S, E] of the normed input x [B, S, E]; `p` holds `{prefix}/query/kernel`..."""
    def proj(name: str) -> jnp.ndarray:
        y = jnp.einsum("bse,ehd->bshd", x, p[f"{prefix}/{name}/kernel"])
        if model.attention_bias or model.qkv_bias:
            y = y + p[f"{prefix}/{name}/bias"]
        return y

    q, k, v = proj("query"), proj("key"), proj("value")
    if model.qk_norm and model.family.qk_norm_across_heads:  # olmo3: over all heads together
        b, s = q.shape[:2]
        q = rms_norm(q.reshape(b, s, -1), p[f"{prefix}/query_norm/scale"], model.rms_norm_eps).reshape(q.shape)
        k = rms_norm(k.reshape(b, s, -1), p[f"{prefix}/key_norm/scale"], model.rms_norm_eps).reshape(k.shape)
    elif model.qk_norm:
        q = rms_norm(q, p[f"{prefix}/query_norm/scale"], model.rms_norm_eps)
        k = rms_norm(k, p[f"{prefix}/key_norm/scale"], model.rms_norm_eps)
    q = apply_rope(q, positions, model, sliding)
    k = apply_rope(k, positions, model, sliding)
    if not model.maxtext_query_scale:  # not folded into the query kernel: scaled at runtime
        q = q * (model.query_pre_attn_scalar or model.head_dim) ** -0.5
    rep = model.num_heads // model.num_kv_heads
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    if model.attn_logit_softcap:
        cap = model.attn_logit_softcap
        scores = jnp.tanh(scores / cap) * cap
    seq = x.shape[1]
    scores = jnp.where(attention_mask(seq, model.sliding_window if sliding else None), scores, NEG_INF)
    if model.attention_sinks:
        sinks = jnp.broadcast_to(p[f"{prefix}/sinks"][None, :, None, None], scores.shape[:3] + (1,))
        probs = jax.nn.softmax(jnp.concatenate([scores, sinks], axis=-1), axis=-1)[..., :-1]
    else:
        probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    out = jnp.einsum("bqhd,hde->bqe", out, p[f"{prefix}/out/kernel"])
    if model.attention_bias:
        out = out + p[f"{prefix}/out/bias"]
    return out


__all__ = ["NEG_INF", "apply_rope", "attention_mask", "gqa_attention"]
