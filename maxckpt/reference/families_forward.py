"""MaxText's forward pass of the MoE, MLA and Gemma families, on MaxText-layout parameters.

Covers mixtral, qwen3-moe, gemma2, gemma3, gpt-oss and deepseek3 (the Llama
family is :func:`maxckpt.reference.forward`), from a ModelSpec and its family record
(:class:`~maxckpt.reference.model.Model`). It reproduces the logits MaxText
itself computed for the fixtures in shared/fixtures/maxtext (see
tests/test_reference/test_reference_families.py), in float32 as MaxText ran them.

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

>>> with open_checkpoint("run/checkpoints", model="gpt-oss-20b") as ckpt:   # doctest: +SKIP
...     params, spec = read_maxtext_params(ckpt), ckpt.spec
>>> family_forward(params, spec, [[1, 5, 9]], attend_in_bf16=True).shape      # doctest: +SKIP
(1, 3, 256)
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxckpt.errors import ShapeMismatchError, TensorNotFoundError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.reference.attention import gqa_attention
from maxckpt.formats.hf.layout import is_moe_layer
from maxckpt.reference.forward import output_logits, rms_norm
from maxckpt.reference.layer_cycle import cycle_attention, cycle_layer_type
from maxckpt.reference.mla import mla_attention
from maxckpt.reference.model import Model
from maxckpt.reference.moe import gated_mlp, routed_experts
from maxckpt.reference.stacks import layer_groups

DEEPSEEK_ROUTED = "DeepSeekMoeBlock_0/MoeBlock_0"
#: Where the deepseek routing bias sits inside a MoE layer's parameters (from `nnx_aux`).
ROUTING_BIAS = f"{DEEPSEEK_ROUTED}/gate/bias"


def _mlp(x: jnp.ndarray, p: Mapping[str, jnp.ndarray], prefix: str, act: str) -> jnp.ndarray:
    return gated_mlp(x, p[f"{prefix}/wi_0/kernel"], p[f"{prefix}/wi_1/kernel"], p[f"{prefix}/wo/kernel"], act)


def family_layer(
    y: jnp.ndarray,
    p: Mapping[str, jnp.ndarray],
    positions: jnp.ndarray,
    model: Model,
    layer_type: str,
    moe: bool,
) -> jnp.ndarray:
    """One decoder layer [B, S, E] -> [B, S, E]; `p` as :meth:`LayerRef.params` gives it (as jnp arrays)."""
    eps = model.rms_norm_eps
    sliding = layer_type == "sliding_attention"
    if model.sandwich_norms:
        x = rms_norm(y, p["pre_self_attention_norm/scale"], eps)
        a = gqa_attention(x, p, positions, model, sliding=sliding)
        y = y + rms_norm(a, p["post_self_attention_norm/scale"], eps)
        x = rms_norm(y, p["pre_ffw_norm/scale"], eps)
        return y + rms_norm(_mlp(x, p, "mlp", model.activation), p["post_ffw_norm/scale"], eps)
    pre, post = model.family.maxtext_layer_norms
    if model.family.post_norms:  # OLMo 3: the norms on the attention and MLP outputs, none on their inputs
        y = y + rms_norm(gqa_attention(y, p, positions, model, sliding=sliding, prefix=model.attention_module),
                         p[f"{pre}/scale"], eps)
        return y + rms_norm(_mlp(y, p, "mlp", model.activation), p[f"{post}/scale"], eps)
    x = rms_norm(y, p[f"{pre}/scale"], eps)
    if model.mla:
        y = y + mla_attention(x, p, positions, model)
    elif model.scan == "cycle":  # llama4: NoPE / chunked rope layers, L2 q/k norm
        y = y + cycle_attention(x, p, positions, model, layer_type, prefix=model.attention_module)
    else:
        y = y + gqa_attention(x, p, positions, model, sliding=sliding, prefix=model.attention_module)
    x = rms_norm(y, p[f"{post}/scale"], eps)
    if not moe:
        return y + _mlp(x, p, "mlp", model.activation)
    bias = p[f"{model.moe_module}/gate/bias"] if model.routing == "sigmoid_bias" else None
    y = y + routed_experts(x, p, model.moe_module, model, bias=bias)
    if model.num_shared_experts:  # the MoE module's sibling `shared_experts` (deepseek's, llama4's)
        y = y + _mlp(x, p, model.moe_module.rsplit("/", 1)[0] + "/shared_experts", model.activation)
    return y


_layer_jit = jax.jit(family_layer, static_argnums=(3, 4, 5))


def family_forward(
    params: Mapping[str, np.ndarray],
    spec: ModelSpec | Model,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's decoder for `spec.family` on `tokens`.

    `params` are MaxText paths without `params/params/`, scanned or unscanned,
    plus deepseek's routing bias under its `nnx_aux/model/...` name, e.g. from
    :func:`maxckpt.reference.reading.read_maxtext_params`.
    """
    model = Model.of(spec)
    tokens = jnp.asarray(np.asarray(tokens, np.int32))
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    positions = jnp.asarray(positions)
    refs = layer_groups(model.family, params)
    if len(refs) != model.num_layers:
        raise ShapeMismatchError(
            f"the parameters hold {len(refs)} {model.spec.family} decoder layers, "
            f"the ModelSpec says {model.num_layers}"
        )
    embedding = jnp.asarray(params["token_embedder/embedding"], jnp.float32)
    y = embedding[tokens]
    layer_types = model.layer_types
    for ref in refs:
        layer = {n: jnp.asarray(a, jnp.float32) for n, a in ref.params(params).items()}
        moe = ref.moe if model.scan == "dense_moe" else is_moe_layer(model.spec, ref.index)
        if model.routing == "sigmoid_bias" and moe and ROUTING_BIAS not in layer:
            raise TensorNotFoundError(
                f"{model.spec.family} MoE layer {ref.index} has no routing bias "
                f"(nnx_aux/model/{ref.prefix}{ROUTING_BIAS}): "
                "read the checkpoint with maxckpt.reference.read_maxtext_params, which keeps nnx_aux, "
                "or add the bias (HF e_score_correction_bias) under that name"
            )
        try:
            kind = cycle_layer_type(model, ref.index) if model.scan == "cycle" else layer_types[ref.index]
            y = _layer_jit(y, layer, positions, model, kind, moe)
        except KeyError as err:
            raise UnsupportedModelError(
                f"the parameters do not look like a {model.spec.family} model in MaxText's layout "
                f"(no {err.args[0]!r} in a layer); check the family name"
            ) from err
    y = rms_norm(y, jnp.asarray(params["decoder/decoder_norm/scale"], jnp.float32), model.rms_norm_eps)
    return output_logits(y, params, embedding, model, attend_in_bf16=attend_in_bf16)


__all__ = ["ROUTING_BIAS", "family_forward", "family_layer"]
