"""A small JAX forward pass of MaxText's decoders, for checking conversions.

`forward` covers the Llama family (llama2/3/3.1, mistral, qwen3) with a
conversion-side ModelSpec; `family_forward` covers the MoE, MLA and Gemma
families (mixtral, qwen3-moe, gemma2, gemma3, gpt-oss, deepseek3) with an
:class:`ArchConfig`. Both reproduce MaxText's own logits on the fixtures in
shared/fixtures (tests/test_fixtures_logits.py, tests/test_reference_families.py)
and materialise the whole model: meant for checking, not for serving.
`reference_logits(params, family, tokens, ...)` picks the right one.
"""

from maxckpt.reference.arch import ArchConfig, family_kind, infer_arch
from maxckpt.reference.families_forward import family_forward
from maxckpt.reference.forward import decoder_layer, forward, maxtext_params, rms_norm, rope_timescales
from maxckpt.reference.logits import arch_overrides, has_family_forward, reference_logits
from maxckpt.reference.reading import read_maxtext_params

__all__ = [
    "ArchConfig",
    "arch_overrides",
    "decoder_layer",
    "family_forward",
    "family_kind",
    "forward",
    "has_family_forward",
    "infer_arch",
    "maxtext_params",
    "read_maxtext_params",
    "reference_logits",
    "rms_norm",
    "rope_timescales",
]
