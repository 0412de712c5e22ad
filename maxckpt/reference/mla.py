"""DeepSeek's multi-head latent attention (MLA) as MaxText's `MLA` layer computes it.

Queries and keys/values go through low-rank bottlenecks, each RMS-normed:

- q = (norm(x @ wq_a) @ wq_b) per head [nope | rope] (`wq_b [q_lora, H, nope+rope]`);
- x @ wkv_a = [latent kv_lora | k_rope]; norm(latent) @ wkv_b per head
  [k_nope | v]; the one k_rope (YaRN-rotated, see :mod:`.rope`) is shared by all heads;
- keys [k_nope | k_rope] and queries [q_nope | q_rope] attend causally with
  softmax scale qk_head_dim**-0.5 * m**2, m = 0.1*mscale_all_dim*ln(factor) + 1:
  YaRN's magnitude correction goes into the logits, not into cos/sin;
- the heads' values through `out/kernel [H, v, E]`.

Without a query LoRA (deepseek2-16b, q_lora_rank 0) one `query/kernel [E, H, nope+rope]` makes q. DeepSeek-V3.2's
indexer (`indexer/...`) only picks which keys each query sees, indexer_topk of them: with no more tokens than
that it picks all, and the dense computation here is exact; with more, the forward refuses.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from maxckpt.errors import ConfigError
from maxckpt.reference.attention import NEG_INF, attention_mask
from maxckpt.reference.forward import rms_norm
from maxckpt.reference.model import Model
from maxckpt.reference.rope import yarn, yarn_attention_factor, yarn_frequencies, yarn_mscale


def mla_attention(
    x: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model
) -> jnp.ndarray:
    """MLA output [B, S, E] of the normed input x [B, S, E]; `p` holds `self_attention/wq_a/kernel`..."""
    eps, nope, rope = model.rms_norm_eps, model.qk_nope_head_dim, model.qk_rope_head_dim
    if model.indexer_n_heads and x.shape[1] > model.indexer_topk:
        raise ConfigError(
            f"{model.family.name}: {x.shape[1]} tokens but indexer_topk {model.indexer_topk}: the reference forward "
            "computes MLA densely, which is DeepSeek-V3.2's sparse attention only while every key fits in the "
            "indexer's top-k; pass at most indexer_topk tokens"
        )
    scaling = model.rope_scaling_dict
    freqs = yarn_frequencies(rope, model.rope_theta, scaling)
    factor = yarn_attention_factor(scaling)

    def rotate(t: jnp.ndarray) -> jnp.ndarray:
        return yarn(t, positions, freqs, interleave=model.rope_interleave, attention_factor=factor)

    if "self_attention/query/kernel" in p:  # q_lora_rank 0 (deepseek2-16b): one query kernel [E, H, nope+rope]
        q = jnp.einsum("bse,ehd->bshd", x, p["self_attention/query/kernel"])
    else:
        q_low = rms_norm(x @ p["self_attention/wq_a/kernel"], p["self_attention/q_norm/scale"], eps)
        q = jnp.einsum("bsr,rhd->bshd", q_low, p["self_attention/wq_b/kernel"])
    q = jnp.concatenate([q[..., :nope], rotate(q[..., nope:])], axis=-1)
    kv_a = x @ p["self_attention/wkv_a/kernel"]
    latent, k_rope = kv_a[..., : model.kv_lora_rank], kv_a[..., model.kv_lora_rank:]
    kv = jnp.einsum("bsr,rhd->bshd", rms_norm(latent, p["self_attention/kv_norm/scale"], eps),
                    p["self_attention/wkv_b/kernel"])
    k_nope, v = kv[..., :nope], kv[..., nope:]
    k_rope = jnp.broadcast_to(rotate(k_rope[:, :, None, :]), k_nope.shape[:3] + (rope,))
    k = jnp.concatenate([k_nope, k_rope], axis=-1)
    mscale_all_dim = float(scaling.get("mscale_all_dim", 1.0))
    m = yarn_mscale(float(scaling["factor"]), mscale_all_dim) if scaling.get("rope_type") == "yarn" else 1.0
    q = q * ((nope + rope) ** -0.5 * m * m)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    scores = jnp.where(attention_mask(x.shape[1], None), scores, NEG_INF)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhd,hde->bqe", out, p["self_attention/out/kernel"])


__all__ = ["mla_attention"]
