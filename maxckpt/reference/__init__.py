"""A small JAX forward pass of MaxText's decoders, for checking conversions.

It takes MaxText-layout parameters and the one model record, a ModelSpec
(:mod:`maxckpt.layouts.base`), with its family record from the registry
(:mod:`maxckpt.families`). :func:`reference_logits` picks the forward:
:func:`forward` for the Llama family (llama2/3/3.1, mistral, qwen3),
:func:`family_forward` for the MoE, MLA and Gemma families (mixtral, qwen3-moe,
gemma2, gemma3, gpt-oss, deepseek3). Both reproduce MaxText's own logits on the
fixtures in shared/fixtures (tests/test_families/test_fixtures_logits.py,
tests/test_reference/test_reference_families.py) and materialise the whole model: meant for
checking, not for serving. The reference reads no checkpoint format itself:
:func:`read_maxtext_params` takes a path or anything with `tensors()` and
`read(name)` (:class:`ParamSource`); mapping another format to MaxText's
layout is the conversion side's job (`maxckpt.conversion.verify.maxtext_params`).
"""

from maxckpt.reference.families_forward import family_forward
from maxckpt.reference.forward import decoder_layer, forward, rms_norm, rope_timescales
from maxckpt.reference.logits import reference_logits, runs_llama_forward
from maxckpt.reference.model import Model
from maxckpt.reference.reading import ParamSource, read_maxtext_params

__all__ = [
    "Model",
    "ParamSource",
    "decoder_layer",
    "family_forward",
    "forward",
    "read_maxtext_params",
    "reference_logits",
    "rms_norm",
    "rope_timescales",
    "runs_llama_forward",
]
