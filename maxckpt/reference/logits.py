"""One entry point for MaxText's logits, whichever decoder family a checkpoint holds.

`verify --logits` and other callers know a family name and have MaxText-layout
parameters; this picks the forward: :func:`family_forward` for the MoE, MLA
and Gemma families (mixtral, qwen3-moe, gemma2, gemma3, gpt-oss, deepseek3),
:func:`forward` with the conversion-side ModelSpec for the Llama family.

>>> logits = reference_logits(read_maxtext_params(path), "gpt-oss-20b", tokens,   # doctest: +SKIP
...                           num_experts_per_tok=4)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from maxckpt.errors import UnsupportedModelError
from maxckpt.reference.arch import ArchConfig, family_kind, infer_arch
from maxckpt.reference.families_forward import family_forward
from maxckpt.reference.forward import forward


def has_family_forward(family: str) -> bool:
    """Whether `family` (a family or MaxText model name) runs through :func:`family_forward`."""
    try:
        family_kind(family)
    except UnsupportedModelError:
        return False
    return True


# ModelSpec field (conversion side, what --set and config.json state) -> ArchConfig field.
_SPEC_TO_ARCH = {
    "num_experts_per_tok": "num_experts_per_tok",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "sliding_window": "sliding_window",
    "local_rope_theta": "rope_local_base_freq",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "attn_logit_softcap": "attn_logit_softcapping",
    "final_logit_softcap": "final_logit_softcapping",
    "routed_scaling_factor": "routed_scaling_factor",
    "norm_topk_prob": "norm_topk_prob",
    "rope_scaling": "rope_scaling",
    "n_group": "n_group",
    "topk_group": "topk_group",
}


def arch_overrides(spec: Any) -> dict[str, Any]:
    """ArchConfig fields a conversion-side ModelSpec states, for :func:`infer_arch`.

    The shapes give the dims; these are what no shape shows (top-k, rope,
    softcaps, windows), taken from the spec so that `verify --logits` runs the
    model the checkpoint's own config (or the user's `--set`) describes rather
    than the family preset. Unset (None, 0) values keep the preset's.
    """
    out: dict[str, Any] = {}
    for spec_field, arch_field in _SPEC_TO_ARCH.items():
        value = getattr(spec, spec_field, None)
        if value is None or (spec_field == "num_experts_per_tok" and not value):
            continue
        out[arch_field] = dict(value) if spec_field == "rope_scaling" else value
    scaling = out.get("rope_scaling")
    if scaling and "mscale_all_dim" in scaling:
        out["mscale_all_dim"] = float(scaling["mscale_all_dim"])
    return out


def reference_logits(
    params: Mapping[str, np.ndarray],
    family: str,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    *,
    spec: Any = None,
    arch: ArchConfig | None = None,
    attend_in_bf16: bool = False,
    **arch_fields: Any,
) -> np.ndarray:
    """Logits [batch, seq, vocab] of MaxText's decoder for `family` on `tokens`.

    For the MoE/MLA/Gemma families the ArchConfig is `arch` when given, else
    :func:`infer_arch` of the params with `arch_fields` (e.g.
    `num_experts_per_tok`) as overrides. For the Llama family `spec` (the
    conversion-side ModelSpec) is required and `arch_fields` must be empty.
    """
    if has_family_forward(family):
        arch = arch or infer_arch(family, params, **arch_fields)
        return family_forward(params, arch, tokens, attend_in_bf16=attend_in_bf16)
    if spec is None or arch_fields or arch is not None:
        raise UnsupportedModelError(
            f"{family!r} is a Llama-family model: its reference forward takes the conversion-side ModelSpec "
            "(spec=...), not ArchConfig fields"
        )
    return forward(params, spec, tokens, attend_in_bf16=attend_in_bf16)


__all__ = ["arch_overrides", "has_family_forward", "reference_logits"]
