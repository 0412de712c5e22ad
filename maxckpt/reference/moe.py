"""MaxText's mixture-of-experts blocks: routers and experts, computed densely.

Every expert runs on every token and the router's weights (zero for experts
not chosen) combine them, which is what MaxText's dropless routing
(`capacity_factor=-1`, megablox or dense matmul) computes. Expert kernels are
bare arrays stacked over experts: `wi_0`, `wi_1 [E, emb, mlp]`, `wo [E, mlp, emb]`.

Routing rules:

- `softmax_topk` (mixtral, qwen3-moe, gpt-oss): the top-k router logits,
  softmaxed over those k. That equals HF's softmax-over-all, top-k,
  renormalise (qwen3's norm_topk_prob), and gpt-oss's router bias joins the logits first.
- `sigmoid_input` (llama4): the top-k router logits, each chosen expert's *input* scaled by sigmoid(logit),
  the outputs summed unweighted (MaxText scales `inputs` by the router scores for its llama4 block).
- `softmax_greedy` (deepseek2, HF topk_method "greedy"): softmax over every
  expert, the top-k of those probabilities as weights (not renormalised),
  times routed_scaling_factor.
- `sigmoid_bias` (deepseek3): scores sigmoid(logits); experts chosen by
  score + routing bias (the `nnx_aux` MoEBiasVar, a load-balancing device
  that must not change the weights); weights are the chosen scores without
  the bias, normalised to sum 1, times routed_scaling_factor. With
  n_group > 1 only experts of the topk_group best groups compete (MaxText's
  `n_routing_groups`; its deepseek3 configs leave it off, -1).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

from maxckpt.reference.model import SWIGLU_OAI_ALPHA, Model


def _activation(name: str):
    if name == "silu":
        return jax.nn.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    raise ValueError(f"unknown activation {name!r}")


def gated_mlp(x: jnp.ndarray, wi_0: jnp.ndarray, wi_1: jnp.ndarray, wo: jnp.ndarray, act: str) -> jnp.ndarray:
    """MaxText's `MlpBlock`: act(x @ wi_0) * (x @ wi_1) @ wo (SwiGLU for silu, GeGLU for gelu-tanh)."""
    return jnp.einsum("bsf,fe->bse", _activation(act)(x @ wi_0) * (x @ wi_1), wo)


def route(logits: jnp.ndarray, model: Model, bias: jnp.ndarray | None = None) -> jnp.ndarray:
    """Dense combine weights [B, S, E] of router logits [B, S, E] (zero off the top-k), by `model.routing`."""
    k = model.num_experts_per_tok
    if model.routing == "sigmoid_bias":
        scores = jax.nn.sigmoid(logits)
        choice = scores + bias if bias is not None else scores
        if model.n_group > 1:
            choice = _best_groups_only(choice, model.n_group, model.topk_group)
        _, top = jax.lax.top_k(choice, k)
        weights = jnp.take_along_axis(scores, top, axis=-1)
        if model.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        weights = weights * model.routed_scaling_factor
    elif model.routing == "sigmoid_input":  # llama4: the weights scale the expert's input (routed_experts)
        top_logits, top = jax.lax.top_k(logits, k)
        weights = jax.nn.sigmoid(top_logits)
    elif model.routing == "softmax_greedy":  # deepseek2: top-k of the softmax over every expert, not renormalised
        probs = jax.nn.softmax(logits, axis=-1)
        weights, top = jax.lax.top_k(probs, k)
        if model.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        weights = weights * model.routed_scaling_factor
    elif model.routing == "softmax_topk":
        top_logits, top = jax.lax.top_k(logits, k)
        weights = jax.nn.softmax(top_logits, axis=-1)
    else:
        raise ValueError(f"unknown routing {model.routing!r}")
    one_hot = jax.nn.one_hot(top, logits.shape[-1], dtype=weights.dtype)  # [B, S, k, E]
    return jnp.einsum("bsk,bske->bse", weights, one_hot)


def _best_groups_only(choice: jnp.ndarray, n_group: int, topk_group: int) -> jnp.ndarray:
    """Biased scores with every expert outside the topk_group best groups pushed to -inf.

    A group's score is the sum of its two best biased scores (MaxText's
    `expert_group_mask`, DeepSeek-V3's device-limited routing).
    """
    grouped = choice.reshape(choice.shape[:-1] + (n_group, -1))
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
    _, best = jax.lax.top_k(group_scores, topk_group)
    keep = jnp.sum(jax.nn.one_hot(best, n_group, dtype=choice.dtype), axis=-2) > 0
    keep = jnp.repeat(keep, choice.shape[-1] // n_group, axis=-1)
    return jnp.where(keep, choice, -jnp.inf)


def routed_experts(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], prefix: str, model: Model,
                   bias: jnp.ndarray | None = None) -> jnp.ndarray:
    """The routed experts' combined output [B, S, E] for the normed input x [B, S, E]."""
    logits = x @ p[f"{prefix}/gate/kernel"]
    if f"{prefix}/gate/bias" in p and model.routing == "softmax_topk":
        logits = logits + p[f"{prefix}/gate/bias"]  # gpt-oss's router bias (deepseek's is the nnx_aux one)
    combine = route(logits, model, bias)
    if model.routing == "sigmoid_input":  # each expert sees x * its weight (0 off the top-k), outputs summed
        gate = jnp.einsum("bse,xef,bsx->bsxf", x, p[f"{prefix}/wi_0"], combine)
        up = jnp.einsum("bse,xef,bsx->bsxf", x, p[f"{prefix}/wi_1"], combine)
        combine = (combine > 0).astype(x.dtype)  # an unchosen expert's zero input gives zero output anyway
    else:
        gate = jnp.einsum("bse,xef->bsxf", x, p[f"{prefix}/wi_0"])
        up = jnp.einsum("bse,xef->bsxf", x, p[f"{prefix}/wi_1"])
    limit = model.swiglu_limit
    if limit is not None:
        # gpt-oss's clamped SwiGLU with biases: min(g, l) * sigmoid(alpha g) * (clip(u, -l, l) + 1).
        gate = jnp.minimum(gate + p[f"{prefix}/wi_0_bias"], limit)
        up = jnp.clip(up + p[f"{prefix}/wi_1_bias"], -limit, limit)
        hidden = gate * jax.nn.sigmoid(SWIGLU_OAI_ALPHA * gate) * (up + 1)
    else:
        hidden = _activation(model.activation)(gate) * up
    out = jnp.einsum("bsxf,xfe->bsxe", hidden, p[f"{prefix}/wo"])
    if limit is not None:
        out = out + p[f"{prefix}/wo_bias"]
    return jnp.einsum("bsxe,bsx->bse", out, combine)


__all__ = ["gated_mlp", "route", "routed_experts"]
