"""Model families as data: what tensor shapes cannot tell about a Llama-family model.

Dimensions (layers, widths, heads, vocab, tied output, q/k norms) are read
from tensor shapes. What shapes cannot tell - rotary theta and scaling, norm
epsilon, token ids, and above all *how MaxText orders the rotary features and
whether it folded 1/sqrt(head_dim) into the query kernel* - is a property of
the family, written down here once and settled against MaxText's own forward
pass (tests/test_fixtures_logits.py):

| family   | MaxText rotary | query kernel carries 1/sqrt(D) | q/k norm |
|----------|----------------|--------------------------------|----------|
| llama2   | half           | yes                            | no       |
| llama3   | half           | yes                            | no       |
| llama3.1 | interleaved    | yes                            | no       |
| mistral  | half           | yes                            | no       |
| qwen3    | half           | no (scaled at runtime)         | yes      |

Adding a family is adding a :class:`Family` entry below.

>>> resolve_model("llama3.1-8b").name
'llama3.1'
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from maxckpt.errors import UnsupportedModelError

LLAMA3_ROPE_SCALING: Mapping[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class Family:
    """One model family: MaxText's conventions and HF's config for it."""

    name: str
    hf_model_type: str
    hf_architecture: str
    maxtext_rotary: Literal["half", "interleaved"]
    # MaxText initialises the query kernel divided by sqrt(head_dim) instead of
    # scaling attention logits; HF scales logits, so the factor moves.
    maxtext_query_scale: bool
    qk_norm: bool
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    rope_scaling: Mapping[str, Any] | None = None
    maxtext_models: tuple[str, ...] = ()
    # Extra config.json keys transformers expects for this model type.
    hf_config_extra: Mapping[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="llama2",
            hf_model_type="llama",
            hf_architecture="LlamaForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=10_000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            bos_token_id=1,
            eos_token_id=2,
            maxtext_models=("llama2-7b", "llama2-13b", "llama2-70b"),
            hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
        ),
        Family(
            name="llama3",
            hf_model_type="llama",
            hf_architecture="LlamaForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=500_000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
            bos_token_id=128000,
            eos_token_id=128001,
            maxtext_models=("llama3-8b", "llama3-70b", "llama3-405b"),
            hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
        ),
        Family(
            name="llama3.1",
            hf_model_type="llama",
            hf_architecture="LlamaForCausalLM",
            maxtext_rotary="interleaved",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=500_000.0,
            rope_scaling=LLAMA3_ROPE_SCALING,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            bos_token_id=128000,
            eos_token_id=128001,
            maxtext_models=("llama3.1-8b", "llama3.1-70b", "llama3.1-405b"),
            hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
        ),
        Family(
            name="mistral",
            hf_model_type="mistral",
            hf_architecture="MistralForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=32768,
            bos_token_id=1,
            eos_token_id=2,
            maxtext_models=("mistral-7b",),
            hf_config_extra={"sliding_window": None},
        ),
        Family(
            name="qwen3",
            hf_model_type="qwen3",
            hf_architecture="Qwen3ForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=False,
            qk_norm=True,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=40960,
            bos_token_id=151643,
            eos_token_id=151645,
            maxtext_models=("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"),
            hf_config_extra={"attention_bias": False, "sliding_window": None, "use_sliding_window": False},
        ),
    )
}

# MaxText model names -> family (the names MaxText's `model_name` accepts).
PRESETS: dict[str, str] = {model: f.name for f in FAMILIES.values() for model in f.maxtext_models}


def known_models() -> list[str]:
    """Every name `--model` accepts: family names and MaxText model names."""
    return sorted(FAMILIES) + sorted(PRESETS)


def resolve_model(name: str) -> Family:
    """The family for a family name (`llama3.1`) or a MaxText model name (`llama3.1-8b`)."""
    key = name.strip().lower()
    if key in FAMILIES:
        return FAMILIES[key]
    if key in PRESETS:
        return FAMILIES[PRESETS[key]]
    close = difflib.get_close_matches(key, known_models(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UnsupportedModelError(
        f"unknown model {name!r}.{hint} Supported families: {', '.join(sorted(FAMILIES))}; "
        f"MaxText model names: {', '.join(sorted(PRESETS))}."
    )


def family_from_hf_config(config: Mapping[str, Any]) -> Family:
    """The family an HF config.json describes (llama splits by its rope settings)."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type == "llama":
        rope = hf_rope(config)
        if rope[1] and str(rope[1].get("rope_type", rope[1].get("type", ""))).lower() == "llama3":
            return FAMILIES["llama3.1"]
        return FAMILIES["llama3"] if rope[0] >= 500_000 else FAMILIES["llama2"]
    for family in FAMILIES.values():
        if family.hf_model_type == model_type:
            return family
    raise UnsupportedModelError(
        f"config.json has model_type {model_type!r}; maxckpt converts "
        f"{', '.join(sorted({f.hf_model_type for f in FAMILIES.values()}))} models."
    )


def hf_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope scaling or None) from either config.json form.

    transformers 5.x writes `rope_parameters: {rope_type, rope_theta, ...}`;
    4.x wrote a top-level `rope_theta` and `rope_scaling`.
    """
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        theta = float(params.get("rope_theta", config.get("rope_theta", 10_000.0)))
        kind = str(params.get("rope_type", params.get("type", "default")))
        scaling = None if kind == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, scaling
    theta = float(config.get("rope_theta", 10_000.0))
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and str(scaling.get("rope_type", scaling.get("type", "default"))) != "default":
        return theta, dict(scaling)
    return theta, None
