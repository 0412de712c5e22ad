"""Model families as data: what tensor shapes cannot tell about a model.

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

The MoE, MLA and Gemma families (settled against MaxText's logits in
tests/test_fixtures_families.py) add routing, MLA, softcaps, sliding windows,
per-layer-type rope, the Gemma norm offset and embedding scale:

| family     | MaxText layer stacks           | MLP              | attention          |
|------------|--------------------------------|------------------|--------------------|
| mixtral    | layers                         | MoE, softmax top-k | MHA, folded scale |
| qwen3-moe  | layers                         | MoE, softmax top-k | MHA + q/k norm    |
| deepseek3  | dense_layers + moe_layers      | MoE + shared, sigmoid + bias | MLA, YaRN |
| gpt-oss    | blocks of 2 (sliding, full)    | MoE with biases, clamped SwiGLU | MHA + biases + sinks, YaRN |
| gemma2     | pairs in one layer (_local/_global) | dense GeGLU | MHA, softcaps, folded scale |
| gemma3     | blocks of 6 + remainder        | dense GeGLU      | MHA + q/k norm, two rope thetas |

Adding a family is adding a :class:`Family` entry below (plus, at most, one
MaxText layer-stack style or HF expert naming in the layouts). The layouts, the
reference forward (:mod:`maxckpt.reference`) and the `--model` help
(:func:`model_help`, :func:`impossible_pairs_text`) all read this one registry.

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


DEEPSEEK_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "truncate": True,
}
GPT_OSS_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}
# Which formats can hold each family (see docs/conversion.md, "Which pairs are possible").
MOE_BRIDGES = ("maxtext", "hf", "torch")
DENSE_ONLY_HF_BRIDGES = ("maxtext", "hf", "torch")

# Why a family cannot go to or from a format: (format, family) -> reason. Shown by `convert` and `--help`.
BRIDGE_GAPS: dict[tuple[str, str], str] = {
    **{("megatron", f): "Megatron-Core's GPT model has no logit softcapping, Gemma sandwich norms or (1 + w) norms"
       for f in ("gemma2", "gemma3")},
    **{("torchtitan", f): "TorchTitan 0.3.0 ships no such model" for f in ("mixtral", "gemma2", "gemma3")},
}


def bridge_gap(fmt: str, family: str) -> str | None:
    """Why `family` cannot be converted to or from format `fmt`, or None when it can."""
    if fmt in FAMILIES[family].bridges:
        return None
    return BRIDGE_GAPS.get((fmt, family), f"maxckpt has no {fmt} mapping for {family}")


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
    # config.json keys whose value is the number of layers (qwen3's max_window_layers).
    hf_num_layers_keys: tuple[str, ...] = ()
    # config.json lists every layer's type (sliding_attention / full_attention).
    hf_layer_types: bool = False
    # ---- how MaxText lays out the layers (see maxtext.py: layer_stacks)
    # "layers": one stack; "pairs": one MaxText layer holds a (local, global) pair (gemma2);
    # "blocks": scanned in blocks of sliding_window_pattern layers plus a remainder (gemma3, gpt-oss);
    # "dense_moe": dense_layers then moe_layers (deepseek3).
    maxtext_scan: Literal["layers", "pairs", "blocks", "dense_moe"] = "layers"
    maxtext_attention: str = "self_attention"  # attention module name in a MaxText layer
    maxtext_moe: str | None = None  # MoE module path in a MaxText layer (None: dense MLP)
    attention: Literal["mha", "mla"] = "mha"
    # HF names of the routed experts: "mixtral" (block_sparse_moe.experts.{e}.w1/w3/w2),
    # "per_expert" (mlp.experts.{e}.gate/up/down_proj), "fused_interleaved" (gpt-oss gate_up_proj [E, emb, 2F]).
    hf_experts: Literal["mixtral", "per_expert", "fused_interleaved"] | None = None
    # config.json: the key holding the routed-expert count, and what `intermediate_size` means:
    # "mlp" (the dense MLP width), "expert" (one expert's width: mixtral, gpt-oss) or "unused" (qwen3-moe,
    # all of whose layers are MoE: its dense width is never used).
    hf_num_experts_key: str | None = None
    hf_intermediate_size: Literal["mlp", "expert", "unused"] = "mlp"
    # TorchTitan's rotary feature order for this family ("half": HF's, no q/k row permutation).
    torchtitan_rotary: Literal["interleaved", "half"] = "interleaved"
    # Formats whose model code expresses this family (maxckpt converts to and from these).
    bridges: tuple[str, ...] = ("maxtext", "hf", "torch", "megatron", "torchtitan")
    # How Megatron-Core keys this family's layers in `torch_dist`: "stacked" on a leading [L] axis
    # (homogeneous layers), or "per_layer" (`decoder.layers.{i}.…`): what core 0.16 saves once
    # `moe_layer_freq` is a list, as it is for DeepSeek's dense leading layers.
    megatron_layers: Literal["stacked", "per_layer"] = "stacked"
    # ModelSpec defaults for this family (routing, softcaps, windows, norm offset, ...): field -> value.
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Per MaxText model name, settings that differ from the family's (e.g. top-k).
    model_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


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
            hf_num_layers_keys=("max_window_layers",),
            hf_layer_types=True,
            torchtitan_rotary="half",
        ),
        Family(
            name="mixtral",
            hf_model_type="mixtral",
            hf_architecture="MixtralForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=32768,
            bos_token_id=1,
            eos_token_id=2,
            maxtext_models=("mixtral-8x7b", "mixtral-8x22b"),
            hf_config_extra={"sliding_window": None, "router_jitter_noise": 0.0, "router_aux_loss_coef": 0.02,
                             "output_router_logits": False},
            maxtext_moe="MoeBlock_0",
            hf_experts="mixtral",
            bridges=MOE_BRIDGES + ("megatron",),
            settings={"routing": "softmax_topk", "num_experts_per_tok": 2, "norm_topk_prob": True},
            model_settings={"mixtral-8x22b": {"max_position_embeddings": 65536}},
            hf_num_experts_key="num_local_experts",
            hf_intermediate_size="expert",
        ),
        Family(
            name="qwen3-moe",
            hf_model_type="qwen3_moe",
            hf_architecture="Qwen3MoeForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=False,
            qk_norm=True,
            rope_theta=10_000_000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=262144,
            bos_token_id=151643,
            eos_token_id=151645,
            maxtext_models=("qwen3-30b-a3b", "qwen3-235b-a22b"),
            hf_config_extra={"attention_bias": False, "sliding_window": None, "use_sliding_window": False,
                             "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
                             "output_router_logits": False},
            hf_num_layers_keys=("max_window_layers",),
            maxtext_moe="moe_block",
            hf_experts="per_expert",
            bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
            settings={"routing": "softmax_topk", "num_experts_per_tok": 8, "norm_topk_prob": True},
            hf_num_experts_key="num_experts",
            hf_intermediate_size="unused",
            torchtitan_rotary="half",
        ),
        Family(
            name="deepseek3",
            hf_model_type="deepseek_v3",
            hf_architecture="DeepseekV3ForCausalLM",
            maxtext_rotary="half",  # MLA's rope pairs are interleaved on both sides (HF rope_interleave): no reordering
            maxtext_query_scale=False,
            qk_norm=False,
            rope_theta=10_000.0,
            rope_scaling=DEEPSEEK_YARN,
            rms_norm_eps=1e-6,
            max_position_embeddings=163840,
            bos_token_id=0,
            eos_token_id=1,
            maxtext_models=("deepseek3-671b",),
            hf_config_extra={"attention_bias": False, "rope_interleave": True, "scoring_func": "sigmoid",
                             "topk_method": "noaux_tc", "moe_layer_freq": 1,
                             "ep_size": 1, "num_nextn_predict_layers": 0, "pretraining_tp": 1},
            maxtext_scan="dense_moe",
            maxtext_moe="DeepSeekMoeBlock_0/MoeBlock_0",
            attention="mla",
            hf_experts="per_expert",
            bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
            megatron_layers="per_layer",
            settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
                      "routed_scaling_factor": 2.5},
            hf_num_experts_key="n_routed_experts",
            torchtitan_rotary="half",
        ),
        Family(
            name="gpt-oss",
            hf_model_type="gpt_oss",
            hf_architecture="GptOssForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=False,
            qk_norm=False,
            rope_theta=150_000.0,
            rope_scaling=GPT_OSS_YARN,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            bos_token_id=None,
            eos_token_id=200002,
            maxtext_models=("gpt-oss-20b", "gpt-oss-120b"),
            hf_config_extra={"swiglu_limit": 7.0, "router_aux_loss_coef": 0.9, "output_router_logits": False,
                             "initial_context_length": 4096, "pad_token_id": 199999},
            hf_layer_types=True,
            maxtext_scan="blocks",
            maxtext_attention="GptOssAttention",
            maxtext_moe="GptOssMlp",
            hf_experts="fused_interleaved",
            bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
            settings={"routing": "softmax_topk", "num_experts_per_tok": 4, "norm_topk_prob": True,
                      "router_bias": True, "expert_bias": True, "attention_bias": True, "attention_sinks": True,
                      "sliding_window": 128, "sliding_window_pattern": 2, "activation": "swiglu_oai"},
            hf_num_experts_key="num_local_experts",
            hf_intermediate_size="expert",
            torchtitan_rotary="half",
        ),
        Family(
            name="gemma2",
            hf_model_type="gemma2",
            hf_architecture="Gemma2ForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=True,
            qk_norm=False,
            rope_theta=10_000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
            bos_token_id=2,
            eos_token_id=1,
            maxtext_models=("gemma2-2b", "gemma2-9b", "gemma2-27b"),
            hf_config_extra={"attention_bias": False, "pad_token_id": 0},
            hf_layer_types=True,
            maxtext_scan="pairs",
            bridges=DENSE_ONLY_HF_BRIDGES,
            settings={"attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "sliding_window": 4096,
                      "sliding_window_pattern": 2, "norm_offset": 1.0, "sandwich_norms": True,
                      "maxtext_embedding_scaled": True, "activation": "gelu_tanh"},
            # HF gemma-2-27b scales queries by (emb/heads)**-0.5 = 144**-0.5, not head_dim**-0.5.
            model_settings={"gemma2-27b": {"query_pre_attn_scalar": 144.0}},
        ),
        Family(
            name="gemma3",
            hf_model_type="gemma3_text",
            hf_architecture="Gemma3ForCausalLM",
            maxtext_rotary="half",
            maxtext_query_scale=False,
            qk_norm=True,
            rope_theta=1_000_000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            rms_norm_eps=1e-6,
            max_position_embeddings=131072,
            bos_token_id=2,
            eos_token_id=1,
            maxtext_models=("gemma3-4b", "gemma3-12b", "gemma3-27b"),
            hf_config_extra={"attention_bias": False, "pad_token_id": 0, "attn_logit_softcapping": None,
                             "final_logit_softcapping": None},
            hf_layer_types=True,
            maxtext_scan="blocks",
            bridges=DENSE_ONLY_HF_BRIDGES,
            settings={"sliding_window": 1024, "sliding_window_pattern": 6, "local_rope_theta": 10_000.0,
                      "norm_offset": 1.0, "sandwich_norms": True, "maxtext_embedding_scaled": True,
                      "activation": "gelu_tanh"},
            # MaxText's get_query_pre_attn_scalar and HF gemma-3-27b: queries scaled by (emb/heads)**-0.5
            # = 168**-0.5, not head_dim**-0.5.
            model_settings={"gemma3-27b": {"query_pre_attn_scalar": 168.0}},
        ),
    )
}

# MaxText model names -> family name (the names MaxText's `model_name` accepts), in registry order.
MAXTEXT_MODELS: dict[str, str] = {model: f.name for f in FAMILIES.values() for model in f.maxtext_models}


def known_models() -> list[str]:
    """Every name `--model` accepts: family names and MaxText model names."""
    return sorted(FAMILIES) + sorted(MAXTEXT_MODELS)


def model_help() -> str:
    """The `--model` help text, from the registry: every family and every MaxText model name.

    >>> "llama3.1-8b" in model_help() and "gpt-oss" in model_help()
    True
    """
    families = ", ".join(FAMILIES)
    models = ", ".join(MAXTEXT_MODELS)
    return (
        f"Model family ({families}) or MaxText model name ({models}). Decides what shapes cannot tell "
        "(rotary layout, routing top-k, softcaps, windows): pass it for MaxText sources."
    )


def impossible_pairs_text() -> str:
    """The "pairs that are not possible" paragraph of `convert --help`, from each family's bridges.

    One line per format some family cannot reach, naming those families and why;
    the heading names the formats every family converts between.

    >>> print(impossible_pairs_text().splitlines()[0])
    Pairs that are not possible (every family converts between maxtext, hf and torch):
    """
    formats = list(dict.fromkeys(fmt for f in FAMILIES.values() for fmt in f.bridges))
    everywhere = [fmt for fmt in formats if all(fmt in f.bridges for f in FAMILIES.values())]
    lines = [f"Pairs that are not possible (every family converts between {_listed(everywhere)}):"]
    for fmt in formats:
        reasons: dict[str, list[str]] = {}
        for family in FAMILIES.values():
            gap = bridge_gap(fmt, family.name)
            if gap is not None:
                reasons.setdefault(gap, []).append(family.name)
        for reason, names in reasons.items():
            lines.append(f"{fmt}: {', '.join(names)} ({reason}).")
    return "\n\n".join(lines)


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def model_settings(name: str | None) -> dict[str, Any]:
    """The ModelSpec settings a MaxText model name adds to its family's (e.g. gemma2-27b's query scalar)."""
    if not name:
        return {}
    key = name.strip().lower()
    if key in MAXTEXT_MODELS:
        return dict(FAMILIES[MAXTEXT_MODELS[key]].model_settings.get(key, {}))
    return {}


def resolve_model(name: str) -> Family:
    """The family for a family name (`llama3.1`) or a MaxText model name (`llama3.1-8b`)."""
    key = name.strip().lower()
    if key in FAMILIES:
        return FAMILIES[key]
    if key in MAXTEXT_MODELS:
        return FAMILIES[MAXTEXT_MODELS[key]]
    close = difflib.get_close_matches(key, known_models(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UnsupportedModelError(
        f"unknown model {name!r}.{hint} Supported families: {', '.join(sorted(FAMILIES))}; "
        f"MaxText model names: {', '.join(sorted(MAXTEXT_MODELS))}."
    )


def family_from_hf_config(config: Mapping[str, Any]) -> Family:
    """The family an HF config.json describes (llama splits by its rope settings)."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type == "gemma3":  # the multimodal wrapper: its text model is what maxckpt converts
        model_type = "gemma3_text"
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
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]  # per layer type (gemma3): global layers' rope is the model's
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


def hf_local_rope_theta(config: Mapping[str, Any]) -> float | None:
    """The sliding layers' rope theta when a config.json states one apart (gemma3), else None."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("sliding_attention"), Mapping):
        return float(params["sliding_attention"].get("rope_theta", 10_000.0))
    if config.get("rope_local_base_freq") is not None:  # transformers 4.x gemma3
        return float(config["rope_local_base_freq"])
    return None
