"""Model families and the spec built from shapes, configs and flags."""

from __future__ import annotations

import re

import pytest

from maxckpt.conversion.spec import build_spec
from maxckpt.errors import ConfigError, ConversionError, ShapeMismatchError, UnsupportedModelError
from maxckpt.families import FAMILIES, MAXTEXT_MODELS, resolve_model

DIMS = {
    "num_layers": 2, "emb_dim": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
    "mlp_dim": 128, "vocab_size": 256, "tie_word_embeddings": False, "qk_norm": False,
}


def test_maxtext_model_names_resolve_to_families():
    assert resolve_model("llama3.1-8b").maxtext_rotary == "interleaved"
    assert resolve_model("llama3-8b").maxtext_rotary == "half"
    assert resolve_model("mistral-7b").rope_theta == 1_000_000
    assert resolve_model("QWEN3-0.6B").maxtext_query_scale is False
    assert all(MAXTEXT_MODELS[m] in FAMILIES for m in MAXTEXT_MODELS)


def test_unknown_model_suggests_the_closest_names():
    with pytest.raises(UnsupportedModelError, match=r"unknown model 'llama3.2-8b'\. Did you mean .*llama3.1-8b"):
        resolve_model("llama3.2-8b")


def test_family_defaults_fill_what_shapes_cannot_tell():
    spec, notes = build_spec(DIMS, model="llama3.1-8b")
    assert (spec.rope_theta, spec.rope_scaling["factor"], spec.max_position_embeddings) == (500_000.0, 8.0, 131072)
    assert (spec.bos_token_id, spec.eos_token_id) == (128000, 128001) and not notes


def test_without_a_model_the_guess_is_said_out_loud():
    spec, notes = build_spec(DIMS)
    assert spec.family == "llama2" and "no --model given: assuming llama2" in notes[0]
    spec, notes = build_spec({**DIMS, "qk_norm": True})
    assert spec.family == "qwen3" and "qwen3" in notes[0]


def test_wrong_family_for_the_tensors_is_an_error():
    with pytest.raises(UnsupportedModelError, match="has no q/k norm tensors, which a qwen3 model needs"):
        build_spec(DIMS, model="qwen3")
    with pytest.raises(UnsupportedModelError, match="has q/k norm tensors, which a llama2 model lacks"):
        build_spec({**DIMS, "qk_norm": True}, model="llama2")
    with pytest.raises(UnsupportedModelError, match="describes a llama3.1 model"):
        build_spec(DIMS, model="llama2", hints={"family": "llama3.1"})


def test_config_values_win_over_defaults_but_must_agree_with_shapes():
    spec, _ = build_spec(DIMS, hints={"family": "llama2", "rope_theta": 123.0, "num_heads": 4})
    assert spec.rope_theta == 123.0
    with pytest.raises(ShapeMismatchError, match="config says num_heads=8 but the tensor shapes say 4"):
        build_spec(DIMS, hints={"num_heads": 8})


