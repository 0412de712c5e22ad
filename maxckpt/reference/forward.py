"""MaxText's Llama-family forward pass in plain JAX, on MaxText-layout parameters.

Follows MaxText's own modules line by line where it matters for exactness:
RMSNorm in float32; rotary as MaxText applies it per family
(`RotaryEmbedding`'s rotate-half for llama2/llama3/mistral/qwen3,
`LLaMARotaryEmbedding`'s interleaved pairs with llama3.1 frequency scaling);
grouped-query attention with no 1/sqrt(head_dim) on the logits when the query
kernel already carries it, and `query * head_dim**-0.5` after the q/k norms
otherwise (qwen3); SwiGLU MLP; logits through `logits_dense` or the embedding.

MaxText's tied-embedding logits cast the embedding to bfloat16 before the
matmul (`attend_on_embedding`); `attend_in_bf16=True` does the same, to
reproduce MaxText's numbers, while the default keeps float32, to compare with
transformers.

>>> from maxckpt.conversion import open_checkpoint                     # doctest: +SKIP
>>> with open_checkpoint("run/checkpoints", model="llama3.1-8b") as c:  # doctest: +SKIP
...     logits = forward(read_maxtext_params(c), c.spec, [[1, 5, 9]])
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.layouts.base import ModelSpec
from maxckpt.reference.model import Model

_NEG_INF = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE


def rope_timescales(spec: ModelSpec) -> jnp.ndarray:
    """MaxText's per-feature rotary timescales ([D/2], or [D] repeated pairs when interleaved)."""
    d = spec.head_dim
    fraction = 2 * jnp.arange(0, d // 2) / d
    if spec.maxtext_rotary == "interleaved":
        fraction = jnp.repeat(fraction, 2)
    timescale = 1.0 * (spec.rope_theta / 1.0) ** fraction
    scaling = spec.rope_scaling or {}
    if str(scaling.get("rope_type", scaling.get("type", ""))) == "llama3":
        timescale = 1.0 / _llama3_scaled(1.0 / timescale, scaling)
    return timescale.astype(jnp.float32)


def _llama3_scaled(freq: jnp.ndarray, scaling: Mapping) -> jnp.ndarray:
    factor = float(scaling.get("factor", 8.0))
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * jnp.pi / freq
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * freq / factor + smooth * freq
    return jnp.where(wavelen < old / high, freq, jnp.where(wavelen > old / low, freq / factor, mid))


def _rotary(x: jnp.ndarray, positions: jnp.ndarray, timescale: jnp.ndarray, layout: str) -> jnp.ndarray:
    """x [B, S, H, D] with rotary applied the way MaxText does for `layout`."""
    sinusoid = positions[:, :, None, None].astype(jnp.float32) / timescale
    sin, cos = jnp.sin(sinusoid), jnp.cos(sinusoid)
    if layout == "half":
        first, second = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    d = x.shape[-1]
    left = jnp.concatenate([x[..., 1:], x[..., :1]], axis=-1)
    right = jnp.concatenate([x[..., -1:], x[..., :-1]], axis=-1)
    shifted = jnp.where(jnp.arange(d) % 2 == 1, right, left)
    sign = jnp.tile(jnp.array([-1.0, 1.0], jnp.float32), d // 2)
    return x * cos + shifted * sin * sign


def rms_norm(x: jnp.ndarray, scale: jnp.ndarray, eps: float) -> jnp.ndarray:
    """MaxText's RMSNorm, computed in float32 as MaxText does."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def decoder_layer(
    y: jnp.ndarray,
    p: Mapping[str, jnp.ndarray],
    positions: jnp.ndarray,
    timescale: jnp.ndarray,
    spec: ModelSpec,
) -> jnp.ndarray:
    """One MaxText decoder layer, pure JAX and differentiable (the demo trains with it).

    `p` holds the layer's params by their MaxText path inside the layer
    (`self_attention/query/kernel`, ...), without the layer axis.
    """
    eps = spec.rms_norm_eps
    x = rms_norm(y, p["pre_self_attention_layer_norm/scale"], eps)
    q = jnp.einsum("bse,ehd->bshd", x, p["self_attention/query/kernel"])
    k = jnp.einsum("bse,ehd->bshd", x, p["self_attention/key/kernel"])
    v = jnp.einsum("bse,ehd->bshd", x, p["self_attention/value/kernel"])
    if spec.qk_norm:
        q = rms_norm(q, p["self_attention/query_norm/scale"], eps)
        k = rms_norm(k, p["self_attention/key_norm/scale"], eps)
    q = _rotary(q, positions, timescale, spec.maxtext_rotary)
    k = _rotary(k, positions, timescale, spec.maxtext_rotary)
    if not spec.maxtext_query_scale:
        q = q * (spec.head_dim**-0.5)  # MaxText's query_pre_attn_scalar for q/k-normed models
    rep = spec.num_heads // spec.num_kv_heads
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    s = y.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, _NEG_INF)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    y = y + jnp.einsum("bqhd,hde->bqe", attn, p["self_attention/out/kernel"])
    x = rms_norm(y, p["post_self_attention_layer_norm/scale"], eps)
    gate = jax.nn.silu(jnp.einsum("bse,ef->bsf", x, p["mlp/wi_0/kernel"]))
    up = jnp.einsum("bse,ef->bsf", x, p["mlp/wi_1/kernel"])
    return y + jnp.einsum("bsf,fe->bse", gate * up, p["mlp/wo/kernel"])


_layer_jit = jax.jit(decoder_layer, static_argnums=(4,))


def _layer_params(params: Mapping[str, np.ndarray], i: int, scan_axis: int) -> dict[str, jnp.ndarray]:
    prefix = f"decoder/layers_{i}/"
    if any(n.startswith(prefix) for n in params):
        return {n[len(prefix):]: jnp.asarray(a, jnp.float32) for n, a in params.items() if n.startswith(prefix)}
    return {
        n[len("decoder/layers/"):]: jnp.asarray(np.take(a, i, axis=scan_axis), jnp.float32)
        for n, a in params.items()
        if n.startswith("decoder/layers/")
    }


def output_logits(y: jnp.ndarray, params: Mapping[str, np.ndarray], embedding: jnp.ndarray, spec: Any, *,
                  attend_in_bf16: bool = False) -> np.ndarray:
    """The decoder's logits (float32) from `y` after its final norm: the output kernel, or the tied table.

    Tied: multiplied in bfloat16 when `attend_in_bf16` (MaxText's attend_on_embedding), divided by sqrt(emb)
    where MaxText stores the table scaled (`maxtext_embedding_scaled`: gemma); soft-capped where the family caps
    (`final_logit_softcap`). `spec` is a ModelSpec or a reference Model.
    """
    if not spec.tie_word_embeddings and "decoder/logits_dense/kernel" in params:
        logits = y @ jnp.asarray(params["decoder/logits_dense/kernel"], jnp.float32)
    else:
        table = embedding.astype(jnp.bfloat16).astype(jnp.float32) if attend_in_bf16 else embedding
        logits = y @ table.T
        if spec.maxtext_embedding_scaled:
            logits = logits / jnp.sqrt(jnp.float32(y.shape[-1]))
    if spec.final_logit_softcap:
        cap = spec.final_logit_softcap
        logits = jnp.tanh(logits / cap) * cap
    return np.asarray(logits, np.float32)


def forward(
    params: Mapping[str, np.ndarray],
    spec: ModelSpec,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
    scan_axis: int = 1,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's decoder on `tokens`.

    `params` are MaxText paths without the `params/params/` prefix (scanned
    or unscanned), e.g. from :func:`maxckpt.reference.read_maxtext_params`.
    """
    tokens = jnp.asarray(np.asarray(tokens, np.int32))
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    positions = jnp.asarray(positions)
    embedding = jnp.asarray(params["token_embedder/embedding"], jnp.float32)
    timescale = rope_timescales(spec)
    y = embedding[tokens]
    model = Model.of(spec)
    for i in range(spec.num_layers):
        y = _layer_jit(y, _layer_params(params, i, scan_axis), positions, timescale, model)
    y = rms_norm(y, jnp.asarray(params["decoder/decoder_norm/scale"], jnp.float32), spec.rms_norm_eps)
    return output_logits(y, params, embedding, spec, attend_in_bf16=attend_in_bf16)
