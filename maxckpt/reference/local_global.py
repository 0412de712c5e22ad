"""MaxText's Gemma 4 forward (`gemma4` decoder block), on MaxText-layout parameters, scanned or unscanned.

Every layer (models/gemma4.py, `Gemma4DecoderLayer`): RMSNorm, attention, post-attention norm, residual;
pre-ffw norm, the MLP, post-ffw norm, residual; the output times the layer's `layer_scalar`. Attention has
q/k norms with scales and a scale-free v norm, no query scaling; sliding layers rope their whole head with the
local theta, full-attention layers (their own head width and kv heads, the key doubling as the value when
they have no value kernel) rope the first `global_partial_rotary_factor` share of each head's rotate-half
pairs, with frequencies over the whole head width (MaxText's `Gemma4PartialRotaryEmbedding`, HF's
"proportional" rope). The MoE variant (`Gemma4MoE`) runs the dense MLP (`moe_block/shared_experts`) and the
routed experts side by side: experts see pre_feedforward_layernorm_2 of the residual stream, the router sees
its scale-free norm times emb**-0.5 times `pre_forward_scale_2`; softmax over all experts, top-k,
renormalised, times `per_expert_scale`; each branch has its own post norm before they are summed.
The small models (`gemma4_small`: e2b, e4b) add per-layer inputs (the per-layer table times sqrt(P) plus the
normed projection of the input embeddings times emb**-0.5, summed times 2**-0.5), which each layer gates
with gelu(per_layer_input_gate(h)), projects, norms and adds after its MLP; their last num_kv_shared_layers
layers attend with the keys/values of the last earlier layer of their type.
Output: final norm, the tied (sqrt(emb)-scaled) table / sqrt(emb), softcap.

>>> local_global_forward(params, spec, [[1, 5, 9]]).shape   # doctest: +SKIP
(1, 3, 256)
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.errors import ShapeMismatchError
from maxckpt.formats.maxtext import local_global
from maxckpt.formats.maxtext.scans import layer_stacks
from maxckpt.layouts import geometry
from maxckpt.layouts.base import ModelSpec
from maxckpt.reference.forward import output_logits, rms_norm
from maxckpt.reference.model import Model
from maxckpt.reference.moe import _activation, gated_mlp

NEG_INF = -1e30
MOE = "mlp/moe_block/MoeBlock_0"
DENSE_IN_MOE = "mlp/moe_block/shared_experts"


def per_layer_params(params: Mapping[str, np.ndarray], spec: ModelSpec) -> list[dict[str, np.ndarray]]:
    """Each HF-numbered layer's parameters by their path inside the layer, its layer axes removed."""
    scanned = local_global.is_scanned(params) or any(n.startswith("decoder/layers_remainder/") for n in params)
    layers: dict[int, dict[str, np.ndarray]] = {}
    for stack in layer_stacks(spec, scanned):
        for k, i in enumerate(stack.hf_layers):
            one: dict[str, np.ndarray] = {}
            for p in stack.params:
                if not stack.scanned:
                    one[p.key] = np.asarray(params[stack.path(p, k)])
                    continue
                arr = np.asarray(params[stack.path(p)])
                if stack.inner:
                    b, j = divmod(k, stack.inner)
                    arr = np.take(np.take(arr, b, axis=1), j, axis=1)
                else:
                    arr = np.take(arr, k, axis=1)
                one[p.key] = arr
            layers[i] = one
    if sorted(layers) != list(range(spec.num_layers)):
        raise ShapeMismatchError(f"the parameters hold layers {sorted(layers)}, the ModelSpec says {spec.num_layers}")
    return [layers[i] for i in range(spec.num_layers)]


def rope(x: jnp.ndarray, positions: jnp.ndarray, theta: float, factor: float) -> jnp.ndarray:
    """Rotate-half rope [B, S, H, D] on the first `factor` share of the D/2 pairs, frequencies over all of D."""
    d = x.shape[-1]
    half, rotated = d // 2, int(d * factor) // 2
    inv = 1.0 / theta ** (2 * jnp.arange(half, dtype=jnp.float32) / d)
    inv = jnp.where(jnp.arange(half) < rotated, inv, 0.0)
    angles = positions[..., None].astype(jnp.float32) * inv  # [B, S, half]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _plain_norm(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    return rms_norm(x, 1.0, eps)