def test_overrides_are_checked():
    spec, _ = build_spec(DIMS, model="llama2", overrides={"rms_norm_eps": 1e-6})
    assert spec.rms_norm_eps == 1e-6
    with pytest.raises(ConfigError, match="unknown model setting 'rope_thetta'. Did you mean 'rope_theta'"):
        build_spec(DIMS, overrides={"rope_thetta": 1.0})
    with pytest.raises(ShapeMismatchError, match="--set emb_dim=32 contradicts the tensor shapes"):
        build_spec(DIMS, overrides={"emb_dim": 32})


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"rope_theta": "fast"}, "--set rope_theta='fast': rope_theta must be a positive number"),
        ({"num_heads": "abc"}, "--set num_heads='abc': num_heads must be a positive whole number"),
        ({"head_dim": 2.5}, "--set head_dim=2.5: head_dim must be a positive whole number"),
        ({"tie_word_embeddings": "yes"}, "--set tie_word_embeddings='yes': tie_word_embeddings must be true or false"),
        ({"maxtext_rotary": "sideways"}, "--set maxtext_rotary='sideways': maxtext_rotary must be half or interleaved"),
    ],
)
def test_override_values_of_the_wrong_kind_are_config_errors(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_spec(DIMS, model="llama2", overrides=setting)


def test_missing_dimensions_say_how_to_supply_them():
    dims = {k: v for k, v in DIMS.items() if k not in ("num_heads", "num_kv_heads", "head_dim")}
    with pytest.raises(ConversionError, match="cannot tell num_heads, num_kv_heads, head_dim .* --hf-config"):
        build_spec(dims, model="llama2")
    spec, _ = build_spec(dims, model="llama2", overrides={"num_heads": 4, "num_kv_heads": 2, "head_dim": 16})
    assert spec.num_heads == 4


def test_moe_mla_and_gemma_presets_resolve_under_maxtexts_names():
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES, bridge_gap, model_settings, resolve_model

    names = {
        "mixtral-8x7b": "mixtral", "mixtral-8x22b": "mixtral", "qwen3-30b-a3b": "qwen3-moe",
        "qwen3-235b-a22b": "qwen3-moe", "deepseek3-671b": "deepseek3", "gpt-oss-20b": "gpt-oss",
        "gpt-oss-120b": "gpt-oss", "gemma2-2b": "gemma2", "gemma2-9b": "gemma2", "gemma2-27b": "gemma2",
        "gemma3-4b": "gemma3", "gemma3-12b": "gemma3", "gemma3-27b": "gemma3",
    }
    for model, family in names.items():
        assert resolve_model(model).name == family
    assert model_settings("gemma2-27b") == {"query_pre_attn_scalar": 144.0}
    assert model_settings("gemma3-27b") == {"query_pre_attn_scalar": 168.0} and not model_settings("gemma3-4b")
    assert family_defaults(FAMILIES["gemma2"], "gemma2-27b")["query_pre_attn_scalar"] == 144.0
    ds = family_defaults(FAMILIES["deepseek3"])
    assert (ds["routing"], ds["routed_scaling_factor"], ds["num_experts_per_tok"]) == ("sigmoid_bias", 2.5, 8)
    g3 = family_defaults(FAMILIES["gemma3"])
    assert (g3["norm_offset"], g3["sliding_window_pattern"], g3["local_rope_theta"], g3["rope_theta"]) == (1.0, 6, 1e4, 1e6)
    assert bridge_gap("hf", "gemma3") is None and bridge_gap("megatron", "mixtral") is None
    assert "no logit softcapping" in bridge_gap("megatron", "gemma2")
    assert "ships no such model" in bridge_gap("torchtitan", "mixtral")


def test_the_model_help_names_every_family_and_maxtext_model_name():
    from maxckpt.families import model_help

    text = model_help()
    for family in FAMILIES.values():
        assert re.search(rf"[(, ]{re.escape(family.name)}[,)]", text), family.name
        for model in family.maxtext_models:
            assert re.search(rf"[(, ]{re.escape(model)}[,)]", text), model
    assert "pass it for MaxText sources" in text


def test_the_impossible_pairs_text_follows_the_bridges():
    from maxckpt.families import bridge_gap, impossible_pairs_text

    text = impossible_pairs_text()
    assert text.startswith("Pairs that are not possible (every family converts between maxtext, hf and torch):")
    assert "megatron: gemma2, gemma3 (Megatron-Core's GPT model has no logit softcapping" in text
    no_model = ", ".join(f for f in FAMILIES if bridge_gap("torchtitan", f) == "TorchTitan 0.3.0 ships no such model")
    assert no_model.startswith("mixtral, gemma2, gemma3") and "qwen2.5" in no_model
    assert f"torchtitan: {no_model} (TorchTitan 0.3.0 ships no such model)." in text
    for fmt in ("maxtext", "hf", "torch", "megatron", "torchtitan"):
        for family in FAMILIES:
            # the whole name: qwen3 is not listed because qwen3-next is
            listed = re.search(rf"^{fmt}: [^(]*(?<![\w.-]){re.escape(family)}(?![\w.-])", text, re.MULTILINE)
            assert (listed is not None) == (bridge_gap(fmt, family) is not None), (fmt, family)


def test_a_params_only_deepseek_without_its_routing_bias_is_refused_with_the_reason(maxtext_fixtures):
    from maxckpt.conversion import open_checkpoint
    from maxckpt.errors import CorruptCheckpointError
    from maxckpt.formats.maxtext.layout import MaxTextLayout

    with open_checkpoint(
        maxtext_fixtures / "deepseek3_scan/checkpoints/5/items", model="deepseek3-671b", overrides={"num_experts_per_tok": 2}
    ) as ckpt:
        spec = ckpt.spec
        tensors = {n: t for n, t in ckpt.lazy_tensors().items() if not n.startswith("nnx_aux/")}
        with pytest.raises(CorruptCheckpointError, match="routing bias, which MaxText keeps in the training state"):
            MaxTextLayout().to_hf(tensors, spec)


MOE_FAMILIES = [name for name, f in FAMILIES.items() if f.maxtext_moe is not None]
DENSE_FAMILIES = [name for name, f in FAMILIES.items() if f.maxtext_moe is None]


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_a_moe_family_over_dense_tensors_is_refused(family):
    dims = {**DIMS, "qk_norm": FAMILIES[family].qk_norm}  # past the q/k norm check: only the experts are missing
    message = f"{family} is a mixture-of-experts family, but the checkpoint has no expert tensors"
    with pytest.raises(UnsupportedModelError, match=message):
        build_spec(dims, model=family)
    with pytest.raises(UnsupportedModelError, match="no expert tensors"):  # a config naming it, no --model
        build_spec(dims, hints={"family": family})


@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_a_dense_family_over_expert_tensors_is_refused(family):
    dims = {**DIMS, "qk_norm": FAMILIES[family].qk_norm, "num_experts": 4, "moe_mlp_dim": 32}
    with pytest.raises(UnsupportedModelError, match=f"4 experts per layer but {family} is a dense family"):
        build_spec(dims, model=family)


def test_every_familys_own_rope_scaling_is_valid():
    from maxckpt.conversion.spec import rope_scaling_problem

    for family in FAMILIES.values():
        assert family.rope_scaling is None or rope_scaling_problem(family.rope_scaling) is None, family.name


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0}
BAD_ROPE = [
    ({**LLAMA3, "factor": 0}, "llama3 scaling needs factor >= 1 (the context extension), got factor=0"),
    ({**LLAMA3, "factor": -1.0}, "got factor=-1.0"),
    ({"rope_type": "linear"}, "linear scaling needs factor >= 1 (the context extension), got factor=None"),
    ({**LLAMA3, "original_max_position_embeddings": 0},
     "original_max_position_embeddings must be a positive whole number, got 0"),
    ({**YARN, "original_max_position_embeddings": -4096}, "must be a positive whole number, got -4096"),
    ({**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     "llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor=4.0, high_freq_factor=1.0"),
    ({**LLAMA3, "low_freq_factor": 4.0}, "got low_freq_factor=4.0, high_freq_factor=4.0"),  # equal: divides by zero
    ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0},
     "yarn scaling needs beta_fast >= beta_slow > 0, got beta_fast=1.0, beta_slow=32.0"),
    ({**YARN, "mscale": -1.0}, "mscale must be a number >= 0, got -1.0"),
    ({**YARN, "attention_factor": 0}, "attention_factor must be a positive number, got 0"),
    ({"rope_type": "dynamic", "factor": 2.0},
     "rope_type 'dynamic' is not one maxckpt converts (default, linear, llama3, yarn)"),
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, "rope_type 'ntk-by-parts' is not one maxckpt converts"),
    ({"factor": 2.0}, "it states no rope_type"),
]


