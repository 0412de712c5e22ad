"""Building the ModelSpec of a checkpoint: shapes first, then what shapes cannot tell.

Precedence, lowest to highest: the family's defaults, hints from files next
to the checkpoint (an HF config.json, `--hf-config`, a framework's saved
args), the tensor shapes, and explicit overrides (`--set key=value`). Shapes
and what a config file or override *states* about a dimension must agree;
when they do not, that is an error naming both values, never a silent pick.

>>> spec, notes = build_spec({"num_layers": 2, "emb_dim": 8, "num_heads": 2, "num_kv_heads": 1,
...                           "head_dim": 4, "mlp_dim": 16, "vocab_size": 32, "qk_norm": False,
...                           "tie_word_embeddings": False}, model="llama3.1-8b")
>>> spec.family, spec.maxtext_rotary, spec.rope_theta
('llama3.1', 'interleaved', 500000.0)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable, Mapping

from maxckpt.errors import (
    ConfigError,
    ConversionError,
    CorruptCheckpointError,
    ShapeMismatchError,
    UnsupportedModelError,
)
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES, Family, model_settings, resolve_model
from maxckpt.families.registry import same_modules

DIM_FIELDS = ("num_layers", "emb_dim", "num_heads", "num_kv_heads", "head_dim", "mlp_dim", "vocab_size")
SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec))
# Products layouts can read off shapes when the factors are unknown (Megatron's
# fused QKV, TorchTitan's wq/wk): query features H*D and key/value features G*D.
Q_FEATURES = "_q_features"
KV_FEATURES = "_kv_features"
HEAD_FIELDS = ("num_heads", "num_kv_heads", "head_dim")
# The family a layout reads off tensor names alone (dims key); structural families are told apart by names.
TREE_FAMILY = "_family"


def structural(family: Family) -> bool:
    """A family whose tensor names alone say it (MoE, MLA and Gemma trees: experts or layers of their own)."""
    return family.maxtext_moe is not None or family.maxtext_scan != "layers"


def family_defaults(family: Family, model: str | None = None) -> dict[str, Any]:
    """The ModelSpec values a family (and, when given, a MaxText model name of it) sets."""
    return {
        **dict(family.settings),
        "qk_norm": family.qk_norm,
        "rope_theta": family.rope_theta,
        "rope_scaling": dict(family.rope_scaling) if family.rope_scaling else None,
        "rms_norm_eps": family.rms_norm_eps,
        "max_position_embeddings": family.max_position_embeddings,
        "maxtext_rotary": family.maxtext_rotary,
        "maxtext_query_scale": family.maxtext_query_scale,
        "bos_token_id": family.bos_token_id,
        "eos_token_id": family.eos_token_id,
        # last: a model's own values beat its family's (qwen3-4b-thinking-2507's rope theta, mixtral-8x22b's context)
        **model_settings(model),
    }


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _token_id(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _token_ids(v: Any) -> bool:
    return _token_id(v) or (isinstance(v, list) and 0 < len(v) <= 64 and all(_token_id(x) and x is not None for x in v))


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _rope_value(x: Any) -> bool:
    if isinstance(x, list):
        return len(x) <= 4096 and all(_number(e) for e in x)
    return x is None or isinstance(x, bool) or _number(x) or (isinstance(x, str) and len(x) <= 64)


def _rope_scaling(v: Any) -> bool:
    # transformers' rope parameters: names with numbers (factor, ...), short strings (rope_type), number lists.
    return v is None or (
        isinstance(v, dict) and len(v) <= 32 and all(isinstance(k, str) and _rope_value(x) for k, x in v.items())
    )


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


# The rope scalings maxckpt's layouts and reference forward pass compute ("default": none).
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_scaling_problem(scaling: Mapping[str, Any]) -> str | None:
    """What makes rope parameters unusable (None: nothing), by transformers' rules for each rope_type.

    Why here: a factor of 0, a non-positive original context or crossed llama3 / YaRN bounds would be
    copied into every output config and change (or break: division by zero) the rotary frequencies.
    """
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is None:
        return f"it states no rope_type (one of {', '.join(ROPE_TYPES)})"
    if kind not in ROPE_TYPES:
        return f"rope_type {kind!r} is not one maxckpt converts ({', '.join(ROPE_TYPES)})"
    if kind == "default":
        return None
    factor = scaling.get("factor")
    if not (_number(factor) and factor >= 1):
        return f"{kind} scaling needs factor >= 1 (the context extension), got factor={_shown(factor)}"
    original = scaling.get("original_max_position_embeddings")
    if original is not None and not (_positive(original) and float(original).is_integer()):
        return f"original_max_position_embeddings must be a positive whole number, got {_shown(original)}"
    if kind == "llama3":
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        if not (_positive(low) and _positive(high) and low < high):
            return (f"llama3 scaling needs 0 < low_freq_factor < high_freq_factor, "
                    f"got low_freq_factor={_shown(low)}, high_freq_factor={_shown(high)}")
    if kind == "yarn":
        fast, slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)
        if not (_positive(fast) and _positive(slow) and fast >= slow):
            return (f"yarn scaling needs beta_fast >= beta_slow > 0, "
                    f"got beta_fast={_shown(fast)}, beta_slow={_shown(slow)}")
        for key in ("mscale", "mscale_all_dim"):
            if scaling.get(key) is not None and not (_number(scaling[key]) and scaling[key] >= 0):
                return f"{key} must be a number >= 0, got {_shown(scaling[key])}"
        if scaling.get("attention_factor") is not None and not _positive(scaling["attention_factor"]):
            return f"attention_factor must be a positive number, got {_shown(scaling['attention_factor'])}"
        if "truncate" in scaling and not isinstance(scaling["truncate"], bool):
            return f"truncate must be true or false, got {_shown(scaling['truncate'])}"
    return None


def check_rope_scaling(
    values: Mapping[str, Any], hints: Mapping[str, Any], overrides: Mapping[str, Any], source: str
) -> None:
    """Refuse unusable rope parameters from `--set` or a config file (a family's own are valid: tested)."""
    scaling = values.get("rope_scaling")
    problem = rope_scaling_problem(scaling) if scaling else None
    if problem is None:
        return
    if "rope_scaling" in overrides:
        raise ConfigError(
            f"--set rope_scaling={_shown(scaling)}: {problem}; pass valid rope parameters (or null for none)"
        )
    if "rope_scaling" in hints:
        raise CorruptCheckpointError(
            f"{source} states rope_scaling={_shown(scaling)}: {problem}; fix the file, or pass --set rope_scaling=JSON"
        )


# What a `--set` value must be, per ModelSpec field (fields not listed take any JSON value).
_SETTING_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{f: ("a positive whole number", _whole) for f in (*DIM_FIELDS, "max_position_embeddings")},
    "rope_theta": ("a positive number", _positive),
    "rms_norm_eps": ("a positive number", _positive),
    # 0 experts is a dense model (ModelSpec's default, what maxckpt_model.json records for one); a MoE's
    # top-k is checked against its expert count once the family is known (_check_experts).
    **{
        f: ("a whole number >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        for f in (
            "num_experts",
            "num_experts_per_tok",
            "moe_mlp_dim",
            "num_shared_experts",
            "first_dense_layers",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "sliding_window_pattern",
            "indexer_n_heads",
            "indexer_head_dim",
            "indexer_topk",
        )
    },
    **{
        f: ("a positive number or null", lambda v: v is None or _positive(v))
        for f in (
            "query_pre_attn_scalar",
            "attn_logit_softcap",
            "final_logit_softcap",
            "sliding_window",
            "local_rope_theta",
        )
    },
    "routed_scaling_factor": ("a positive number", _positive),
    **{f: ("a positive whole number", _whole) for f in ("n_group", "topk_group")},
    "norm_offset": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "routing": ("softmax_topk, sigmoid_bias, sigmoid_input, softmax_greedy or null",
                lambda v: v in (None, "softmax_topk", "sigmoid_bias", "sigmoid_input", "softmax_greedy")),
    "activation": ("silu, gelu_tanh or swiglu_oai", lambda v: v in ("silu", "gelu_tanh", "swiglu_oai")),
    **{
        f: ("true or false", _flag)
        for f in (
            "tie_word_embeddings",
            "qk_norm",
            "maxtext_query_scale",
            "norm_topk_prob",
            "router_bias",
            "expert_bias",
            "attention_bias",
            "qkv_bias",
            "attention_sinks",
            "sandwich_norms",
            "maxtext_embedding_scaled",
        )
    },
    "maxtext_rotary": ("half or interleaved", lambda v: v in ("half", "interleaved")),
    # Gated DeltaNet hybrids (qwen3-next, qwen3.5)
    **{f: ("a whole number >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
       for f in ("full_attention_interval", "gdn_num_key_heads", "gdn_num_value_heads", "gdn_key_head_dim",
                 "gdn_value_head_dim", "gdn_conv_kernel_dim")},
    "partial_rotary_factor": ("a number in (0, 1]", lambda v: _positive(v) and v <= 1),
    **{f: ("true or false", _flag) for f in ("attention_output_gate", "norm_plus_one", "shared_expert_gate")},
    "mrope_section": ("a list of whole numbers, or null",
                      lambda v: v is None or (isinstance(v, (list, tuple)) and 0 < len(v) <= 8
                                              and all(_whole(x) for x in v))),
    "rope_scaling": ("a JSON object of rope parameters (numbers, short strings) or null", _rope_scaling),
    "bos_token_id": ("a token id (a whole number >= 0) or null", _token_id),
    "eos_token_id": ("a token id, a list of token ids, or null", _token_ids),
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_hint_values(hints: Mapping[str, Any], source: str) -> None:
    """Every model setting a config file states has the right kind, checked before anything is written."""
    for key, value in hints.items():
        kind = _SETTING_KINDS.get(key)
        if kind is not None and not kind[1](value):
            raise CorruptCheckpointError(
                f"{source} states {key}={_shown(value)}, but {key} must be {kind[0]}; "
                f"fix the file, or pass --set {key}=VALUE"
            )


# MaxText's names for model settings (its base.yml and model ymls) -> (ModelSpec field, value in ModelSpec's terms);
# where both use one name (num_experts_per_tok, routed_scaling_factor, norm_topk_prob) it needs no entry.
_OFF = lambda v: 1 if v == -1 else v  # noqa: E731 - MaxText's -1 means "off": one group, i.e. no group limit
MAXTEXT_SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "n_routing_groups": ("n_group", _OFF),
    "topk_routing_group": ("topk_group", _OFF),
    "sliding_window_size": ("sliding_window", lambda v: None if v == 0 else v),
    "rope_max_timescale": ("rope_theta", lambda v: v),
    "local_rope_max_timescale": ("local_rope_theta", lambda v: None if v in (0, -1) else v),
    "final_logits_soft_cap": ("final_logit_softcap", lambda v: None if v in (0, 0.0) else v),
    "attn_logits_soft_cap": ("attn_logit_softcap", lambda v: None if v in (0, 0.0) else v),
    "normalization_layer_epsilon": ("rms_norm_eps", lambda v: v),
    "max_target_length": ("max_position_embeddings", lambda v: v),
    "logits_via_embedding": ("tie_word_embeddings", lambda v: v),
    "shared_experts": ("num_shared_experts", lambda v: v),
    "first_num_dense_layers": ("first_dense_layers", lambda v: v),
}


def from_maxtext_names(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`--set` keys in MaxText's names (`n_routing_groups=8`, `sliding_window_size=4`) as ModelSpec fields.

    ModelSpec's own names pass through; a setting given under both names must agree.
    """
    out: dict[str, Any] = {}
    for key, value in settings.items():
        field, convert = MAXTEXT_SETTINGS.get(key, (key, None))
        value = convert(value) if convert is not None and key not in SPEC_FIELDS else value
        if field in out and out[field] != value:
            raise ConfigError(f"--set gives {field} twice with different values ({out[field]!r} and {key}={value!r})")
        out[field] = value
    return out


def check_override_keys(overrides: Mapping[str, Any]) -> None:
    """Unknown `--set` keys, and values of the wrong kind, are a ConfigError with a suggestion."""
    for key, value in overrides.items():
        if key not in SPEC_FIELDS:
            close = difflib.get_close_matches(key, [*SPEC_FIELDS, *MAXTEXT_SETTINGS], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown model setting {key!r}.{hint} Settable: {', '.join(SPEC_FIELDS)}; "
                f"or under MaxText's names: {', '.join(MAXTEXT_SETTINGS)}"
            )
        kind = _SETTING_KINDS.get(key)
        if kind is not None and not kind[1](value):
            raise ConfigError(f"--set {key}={_shown(value)}: {key} must be {kind[0]}")


def _conflicts(stated: Family, chosen: Family) -> bool:
    # Different HF model types, or rope scaling one family has and the other lacks,
    # change what the model computes; llama2 vs llama3 only differ in defaults.
    return stated.hf_model_type != chosen.hf_model_type or bool(stated.rope_scaling) != bool(chosen.rope_scaling)


def _same_tree(tree: Family, chosen: Family) -> bool:
    """Whether tensor names read as `tree` may be `chosen`'s: the same modules, the names showing no family's
    own markers (Family.tree_markers) and `chosen` needing none (kimi-k2's tree is deepseek3's; deepseek2-236b's
    too; deepseek3.2 needs its indexer)."""
    return same_modules(tree, chosen) and not tree.tree_markers and not chosen.tree_markers_required


def choose_family(dims: Mapping[str, Any], model: str | None, stated: str | None) -> tuple[Family, list[str]]:
    """The family from `--model`, else what a config states, else a guess (with a note saying so)."""
    notes: list[str] = []
    tree = dims.get(TREE_FAMILY)  # what the tensor names alone say (MoE, MLA and Gemma trees are unmistakable)
    if model:
        family = resolve_model(model)
        # unscanned, the Gated DeltaNet hybrids' MaxText trees are alike: --model tells them apart
        alike = tree and FAMILIES[tree].maxtext_scan == family.maxtext_scan == "hybrid" and not dims.get("_scanned")
        alike = alike or (tree and _same_tree(FAMILIES[tree], family))  # e.g. kimi-k2's tree is deepseek3's
        if tree and tree != family.name and (structural(FAMILIES[tree]) or structural(family)) and not alike:
            raise UnsupportedModelError(
                f"--model {model} is a {family.name} model but the checkpoint's tensors are those of a {tree} "
                f"model; drop --model or pass a {tree} model name."
            )
        if stated and _conflicts(FAMILIES[stated], family):
            raise UnsupportedModelError(
                f"--model {model} is a {family.name} model but the checkpoint's config describes a {stated} "
                f"model; drop --model or pass a {stated} model name."
            )
        return family, notes
    if stated:
        return FAMILIES[stated], notes
    if tree:
        return FAMILIES[tree], notes
    if dims.get("qk_norm"):
        notes.append("no --model given: the q/k norm tensors say qwen3; pass --model to choose otherwise.")
        return FAMILIES["qwen3"], notes
    biased = next((f for f in FAMILIES.values() if f.settings.get("qkv_bias")), None)
    if dims.get("qkv_bias") and biased is not None:
        notes.append(f"no --model given: q/k/v biases without an output bias say {biased.name}; "
                     "pass --model to choose otherwise.")
        return biased, notes
    notes.append(
        "no --model given: assuming llama2 (MaxText rotary 'half' layout, rope theta 10000). "
        "If this is a llama3.1 (interleaved rotary), llama3 or mistral model, pass --model: "
        "a wrong family converts without error but computes different logits."
    )
    return FAMILIES["llama2"], notes


def build_spec(
    dims: Mapping[str, Any],
    *,
    model: str | None = None,
    hints: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    hints_source: str = "config",
) -> tuple[ModelSpec, list[str]]:
    """Merge shape-derived `dims`, family defaults, `hints` and `overrides` into a ModelSpec.

    Returns the spec and notes for the user (e.g. that the family was guessed).
    """
    hints = dict(hints or {})
    overrides = from_maxtext_names(overrides or {})
    check_override_keys(overrides)
    check_hint_values({k: v for k, v in hints.items() if k not in overrides}, hints_source)
    stated = hints.pop("family", None)
    family, notes = choose_family(dims, overrides.pop("family", None) or model, stated)
    values: dict[str, Any] = family_defaults(family, overrides.get("family") or model)
    values.update({k: v for k, v in hints.items() if k in SPEC_FIELDS})
    for key, found in dims.items():
        if key == "tie_word_embeddings" and hints.get(key) is True and found is False:
            continue  # a tied model saved with a redundant lm_head copy: the config decides
        if key in hints and hints[key] != found:
            raise ShapeMismatchError(
                f"{hints_source} says {key}={hints[key]!r} but the tensor shapes say {found!r}; "
                "the config does not belong to these weights."
            )
        values[key] = found
    for key, value in overrides.items():
        if key in dims and dims[key] != value:
            raise ShapeMismatchError(f"--set {key}={value!r} contradicts the tensor shapes, which say {dims[key]!r}")
        values[key] = value
    if "qk_norm" in dims and family.qk_norm != bool(dims["qk_norm"]) and "qk_norm" not in overrides:
        has = "has" if dims["qk_norm"] else "has no"
        raise UnsupportedModelError(
            f"the checkpoint {has} q/k norm tensors, which a {family.name} model "
            f"{'lacks' if dims['qk_norm'] else 'needs'}; pass the right --model (qwen3 has q/k norms)."
        )
    _check_qkv_bias(dims, overrides, family)
    _complete_heads(values, dims, hints_source)
    _check_experts(values, family)
    check_rope_scaling(values, hints, overrides, hints_source)
    missing = [f for f in DIM_FIELDS if values.get(f) is None]
    if missing:
        if Q_FEATURES in dims and set(missing) <= set(HEAD_FIELDS):
            raise ConversionError(
                f"cannot tell {', '.join(missing)} from the tensor shapes (they give {dims[Q_FEATURES]} query "
                f"and {dims[KV_FEATURES]} key/value features); pass --set head_dim=D (the head counts follow), "
                "or an HF config.json with --hf-config"
            )
        raise ConversionError(
            f"cannot tell {', '.join(missing)} from the tensor shapes; pass an HF config.json with "
            f"--hf-config, or --set {missing[0]}=N"
        )
    values = {k: v for k, v in values.items() if k in SPEC_FIELDS and k != "family"}
    return ModelSpec(family=family.name, **values), notes


def _check_qkv_bias(dims: Mapping[str, Any], overrides: Mapping[str, Any], family: Family) -> None:
    """q/k/v biases without an output bias (qwen2.5's) need a family whose HF model has them: any other model
    type would load the tensors as unexpected keys and run without them."""
    if dims.get("qkv_bias") and not family.settings.get("qkv_bias") and "qkv_bias" not in overrides:
        biased = ", ".join(f.name for f in FAMILIES.values() if f.settings.get("qkv_bias")) or "none"
        raise UnsupportedModelError(
            f"the checkpoint has q/k/v biases (and no output bias), which a {family.name} model lacks; "
            f"pass the right --model (families with q/k/v biases: {biased})."
        )


def _check_experts(values: Mapping[str, Any], family: Family) -> None:
    """A MoE model's top-k must be between 1 and its expert count; a dense family has no experts.

    A MoE family over dense MLP tensors is refused too: with no experts the layouts would write that
    family's config over a dense MLP, which transformers loads with randomly initialised experts.
    """
    experts = values.get("num_experts") or 0
    if family.maxtext_moe is None and experts:
        raise UnsupportedModelError(
            f"the checkpoint has {experts} experts per layer but {family.name} is a dense family; "
            "pass the right --model"
        )
    if family.maxtext_moe is not None and not experts:
        dense = ", ".join(f.name for f in FAMILIES.values() if f.maxtext_moe is None)
        raise UnsupportedModelError(
            f"{family.name} is a mixture-of-experts family, but the checkpoint has no expert tensors "
            f"(num_experts=0: its MLP is dense); name its dense family with --model ({dense}), "
            f"or fix the config that names {family.name}"
        )
    if family.maxtext_moe is not None and experts:
        k = values.get("num_experts_per_tok") or 0
        if not 1 <= k <= experts:
            raise ConfigError(
                f"{family.name}: num_experts_per_tok={k} but the checkpoint has {experts} experts per layer; "
                "pass --set num_experts_per_tok=K (the top-k the model was trained with)"
            )
    _check_groups(values, family, experts)


def _check_groups(values: Mapping[str, Any], family: Family, experts: int) -> None:
    """Group-limited routing (DeepSeek's): the groups split the experts evenly, and the chosen groups hold
    at least top-k experts (as transformers and Megatron require)."""
    groups, chosen = values.get("n_group", 1), values.get("topk_group", 1)
    if groups == 1 and chosen == 1:
        return
    if values.get("routing") != "sigmoid_bias":
        raise ConfigError(
            f"{family.name}: n_group={groups}, topk_group={chosen} asks for group-limited routing, which only "
            "DeepSeek's sigmoid routing (deepseek3) has; drop n_group / topk_group (MaxText n_routing_groups / "
            "topk_routing_group)"
        )
    k = values.get("num_experts_per_tok") or 0
    if experts % groups or not 1 <= chosen <= groups or chosen * (experts // groups) < k:
        raise ConfigError(
            f"{family.name}: group-limited routing with n_group={groups}, topk_group={chosen} does not fit "
            f"{experts} experts and top-k {k}: n_group must divide the expert count, 1 <= topk_group <= n_group, "
            "and the chosen groups must hold at least top-k experts"
        )


def _complete_heads(values: dict[str, Any], dims: Mapping[str, Any], source: str) -> None:
    """Fill num_heads / num_kv_heads / head_dim from the feature counts shapes give, and check them.

    A fused QKV (Megatron) or separate wq/wk (TorchTitan) only tells H*D and
    G*D; one of the three factors, from a config or `--set`, decides the rest.
    """
    q, kv = dims.get(Q_FEATURES), dims.get(KV_FEATURES)
    if q is None or kv is None:
        return
    heads, groups, head_dim = (values.get(f) for f in HEAD_FIELDS)
    if head_dim is None:
        if heads:
            head_dim = q // heads if q % heads == 0 else None
        elif groups:
            head_dim = kv // groups if kv % groups == 0 else None
    if head_dim:
        if heads is None and q % head_dim == 0:
            heads = q // head_dim
        if groups is None and kv % head_dim == 0:
            groups = kv // head_dim
    if heads is None or groups is None or not head_dim:
        return
    if heads * head_dim != q or groups * head_dim != kv:
        raise ShapeMismatchError(
            f"the model settings ({source}, --set) say num_heads={heads}, num_kv_heads={groups}, head_dim={head_dim} "
            f"({heads * head_dim} query and {groups * head_dim} key/value features) but the tensor shapes "
            f"have {q} query and {kv} key/value features; the settings do not belong to these weights."
        )
    values.update(num_heads=heads, num_kv_heads=groups, head_dim=head_dim)
