"""One entry point for MaxText's logits, whichever decoder family a ModelSpec describes.

`verify --logits` and other callers hold MaxText-layout parameters and the
checkpoint's ModelSpec; this picks the forward by the spec's family record:
:func:`forward` for the plain dense decoders stacked as one run of layers (the
Llama family: llama2/3/3.1, mistral, qwen3), :func:`family_forward` for the MoE,
MLA and Gemma families (mixtral, qwen3-moe, gemma2, gemma3, gpt-oss, deepseek3).

>>> with open_checkpoint("run/checkpoints", model="gpt-oss-20b") as ckpt:   # doctest: +SKIP
...     logits = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens)
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from maxckpt.layouts.base import ModelSpec
from maxckpt.reference.families_forward import family_forward
from maxckpt.reference.forward import forward
from maxckpt.reference.model import Model


def runs_llama_forward(spec: ModelSpec | Model) -> bool:
    """Whether `spec`'s family is a plain dense decoder in one layer stack, which :func:`forward` computes
    (a family with q/k/v biases, qwen2.5, takes :func:`family_forward`'s attention)."""
    model = Model.of(spec)
    biased = model.qkv_bias or bool(model.family.settings.get("qkv_bias"))
    settings = model.family.settings  # gemma (v1): GeGLU and a scaled embedding, in the spec or the record
    gemma = (model.activation != "silu" or model.maxtext_embedding_scaled
             or settings.get("activation", "silu") != "silu" or bool(settings.get("maxtext_embedding_scaled")))
    return model.scan == "layers" and model.moe_module is None and not model.mla and not biased and not gemma


def reference_logits(
    params: Mapping[str, np.ndarray],
    spec: ModelSpec,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    positions: np.ndarray | None = None,
    *,
    attend_in_bf16: bool = False,
) -> np.ndarray:
    """Logits [batch, seq, vocab] (float32) of MaxText's decoder for `spec` on `tokens`.

    `params` are MaxText paths without `params/params/` (scanned or unscanned),
    plus non-RNG `nnx_aux` leaves (deepseek's routing bias), as
    :func:`maxckpt.reference.read_maxtext_params` returns them.
    `attend_in_bf16=True` casts a tied embedding to bfloat16 for the logits, as MaxText does.
    """
    model = Model.of(spec)
    if model.scan == "hybrid":  # Gated DeltaNet hybrids (qwen3-next)
        from maxckpt.reference.hybrid import hybrid_forward

        return hybrid_forward(params, spec, tokens, positions, attend_in_bf16=attend_in_bf16)
    run = forward if runs_llama_forward(model) else family_forward
    return run(params, spec, tokens, positions, attend_in_bf16=attend_in_bf16)


__all__ = ["reference_logits", "runs_llama_forward"]
