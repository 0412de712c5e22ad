"""MaxText's forward pass of the Gated DeltaNet hybrids (qwen3-next), on MaxText-layout parameters.

Every layer: (1 + scale) RMSNorm, a token mixer, residual, (1 + scale) RMSNorm, routed experts plus a
shared expert gated by sigmoid(x @ shared_expert_gate), residual. The token mixer is

- a Gated DeltaNet layer (MaxText's `Qwen3NextGatedDeltaNet`): `in_proj_qkvz` / `in_proj_ba` split per
  key-head group, a causal depthwise conv over [q | k | v] and SiLU, beta = sigmoid(b),
  g = -exp(A_log) * softplus(a + dt_bias), q and k L2-normalised and repeated to the value heads, q
  scaled by key_head_dim**-0.5, then the delta rule run token by token (the recurrent form of MaxText's
  chunked kernel: h <- h exp(g); h <- h + k (beta (v - k.h)); o = q.h), a plain RMSNorm of o times
  silu(z), and `out_proj`;
- every full_attention_interval-th layer, gated attention: the query kernel gives [query | gate] per
  head, (1 + scale) q/k norms, rope on the first partial_rotary_factor of each head, softmax attention,
  the flattened output times sigmoid(gate), then `out/kernel [H*D, E]`.

>>> hybrid_forward(params, spec, [[1, 5, 9]]).shape   # doctest: +SKIP
(1, 3, 256)
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.errors import ShapeMismatchError, UnsupportedModelError
from maxckpt.formats.maxtext.layout import MaxTextLayout
from maxckpt.formats.maxtext.scans import Stack, layer_stacks
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.forms import Conv
from maxckpt.reference.attention import NEG_INF, attention_mask
from maxckpt.reference.forward import output_logits, rms_norm
from maxckpt.reference.model import Model
from maxckpt.reference.moe import gated_mlp, routed_experts
from maxckpt.reference.rope import default_timescale, rotate_half

L2_EPS = 1e-6  # MaxText's l2norm (use_qk_norm_in_gdn) and HF's, alike


def _norm(x: jnp.ndarray, scale: jnp.ndarray, model: Model) -> jnp.ndarray:
    """A decoder norm: x * (1 + scale) when the family's norms are zero-centred, else x * scale."""
    return rms_norm(x, 1.0 + scale if model.norm_plus_one else scale, model.rms_norm_eps)


def _l2norm(x: jnp.ndarray) -> jnp.ndarray:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def gated_attention(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model,
                    prefix: str) -> jnp.ndarray:
    """A hybrid's full-attention output [B, S, E] for the normed input x."""
    q = jnp.einsum("bse,ehd->bshd", x, p[f"{prefix}/query/kernel"])
    gate = None
    if model.attention_output_gate:
        q, gate = jnp.split(q, 2, axis=-1)
    k = jnp.einsum("bse,ehd->bshd", x, p[f"{prefix}/key/kernel"])
    v = jnp.einsum("bse,ehd->bshd", x, p[f"{prefix}/value/kernel"])
    if model.qk_norm:
        q, k = _norm(q, p[f"{prefix}/query_norm/scale"], model), _norm(k, p[f"{prefix}/key_norm/scale"], model)
    rotary = int(model.head_dim * model.partial_rotary_factor)
    timescale = default_timescale(rotary, model.rope_theta)

    def rope(t: jnp.ndarray) -> jnp.ndarray:
        return jnp.concatenate([rotate_half(t[..., :rotary], positions, timescale), t[..., rotary:]], axis=-1)

    q, k = rope(q) * model.head_dim**-0.5, rope(k)
    rep = model.num_heads // model.num_kv_heads
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    scores = jnp.where(attention_mask(x.shape[1], None), scores, NEG_INF)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    out = out.reshape(out.shape[:2] + (-1,))
    if gate is not None:
        out = out * jax.nn.sigmoid(gate.reshape(out.shape))
    kernel = p[f"{prefix}/out/kernel"]
    return out @ kernel.reshape(-1, kernel.shape[-1])


def gated_deltanet(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], model: Model, prefix: str) -> jnp.ndarray:
    """A Gated DeltaNet layer's output [B, S, E] for the normed input x."""
    B, S, _ = x.shape
    hk, hv = model.gdn_num_key_heads, model.gdn_num_value_heads
    dk, dv = model.gdn_key_head_dim, model.gdn_value_head_dim
    per = hv // hk
    qkvz = (x @ p[f"{prefix}/in_proj_qkvz/kernel"]).reshape(B, S, hk, 2 * dk + 2 * per * dv)
    q, k, v, z = jnp.split(qkvz, [dk, 2 * dk, 2 * dk + per * dv], axis=-1)
    ba = (x @ p[f"{prefix}/in_proj_ba/kernel"]).reshape(B, S, hk, 2 * per)
    b, a = ba[..., :per].reshape(B, S, hv), ba[..., per:].reshape(B, S, hv)
    mixed = jnp.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1)
    kernel = p[f"{prefix}/conv1d/kernel"][:, 0, :]  # [K, C]
    width = kernel.shape[0]
    padded = jnp.pad(mixed, ((0, 0), (width - 1, 0), (0, 0)))
    conv = sum(padded[:, i : i + S, :] * kernel[i] for i in range(width))
    mixed = jax.nn.silu(conv)
    q, k, v = jnp.split(mixed, [hk * dk, 2 * hk * dk], axis=-1)
    q, k, v = q.reshape(B, S, hk, dk), k.reshape(B, S, hk, dk), v.reshape(B, S, hv, dv)
    beta = jax.nn.sigmoid(b)
    g = -jnp.exp(p[f"{prefix}/A_log"]) * jax.nn.softplus(a + p[f"{prefix}/dt_bias"])
    q, k = _l2norm(q), _l2norm(k)
    q, k = jnp.repeat(q, per, axis=2), jnp.repeat(k, per, axis=2)
    q = q * dk**-0.5

    def step(h, t):  # h [B, H, Dk, Dv]
        q_t, k_t, v_t, g_t, beta_t = t
        h = h * jnp.exp(g_t)[..., None, None]
        delta = (v_t - jnp.einsum("bhkv,bhk->bhv", h, k_t)) * beta_t[..., None]
        h = h + k_t[..., :, None] * delta[..., None, :]
        return h, jnp.einsum("bhkv,bhk->bhv", h, q_t)

    seq_first = lambda t: jnp.moveaxis(t, 1, 0)  # noqa: E731
    h0 = jnp.zeros((B, hv, dk, dv), jnp.float32)
    _, o = jax.lax.scan(step, h0, tuple(seq_first(t) for t in (q, k, v, g, beta)))
    o = jnp.moveaxis(o, 0, 1)  # [B, S, H, Dv]
    o = rms_norm(o, p[f"{prefix}/norm/rms_norm/scale"], model.rms_norm_eps) * jax.nn.silu(z.reshape(B, S, hv, dv))
    return o.reshape(B, S, hv * dv) @ p[f"{prefix}/out_proj/kernel"]