@pytest.mark.parametrize("scaling, problem", BAD_ROPE, ids=[p[:40] for _, p in BAD_ROPE])
def test_unusable_rope_scaling_is_refused_from_a_config_and_from_set(scaling, problem):
    from maxckpt.errors import CorruptCheckpointError

    stated = re.escape("llama/config.json states rope_scaling=") + ".*" + re.escape(problem)
    with pytest.raises(CorruptCheckpointError, match=stated):
        build_spec(DIMS, hints={"family": "llama3.1", "rope_scaling": scaling}, hints_source="llama/config.json")
    with pytest.raises(ConfigError, match=re.escape("--set rope_scaling=") + ".*" + re.escape(problem)):
        build_spec(DIMS, model="llama3.1", overrides={"rope_scaling": scaling})


def test_usable_rope_scaling_is_kept_as_stated():
    linear = ({"rope_type": "linear", "factor": 8.0}, {"type": "linear", "factor": 2})
    usable = (LLAMA3, YARN, {**YARN, "beta_fast": 1.0}, *linear)
    for scaling in usable:
        spec, _ = build_spec(DIMS, model="llama3.1", overrides={"rope_scaling": scaling})
        assert spec.rope_scaling == scaling
    spec, _ = build_spec(DIMS, model="llama2", overrides={"rope_scaling": None})
    assert spec.rope_scaling is None