def attention_kv(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model,
                 full: bool) -> tuple[jnp.ndarray, jnp.ndarray]:
    """This layer's normed, roped keys and normed values [B, S, G, D]."""
    eps, m = model.rms_norm_eps, model.attention_module
    k = jnp.einsum("bse,egd->bsgd", x, p[f"{m}/key/kernel"])
    v = jnp.einsum("bse,egd->bsgd", x, p[f"{m}/value/kernel"]) if f"{m}/value/kernel" in p else k
    k = rms_norm(k, p[f"{m}/key_norm/scale"], eps)
    v = _plain_norm(v, eps)
    theta, factor = _rope_of(model, full)
    return rope(k, positions, theta, factor), v


def _rope_of(model: Model, full: bool) -> tuple[float, float]:
    if full:
        return float(model.rope_theta), float(model.global_partial_rotary_factor)
    return float(model.local_rope_theta or model.rope_theta), 1.0


def attention(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model, full: bool,
              kv: tuple[jnp.ndarray, jnp.ndarray]) -> jnp.ndarray:
    """Attention output [B, S, E] of the normed input x, with keys/values `kv` (this layer's or a donor's)."""
    m = model.attention_module
    q = jnp.einsum("bse,ehd->bshd", x, p[f"{m}/query/kernel"])
    q = rms_norm(q, p[f"{m}/query_norm/scale"], model.rms_norm_eps)
    theta, factor = _rope_of(model, full)
    q = rope(q, positions, theta, factor)
    k, v = kv
    heads, groups = q.shape[2], k.shape[2]
    k, v = jnp.repeat(k, heads // groups, axis=2), jnp.repeat(v, heads // groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)  # no query scaling (q/k norms)
    qpos, kpos = positions[:, None, :, None], positions[:, None, None, :]
    allowed = kpos <= qpos
    if not full and model.sliding_window:
        allowed = allowed & (qpos - kpos < model.sliding_window)
    weights = jax.nn.softmax(jnp.where(allowed, scores, NEG_INF), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return jnp.einsum("bshd,hde->bse", out, p[f"{m}/out/kernel"])


def moe_mlp(h: jnp.ndarray, x: jnp.ndarray, p: Mapping[str, jnp.ndarray], model: Model) -> jnp.ndarray:
    """Gemma4MoE: the dense MLP of x and the routed experts of the residual stream h, each post-normed."""
    eps, act = model.rms_norm_eps, model.activation
    dense = gated_mlp(x, p[f"{DENSE_IN_MOE}/wi_0/kernel"], p[f"{DENSE_IN_MOE}/wi_1/kernel"],
                      p[f"{DENSE_IN_MOE}/wo/kernel"], act)
    dense = rms_norm(dense, p["mlp/post_feedforward_layernorm_1/scale"], eps)
    routed_in = rms_norm(h, p["mlp/pre_feedforward_layernorm_2/scale"], eps)
    gate_in = _plain_norm(h, eps) * (h.shape[-1] ** -0.5) * p["mlp/pre_forward_scale_2"]
    logits = gate_in @ p[f"{MOE}/gate/kernel"]
    probs = jax.nn.softmax(logits, axis=-1)
    k = model.num_experts_per_tok
    _, idx = jax.lax.top_k(logits, k)
    top = jnp.take_along_axis(probs, idx, axis=-1)
    if model.norm_topk_prob:
        top = top / top.sum(-1, keepdims=True)
    top = top * p[f"{MOE}/per_expert_scale"][idx]
    combine = jnp.sum(jax.nn.one_hot(idx, probs.shape[-1]) * top[..., None], axis=-2)  # [B, S, X]
    hidden = jnp.einsum("bse,xem->bsxm", routed_in, p[f"{MOE}/wi_0"])
    up = jnp.einsum("bse,xem->bsxm", routed_in, p[f"{MOE}/wi_1"])
    experts = jnp.einsum("bsxm,xme->bsxe", _activation(act)(hidden) * up, p[f"{MOE}/wo"])
    routed = jnp.einsum("bsxe,bsx->bse", experts, combine)
    return dense + rms_norm(routed, p["mlp/post_feedforward_layernorm_2/scale"], eps)


def per_layer_inputs(params: Mapping[str, np.ndarray], tokens: jnp.ndarray, embedded: jnp.ndarray,
                     model: Model) -> jnp.ndarray:
    """Gemma4SmallPLE: every layer's input [B, S, L, P] from the tokens and their input embeddings."""
    root = "decoder/per_layer_embedder"
    dim, layers = model.per_layer_input_dim, model.num_layers
    table = jnp.asarray(params[f"{root}/embed_tokens_per_layer"], jnp.float32)
    identity = (table[tokens] * jnp.float32(dim ** 0.5)).reshape(*tokens.shape, layers, dim)
    kernel = jnp.asarray(params[f"{root}/per_layer_model_projection/kernel"], jnp.float32)
    context = (embedded @ kernel * jnp.float32(model.emb_dim ** -0.5)).reshape(*tokens.shape, layers, dim)
    context = rms_norm(context, jnp.asarray(params[f"{root}/per_layer_projection_norm/scale"], jnp.float32),
                       model.rms_norm_eps)
    return (identity + context) * jnp.float32(2.0 ** -0.5)


def layer(y: jnp.ndarray, p: Mapping[str, jnp.ndarray], positions: jnp.ndarray, model: Model, full: bool,
          kv: tuple[jnp.ndarray, jnp.ndarray] | None = None, extra: jnp.ndarray | None = None,
          ) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """One decoder layer [B, S, E] -> [B, S, E], and the keys/values it attended with (`kv`: a donor's;
    `extra`: the layer's per-layer input [B, S, P])."""
    eps = model.rms_norm_eps
    x = rms_norm(y, p["pre_self_attention_norm/scale"], eps)
    if kv is None:
        kv = attention_kv(x, p, positions, model, full)
    y = y + rms_norm(attention(x, p, positions, model, full, kv), p["post_self_attention_norm/scale"], eps)
    x = rms_norm(y, p["pre_ffw_norm/scale"], eps)
    if model.num_experts:
        mlp = moe_mlp(y, x, p, model)
    else:
        mlp = gated_mlp(x, p["mlp/wi_0/kernel"], p["mlp/wi_1/kernel"], p["mlp/wo/kernel"], model.activation)
    y = y + rms_norm(mlp, p["post_ffw_norm/scale"], eps)
    if extra is not None:
        gated = _activation("gelu_tanh")(y @ p["per_layer_input_gate/kernel"]) * extra
        y = y + rms_norm(gated @ p["per_layer_projection/kernel"], p["post_per_layer_input_norm/scale"], eps)
    if "layer_scalar" in p:
        y = y * p["layer_scalar"]
    return y, kv


def local_global_forward(
    params: Mapping[str, np.ndarray],
    spec: ModelSpec | Model,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's Gemma 4 decoder on `tokens`."""
    model = Model.of(spec)
    spec = model.spec
    tokens = jnp.asarray(np.asarray(tokens, np.int32))
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    positions = jnp.asarray(positions)
    embedding = jnp.asarray(params["token_embedder/embedding"], jnp.float32)
    y = embedding[tokens]
    extras = per_layer_inputs(params, tokens, y, model) if spec.per_layer_input_dim else None
    kvs: dict[int, tuple[jnp.ndarray, jnp.ndarray]] = {}
    for i, p in enumerate(per_layer_params(params, spec)):
        p = {n: jnp.asarray(a, jnp.float32) for n, a in p.items()}
        donor = geometry.kv_donor(spec, i)
        if geometry.is_kv_shared(spec, i) and donor is None:
            raise ShapeMismatchError(f"{spec.family}: KV-shared layer {i} has no earlier layer of its type to share")
        extra = extras[:, :, i, :] if extras is not None else None
        y, kvs[i] = layer(y, p, positions, model, geometry.is_full_attention(spec, i),
                          kvs[donor] if donor is not None else None, extra)
    y = rms_norm(y, jnp.asarray(params["decoder/decoder_norm/scale"], jnp.float32), model.rms_norm_eps)
    return output_logits(y, params, embedding, model, attend_in_bf16=attend_in_bf16)


__all__ = ["local_global_forward", "per_layer_params"]
