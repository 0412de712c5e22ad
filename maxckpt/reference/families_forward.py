"""MaxText's forward pass of the MoE, MLA and Gemma families, on MaxText-layout parameters.

Covers mixtral, qwen3-moe, gemma2, gemma3, gpt-oss and deepseek3 (the Llama
family is :func:`maxckpt.reference.forward`). It reproduces the logits MaxText
itself computed for the fixtures in shared/fixtures/maxtext (see
tests/test_reference_families.py), in float32 as MaxText ran them.

Layer bodies, per family:

- mixtral, qwen3-moe, gpt-oss: pre-norm, attention (:mod:`.attention`),
  residual, post-attention norm, routed experts (:mod:`.moe`), residual.
- gemma2, gemma3: Gemma's sandwich - pre-norm, attention, post-attention
  norm on the branch, residual; pre-ffw norm, GeGLU MLP, post-ffw norm,
  residual.
- deepseek3: pre-norm, MLA (:mod:`.mla`), residual, norm, then a SwiGLU MLP
  in the first `first_k_dense_replace` layers and routed + shared experts
  after, residual.

Output: the final RMSNorm, then `logits_dense` when present, else the
embedding table. MaxText casts that table to bfloat16 for the product
(`attend_on_embedding`) even in a float32 run; `attend_in_bf16=True` does the
same (to match MaxText), the default keeps float32 (to match an exact HF
forward). Gemma divides tied logits by sqrt(emb) (MaxText stores the input
table pre-multiplied by sqrt(emb) instead of scaling inputs) and gemma2
softcaps them.

>>> params = read_maxtext_params("run/checkpoints/5/items")            # doctest: +SKIP
>>> arch = infer_arch("gpt-oss", params, num_experts_per_tok=2)         # doctest: +SKIP
>>> family_forward(params, arch, [[1, 5, 9]], attend_in_bf16=True).shape  # doctest: +SKIP
(1, 3, 256)
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.errors import ShapeMismatchError, TensorNotFoundError
from maxckpt.reference.arch import ArchConfig
from maxckpt.reference.attention import gqa_attention
from maxckpt.reference.forward import rms_norm
from maxckpt.reference.mla import mla_attention
from maxckpt.reference.moe import gated_mlp, routed_experts
from maxckpt.reference.stacks import layer_groups

_MOE_PREFIX = {"mixtral": "MoeBlock_0", "qwen3_moe": "moe_block", "gpt_oss": "GptOssMlp"}
DEEPSEEK_ROUTED = "DeepSeekMoeBlock_0/MoeBlock_0"
DEEPSEEK_SHARED = "DeepSeekMoeBlock_0/shared_experts"
#: Where the deepseek routing bias sits inside a MoE layer's parameters (from `nnx_aux`).
ROUTING_BIAS = f"{DEEPSEEK_ROUTED}/gate/bias"


def _mlp(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], prefix: str, act: str) -> jnp.ndarray:
    return gated_mlp(x, p[f"{prefix}/wi_0/kernel"], p[f"{prefix}/wi_1/kernel"], p[f"{prefix}/wo/kernel"], act)


def family_layer(
    y: jnp.ndarray,
    p: Mapping[str, jnp.ndarray],
    positions: jnp.ndarray,
    arch: ArchConfig,
    layer_type: str,
    moe: bool,
) -> jnp.ndarray:
    """One decoder layer [B, S, E] -> [B, S, E]; `p` as :meth:`LayerRef.params` gives it (as jnp arrays)."""
    eps, kind = arch.rms_norm_eps, arch.family
    sliding = layer_type == "sliding_attention"
    if arch.sandwich_norms:
        x = rms_norm(y, p["pre_self_attention_norm/scale"], eps)
        a = gqa_attention(x, p, positions, arch, sliding=sliding)
        y = y + rms_norm(a, p["post_self_attention_norm/scale"], eps)
        x = rms_norm(y, p["pre_ffw_norm/scale"], eps)
        return y + rms_norm(_mlp(x, p, "mlp", arch.hidden_act), p["post_ffw_norm/scale"], eps)
    x = rms_norm(y, p["pre_self_attention_layer_norm/scale"], eps)
    if kind == "deepseek3":
        y = y + mla_attention(x, p, positions, arch)
    else:
        prefix = "GptOssAttention" if kind == "gpt_oss" else "self_attention"
        y = y + gqa_attention(x, p, positions, arch, sliding=sliding, prefix=prefix)
    x = rms_norm(y, p["post_self_attention_layer_norm/scale"], eps)
    if kind == "deepseek3":
        if not moe:
            return y + _mlp(x, p, "mlp", arch.hidden_act)
        routed = routed_experts(x, p, DEEPSEEK_ROUTED, arch, bias=p[ROUTING_BIAS])
        return y + routed + _mlp(x, p, DEEPSEEK_SHARED, arch.hidden_act)
    return y + routed_experts(x, p, _MOE_PREFIX[kind], arch)


_layer_jit = jax.jit(family_layer, static_argnums=(3, 4, 5))


def family_forward(
    params: Mapping[str, np.ndarray],
    arch: ArchConfig,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's decoder for `arch.family` on `tokens`.

    `params` are MaxText paths without `params/params/`, scanned or unscanned,
    plus deepseek's routing bias under its `nnx_aux/model/...` name, e.g. from
    :func:`maxckpt.reference.reading.read_maxtext_params`.
    """
    tokens = jnp.asarray(np.asarray(tokens, np.int32))
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    positions = jnp.asarray(positions)
    refs = layer_groups(arch.family, params)
    if len(refs) != arch.num_hidden_layers:
        raise ShapeMismatchError(
            f"the parameters hold {len(refs)} {arch.family} decoder layers, "
            f"the ArchConfig says {arch.num_hidden_layers}"
        )
    embedding = jnp.asarray(params["token_embedder/embedding"], jnp.float32)
    y = embedding[tokens]
    for ref in refs:
        layer = {n: jnp.asarray(a, jnp.float32) for n, a in ref.params(params).items()}
        if arch.family == "deepseek3" and ref.moe and ROUTING_BIAS not in layer:
            raise TensorNotFoundError(
                f"deepseek3 MoE layer {ref.index} has no routing bias (nnx_aux/model/{ref.prefix}{ROUTING_BIAS}): "
                "read the checkpoint with maxckpt.reference.read_maxtext_params, which keeps nnx_aux, "
                "or add the bias (HF e_score_correction_bias) under that name"
            )
        y = _layer_jit(y, layer, positions, arch, arch.layer_types[ref.index], ref.moe)
    y = rms_norm(y, jnp.asarray(params["decoder/decoder_norm/scale"], jnp.float32), arch.rms_norm_eps)
    if not arch.tie_word_embeddings and "decoder/logits_dense/kernel" in params:
        logits = y @ jnp.asarray(params["decoder/logits_dense/kernel"], jnp.float32)
    else:
        table = embedding.astype(jnp.bfloat16).astype(jnp.float32) if attend_in_bf16 else embedding
        logits = y @ table.T
        if arch.normalize_embedding_logits:
            logits = logits / jnp.sqrt(jnp.float32(y.shape[-1]))
    if arch.final_logit_softcapping:
        cap = arch.final_logit_softcapping
        logits = jnp.tanh(logits / cap) * cap
    return np.asarray(logits, np.float32)


__all__ = ["ROUTING_BIAS", "family_forward", "family_layer"]
