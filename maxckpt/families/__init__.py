"""Model families as data: one module per family, each defining ``FAMILY``, a :class:`Family` record.

Dimensions (layers, widths, heads, vocab, tied output, q/k norms) are read from tensor shapes. What
shapes cannot tell - rotary theta and scaling, norm epsilon, token ids, and above all *how MaxText orders
the rotary features and whether it folded 1/sqrt(head_dim) into the query kernel* - is a property of the
family, written down once in its module and settled against MaxText's own forward pass
(tests/test_families/test_fixtures_logits.py):

| family   | MaxText rotary | query kernel carries 1/sqrt(D) | q/k norm |
|----------|----------------|--------------------------------|----------|
| llama2   | half           | yes                            | no       |
| llama3   | half           | yes                            | no       |
| llama3.1 | interleaved    | yes                            | no       |
| mistral  | half           | yes                            | no       |
| qwen3    | half           | no (scaled at runtime)         | yes      |

The MoE, MLA and Gemma families (settled against MaxText's logits in tests/test_families/test_fixtures_families.py)
add routing, MLA, softcaps, sliding windows, per-layer-type rope, the Gemma norm offset and embedding scale:

| family     | MaxText layer stacks           | MLP              | attention          |
|------------|--------------------------------|------------------|--------------------|
| mixtral    | layers                         | MoE, softmax top-k | MHA, folded scale |
| qwen3-moe  | layers                         | MoE, softmax top-k | MHA + q/k norm    |
| deepseek3  | dense_layers + moe_layers      | MoE + shared, sigmoid + bias | MLA, YaRN |
| gpt-oss    | blocks of 2 (sliding, full)    | MoE with biases, clamped SwiGLU | MHA + biases + sinks, YaRN |
| gemma2     | pairs in one layer (_local/_global) | dense GeGLU | MHA, softcaps, folded scale |
| gemma3     | blocks of 6 + remainder        | dense GeGLU      | MHA + q/k norm, two rope thetas |
| gemma      | layers                         | dense GeGLU      | MHA/MQA, folded scale, (1 + w) norms |
| olmo3      | blocks of 4 (3 sliding, 1 full) | dense SwiGLU, post-norms | MHA + q/k norm over all heads, YaRN |

Adding a family is adding a module here (``llama3_1.py`` is a dense example): the registry
(:mod:`maxckpt.families.registry`) finds it, and the layouts, the reference forward (:mod:`maxckpt.reference`)
and the `--model` help (:func:`model_help`, :func:`impossible_pairs_text`) all read it.

>>> FAMILIES["llama3.1"].maxtext_rotary, resolve_model("llama3.1-8b").name
('interleaved', 'llama3.1')
"""

from __future__ import annotations

from maxckpt.families.base import LLAMA3_ROPE_SCALING, Family
from maxckpt.families.registry import (
    FAMILIES,
    MAXTEXT_MODELS,
    bridge_gap,
    discover,
    family_table,
    impossible_pairs_text,
    known_models,
    model_help,
    model_settings,
    require_bridge,
    resolve_model,
)

__all__ = [
    "FAMILIES",
    "LLAMA3_ROPE_SCALING",
    "MAXTEXT_MODELS",
    "Family",
    "bridge_gap",
    "discover",
    "family_table",
    "impossible_pairs_text",
    "known_models",
    "model_help",
    "model_settings",
    "require_bridge",
    "resolve_model",
]

discover()