def hybrid_layer(y: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model,
                 linear: bool) -> jnp.ndarray:
    """One hybrid decoder layer [B, S, E] -> [B, S, E] on its MaxText params (paths inside the layer)."""
    family = model.family
    pre, post = family.maxtext_layer_norms
    x = _norm(y, p[f"{pre}/scale"], model)
    if linear:
        y = y + gated_deltanet(x, p, model, family.maxtext_linear_attention)
    else:
        y = y + gated_attention(x, p, positions, model, family.maxtext_attention)
    x = _norm(y, p[f"{post}/scale"], model)
    if not model.num_experts:
        return y + gated_mlp(x, p["mlp/wi_0/kernel"], p["mlp/wi_1/kernel"], p["mlp/wo/kernel"], model.activation)
    out = routed_experts(x, p, family.maxtext_moe, model)
    if model.num_shared_experts:
        s = family.maxtext_shared_experts
        shared = gated_mlp(x, p[f"{s}/wi_0/kernel"], p[f"{s}/wi_1/kernel"], p[f"{s}/wo/kernel"], model.activation)
        if model.shared_expert_gate:
            shared = shared * jax.nn.sigmoid(x @ p[f"{s}_gate/kernel"])
        out = out + shared
    return y + out


_layer_jit = jax.jit(hybrid_layer, static_argnums=(3, 4))


def _layers(params: Mapping[str, np.ndarray], spec: ModelSpec) -> list[tuple[int, bool, dict[str, np.ndarray]]]:
    """(HF layer index, is Gated DeltaNet, its params by path inside the layer), in layer order."""
    layout = MaxTextLayout()
    scanned = layout.is_scanned(params)
    out = []
    for stack in layer_stacks(spec, scanned):
        linear = any(isinstance(getattr(p, "form", None), Conv) for p in stack.params)
        for k, index in enumerate(stack.hf_layers):
            out.append((index, linear, {p.key: _slice(params, stack, p, k, layout.scan_axis)
                                        for p in stack.params}))
    return sorted(out, key=lambda t: t[0])


def _slice(params: Mapping[str, np.ndarray], stack: Stack, p, k: int, axis: int) -> np.ndarray:
    if not stack.scanned:
        return params[stack.path(p, k)]
    arr = params[stack.path(p)]
    if stack.inner:
        b, j = divmod(k, stack.inner)
        return np.take(np.take(arr, b, axis=axis), j, axis=axis)
    return np.take(arr, k, axis=axis)


def hybrid_forward(
    params: Mapping[str, np.ndarray],
    spec: ModelSpec | Model,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's hybrid decoder on `tokens`."""
    model = Model.of(spec)
    if model.routing != "softmax_topk" or (model.num_experts and not model.norm_topk_prob):
        raise UnsupportedModelError(
            f"the hybrid reference routes softmax top-k with renormalised weights; {model.spec.family} here has "
            f"routing={model.routing!r}, norm_topk_prob={model.norm_topk_prob}"
        )
    tokens = jnp.asarray(np.asarray(tokens, np.int32))
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    positions = jnp.asarray(positions)
    try:
        layers = _layers(params, model.spec)
    except KeyError as err:
        raise UnsupportedModelError(
            f"the parameters do not look like a {model.spec.family} model in MaxText's layout (no {err.args[0]!r})"
        ) from err
    if [i for i, _, _ in layers] != list(range(model.num_layers)):
        raise ShapeMismatchError(f"the parameters do not hold the {model.num_layers} layers the ModelSpec says")
    embedding = jnp.asarray(params["token_embedder/embedding"], jnp.float32)
    y = embedding[tokens]
    for _, linear, layer in layers:
        y = _layer_jit(y, {n: jnp.asarray(a, jnp.float32) for n, a in layer.items()}, positions, model, linear)
    y = _norm(y, jnp.asarray(params["decoder/decoder_norm/scale"], jnp.float32), model)
    return output_logits(y, params, embedding, model, attend_in_bf16=attend_in_bf16)


__all__ = ["gated_attention", "gated_deltanet", "hybrid_forward", "hybrid_layer"]
