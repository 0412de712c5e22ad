"""The reference forward of MaxText's MoE, MLA and Gemma families against MaxText's own logits.

Ground truth: the six training runs MaxText 0.2.5 wrote in shared/fixtures/maxtext
(`<name>_scan/checkpoints/5`) and the logits MaxText's forward computed for
them (`logits/<name>_step5.npy`). The rules these tests settle are written out
in shared/fixtures/README.md, section "MoE, MLA and Gemma families".
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from maxckpt.errors import ConfigError, ShapeMismatchError, TensorNotFoundError, UnsupportedModelError
from maxckpt.reference import ArchConfig, family_forward, infer_arch, read_maxtext_params
from maxckpt.reference.families_forward import ROUTING_BIAS
from maxckpt.reference.stacks import layer_groups

# (run under maxtext/, family name as a user gives it, fields no shape shows)
FIXTURES = [
    ("mixtral_moe_scan", "mixtral-8x7b", {"num_experts_per_tok": 2}),
    ("qwen3_moe_scan", "qwen3-30b-a3b", {"num_experts_per_tok": 2}),
    ("gemma2_scan", "gemma2-2b", {}),
    ("gemma3_scan", "gemma3-4b", {}),
    ("gpt_oss_scan", "gpt-oss-20b", {"num_experts_per_tok": 2}),
    ("deepseek3_scan", "deepseek3-671b", {"num_experts_per_tok": 2}),
]
IDS = [f[0] for f in FIXTURES]
BIAS_PATH = "nnx_aux/model/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"

_cache: dict[str, dict[str, np.ndarray]] = {}


def load(root, run):
    if run not in _cache:
        _cache[run] = read_maxtext_params(root / run / "checkpoints" / "5" / "items")
    params = _cache[run]
    expected = np.load(root / "logits" / f"{run}_step5.npy")
    tokens = np.load(root / "logits" / f"{run}_step5_tokens.npy")
    return dict(params), expected, tokens


def unstacked(params, kind):
    """The same model in MaxText's scan_layers=false layout, written out by hand."""
    out = {}
    for name, array in params.items():
        m = re.match(r"^(nnx_aux/model/)?decoder/(layers|dense_layers|moe_layers)/(.*)$", name)
        if m is None:
            if not name.startswith("decoder/layers_remainder/"):
                out[name] = array
            continue
        aux, group, rest = m.groups()
        axis = 0 if aux else 1
        for i in range(array.shape[axis]):
            piece = np.take(array, i, axis=axis)
            if kind in ("gemma3", "gpt_oss"):  # layers/layers_{j}[block b] -> layers_{P*b + j}
                j, sub = re.match(r"^layers_(\d+)/(.*)$", rest).groups()
                pattern = 6 if kind == "gemma3" else 2
                out[f"decoder/layers_{pattern * i + int(j)}/{sub}"] = piece
            else:
                out[f"{aux or ''}decoder/{group}_{i}/{rest}"] = piece
    if kind == "gemma3":  # the remainder follows the full blocks
        blocks = params["decoder/layers/layers_0/mlp/wo/kernel"].shape[1]
        for name, array in params.items():
            m = re.match(r"^decoder/layers_remainder/layers_(\d+)/(.*)$", name)
            if m:
                out[f"decoder/layers_{6 * blocks + int(m.group(1))}/{m.group(2)}"] = array
    return out


@pytest.mark.parametrize("run,family,extra", FIXTURES, ids=IDS)
def test_reference_forward_reproduces_maxtexts_logits(maxtext_fixtures, run, family, extra):
    params, expected, tokens = load(maxtext_fixtures, run)
    arch = infer_arch(family, params, **extra)
    logits = family_forward(params, arch, tokens, attend_in_bf16=True)
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("run,family,extra", FIXTURES, ids=IDS)
def test_unscanned_layout_gives_the_same_logits(maxtext_fixtures, run, family, extra):
    params, _, tokens = load(maxtext_fixtures, run)
    arch = infer_arch(family, params, **extra)
    flat = unstacked(params, arch.family)
    assert not any(n.startswith(("decoder/layers/", "decoder/moe_layers/", "decoder/dense_layers/")) for n in flat)
    assert infer_arch(family, flat, **extra) == arch
    np.testing.assert_array_equal(
        family_forward(flat, arch, tokens, attend_in_bf16=True),
        family_forward(params, arch, tokens, attend_in_bf16=True),
    )


def test_layers_are_numbered_as_hf_numbers_them(maxtext_fixtures):
    gemma3, _, _ = load(maxtext_fixtures, "gemma3_scan")
    refs = layer_groups("gemma3", gemma3)
    assert [(r.index, r.prefix, r.stacked_at) for r in refs] == [
        *[(j, f"decoder/layers/layers_{j}/", 0) for j in range(6)],
        (6, "decoder/layers_remainder/layers_0/", None),
    ]
    types = infer_arch("gemma3", gemma3).layer_types
    assert types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    gemma2, _, _ = load(maxtext_fixtures, "gemma2_scan")
    assert [(r.index, r.stacked_at, r.half) for r in layer_groups("gemma2", gemma2)] == [
        (0, 0, "local"), (1, 0, "global"), (2, 1, "local"), (3, 1, "global"),
    ]
    deepseek, _, _ = load(maxtext_fixtures, "deepseek3_scan")
    assert [(r.index, r.moe) for r in layer_groups("deepseek3", deepseek)] == [
        (0, False), (1, False), (2, False), (3, True), (4, True),
    ]


def test_dimensions_come_from_the_shapes(maxtext_fixtures):
    deepseek, _, _ = load(maxtext_fixtures, "deepseek3_scan")
    arch = infer_arch("deepseek3", deepseek, num_experts_per_tok=2)
    assert (arch.num_hidden_layers, arch.first_k_dense_replace, arch.num_attention_heads) == (5, 3, 2)
    assert (arch.q_lora_rank, arch.kv_lora_rank, arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim) == (
        16, 16, 128, 64, 16)
    assert (arch.num_local_experts, arch.moe_intermediate_size, arch.n_shared_experts, arch.intermediate_size) == (
        4, 32, 1, 64)
    gemma2, _, _ = load(maxtext_fixtures, "gemma2_scan")
    g = infer_arch("gemma2", gemma2)
    assert (g.num_hidden_layers, g.num_attention_heads, g.num_key_value_heads, g.head_dim, g.intermediate_size) == (
        4, 4, 2, 16, 128)
    assert g.tie_word_embeddings and g.vocab_size == 256


def test_a_dropped_expert_changes_the_logits(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "mixtral_moe_scan")
    arch = infer_arch("mixtral", params, num_experts_per_tok=2)
    dropped = dict(params)
    wo = params["decoder/layers/MoeBlock_0/wo"].copy()
    wo[1] = 0.0  # expert 1 outputs nothing, in every layer
    dropped["decoder/layers/MoeBlock_0/wo"] = wo
    assert np.abs(family_forward(dropped, arch, tokens, attend_in_bf16=True) - expected).max() > 1e-2


def test_one_expert_per_token_instead_of_two_changes_the_logits(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "qwen3_moe_scan")
    arch = infer_arch("qwen3-moe", params, num_experts_per_tok=1)
    assert np.abs(family_forward(params, arch, tokens, attend_in_bf16=True) - expected).max() > 1e-2


def test_deepseek_routing_bias_matters_and_is_required(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "deepseek3_scan")
    arch = infer_arch("deepseek3", params, num_experts_per_tok=2)
    assert np.abs(params[BIAS_PATH]).max() > 0  # training moved it (steps of 0.05)
    zeroed = {**params, BIAS_PATH: np.zeros_like(params[BIAS_PATH])}
    assert np.abs(family_forward(zeroed, arch, tokens, attend_in_bf16=True) - expected).max() > 1e-2
    missing = {n: a for n, a in params.items() if n != BIAS_PATH}
    with pytest.raises(TensorNotFoundError, match=re.escape(ROUTING_BIAS)):
        family_forward(missing, arch, tokens)


def test_gemma_tied_logits_use_maxtexts_bfloat16_table(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "gemma2_scan")
    arch = infer_arch("gemma2", params)
    exact = family_forward(params, arch, tokens)  # float32 table, as an exact HF forward would
    assert 1e-3 < np.abs(exact - expected).max() < 2e-2
    untied_params, _, _ = load(maxtext_fixtures, "gpt_oss_scan")
    untied = infer_arch("gpt-oss", untied_params, num_experts_per_tok=2)
    np.testing.assert_array_equal(
        family_forward(untied_params, untied, tokens),
        family_forward(untied_params, untied, tokens, attend_in_bf16=True),
    )


def test_gemma2_softcaps_and_gpt_oss_sinks_are_applied(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "gemma2_scan")
    arch = infer_arch("gemma2", params)
    no_cap = arch.replace(final_logit_softcapping=None, attn_logit_softcapping=None)
    assert np.abs(family_forward(params, no_cap, tokens, attend_in_bf16=True) - expected).max() > 1e-3
    oss, oss_expected, _ = load(maxtext_fixtures, "gpt_oss_scan")
    arch = infer_arch("gpt-oss", oss, num_experts_per_tok=2)
    no_sinks = arch.replace(attention_sinks=False)
    assert np.abs(family_forward(oss, no_sinks, tokens, attend_in_bf16=True) - oss_expected).max() > 1e-3


def test_yarn_frequencies_match_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from maxckpt.reference.rope import yarn_attention_factor, yarn_frequencies

    scaling = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
               "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    config = transformers.GptOssConfig(
        hidden_size=64, num_attention_heads=4, head_dim=64, max_position_embeddings=131072,
        rope_parameters={"rope_theta": 150000.0, **scaling},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    np.testing.assert_allclose(np.asarray(yarn_frequencies(64, 150000.0, scaling)), inv_freq.numpy(), rtol=1e-5)
    # MaxText's rope_attention_scaling=True on cos/sin is HF's default attention factor
    assert yarn_attention_factor(scaling) == pytest.approx(attention_factor) == pytest.approx(0.1 * np.log(32) + 1)
    assert yarn_attention_factor({**scaling, "mscale": 1.0, "mscale_all_dim": 1.0}) == 1.0  # deepseek3's


def test_arch_config_from_a_plain_mapping():
    fields = {
        "family": "gpt-oss", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "rms_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0}, "num_local_experts": 4, "num_experts_per_tok": 2,
    }
    arch = ArchConfig.from_mapping(fields)
    assert arch.family == "gpt_oss" and arch.rope_scaling_dict["factor"] == 32.0
    assert hash(arch) == hash(ArchConfig.from_mapping(fields))  # usable as a jit static argument
    as_json = json.loads(json.dumps(dataclasses.asdict(arch)))
    assert ArchConfig.from_mapping(as_json) == arch
    with pytest.raises(ConfigError, match="rope_thetaa"):
        ArchConfig.from_mapping({**fields, "rope_thetaa": 1.0})
    with pytest.raises(ConfigError, match="layer_types"):
        ArchConfig.from_mapping({**fields, "num_hidden_layers": 3})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        ArchConfig.from_mapping({**fields, "num_experts_per_tok": 5})
    with pytest.raises(UnsupportedModelError, match="llama"):
        ArchConfig.from_mapping({**fields, "family": "llama2"})


def test_an_arch_with_the_wrong_layer_count_is_refused(maxtext_fixtures):
    params, _, tokens = load(maxtext_fixtures, "mixtral_moe_scan")
    arch = infer_arch("mixtral", params, num_experts_per_tok=2)
    wrong = arch.replace(num_hidden_layers=3, layer_types=("full_attention",) * 3)
    with pytest.raises(ShapeMismatchError, match="2 mixtral decoder layers"):
        family_forward(params, wrong, tokens)


def _moe_arch(**fields):
    base = {
        "family": "deepseek3", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
        "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 16, "rms_norm_eps": 1e-6,
        "layer_types": ["full_attention"], "num_local_experts": 4, "num_experts_per_tok": 2,
    }
    return ArchConfig.from_mapping({**base, **fields})


def test_routing_rules_by_hand():
    from maxckpt.reference.moe import route

    logits = np.array([[[2.0, 1.0, 0.5, -1.0]]], np.float32)
    top2 = np.asarray(route(logits, _moe_arch(scoring_func="softmax_topk")))[0, 0]
    e = np.exp([2.0, 1.0])
    np.testing.assert_allclose(top2, [e[0] / e.sum(), e[1] / e.sum(), 0, 0], rtol=1e-6)

    s = 1 / (1 + np.exp(-logits[0, 0]))
    bias = np.array([0.0, 0.0, 1.0, 0.0], np.float32)  # lifts expert 2 into the choice, not into its weight
    deepseek = _moe_arch(scoring_func="sigmoid_bias", routed_scaling_factor=2.5)
    got = np.asarray(route(logits, deepseek, bias))[0, 0]
    np.testing.assert_allclose(got, 2.5 * np.array([s[0], 0, s[2], 0]) / (s[0] + s[2]), rtol=1e-6)
    # Groups {0,1} and {2,3} score 0.88+0.73 and 1.62+0.27 (biased): only the second may be chosen.
    grouped = np.asarray(route(logits, deepseek.replace(n_group=2, topk_group=1), bias))[0, 0]
    np.testing.assert_allclose(grouped, 2.5 * np.array([0, 0, s[2], s[3]]) / (s[2] + s[3]), rtol=1e-6)


def test_top_k_is_not_guessed_when_it_cannot_hold(maxtext_fixtures):
    params, _, _ = load(maxtext_fixtures, "qwen3_moe_scan")
    with pytest.raises(ConfigError, match="num_experts_per_tok=8 .* num_local_experts=4"):
        infer_arch("qwen3-moe", params)  # the full-size model's top-8 cannot apply to 4 experts


def test_gemma3_27b_scales_queries_by_width_over_heads(maxtext_fixtures):
    params, _, _ = load(maxtext_fixtures, "gemma3_scan")
    assert infer_arch("gemma3-4b", params).query_pre_attn_scalar is None  # head_dim, 16 here
    assert infer_arch("gemma3-27b", params).query_pre_attn_scalar == 64 // 4


def test_reading_an_opened_checkpoint_gives_maxtext_params_and_no_rng_state(maxtext_fixtures):
    from maxckpt.conversion import open_checkpoint
    from maxckpt.reference import maxtext_params

    with open_checkpoint(maxtext_fixtures / "llama2_scan/checkpoints/5", model="llama2-7b") as ckpt:
        ours, theirs = read_maxtext_params(ckpt), maxtext_params(ckpt)
    assert set(ours) == set(theirs)  # nnx_aux there is RNG state only
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name]), name
    deepseek, _, _ = load(maxtext_fixtures, "deepseek3_scan")
    assert [n for n in deepseek if n.startswith("nnx_aux/")] == [BIAS_PATH]
    assert deepseek[BIAS_PATH].shape == (2, 4)


def test_reference_logits_picks_the_forward_by_family(maxtext_fixtures):
    from maxckpt.conversion import open_checkpoint
    from maxckpt.reference import has_family_forward, maxtext_params, reference_logits

    assert has_family_forward("deepseek3-671b") and has_family_forward("gemma2")
    assert not has_family_forward("llama3.1-8b")
    params, expected, tokens = load(maxtext_fixtures, "gpt_oss_scan")
    logits = reference_logits(params, "gpt-oss-20b", tokens, attend_in_bf16=True, num_experts_per_tok=2)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)
    dense_expected = np.load(maxtext_fixtures / "logits" / "mistral_scan_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / "mistral_scan_step5_tokens.npy")
    with open_checkpoint(maxtext_fixtures / "mistral_scan/checkpoints/5", model="mistral-7b") as ckpt:
        dense = reference_logits(maxtext_params(ckpt), "mistral-7b", tokens, spec=ckpt.spec)
        with pytest.raises(UnsupportedModelError, match="ModelSpec"):
            reference_logits(maxtext_params(ckpt), "mistral-7b", tokens)
    np.testing.assert_allclose(dense, dense_expected, atol=1e-4, rtol=0)


def test_sliding_window_lets_query_i_see_keys_with_i_minus_j_below_the_window():
    from maxckpt.reference.attention import attention_mask

    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], bool)
    np.testing.assert_array_equal(np.asarray(attention_mask(4, 2)), expected)
    np.testing.assert_array_equal(np.asarray(attention_mask(4, None)), np.tril(np.ones((4, 4), bool)))


def test_gpt_oss_experts_clamp_gate_and_up():
    from maxckpt.reference.moe import routed_experts

    rng = np.random.default_rng(0)
    emb, f = 4, 3
    arch = _moe_arch(family="gpt-oss", num_local_experts=1, num_experts_per_tok=1, swiglu_limit=7.0)
    p = {
        "m/gate/kernel": np.zeros((emb, 1), np.float32),
        "m/wi_0": rng.normal(size=(1, emb, f)).astype(np.float32) * 10,  # large enough to hit the clamps
        "m/wi_1": rng.normal(size=(1, emb, f)).astype(np.float32) * 10,
        "m/wo": rng.normal(size=(1, f, emb)).astype(np.float32),
        "m/wi_0_bias": rng.normal(size=(1, f)).astype(np.float32),
        "m/wi_1_bias": rng.normal(size=(1, f)).astype(np.float32),
        "m/wo_bias": rng.normal(size=(1, emb)).astype(np.float32),
    }
    x = rng.normal(size=(1, 2, emb)).astype(np.float32)
    g = np.minimum(x @ p["m/wi_0"][0] + p["m/wi_0_bias"][0], 7.0)
    u = np.clip(x @ p["m/wi_1"][0] + p["m/wi_1_bias"][0], -7.0, 7.0)
    assert (np.abs(x @ p["m/wi_1"][0] + p["m/wi_1_bias"][0]) > 7).any()
    assert (x @ p["m/wi_0"][0] + p["m/wi_0_bias"][0] > 7).any()
    want = (g / (1 + np.exp(-1.702 * g)) * (u + 1)) @ p["m/wo"][0] + p["m/wo_bias"][0]
    np.testing.assert_allclose(np.asarray(routed_experts(x, p, "m", arch)), want, rtol=1e-5, atol=1e-5)


def test_the_wrong_family_for_the_parameters_is_a_clear_error(maxtext_fixtures):
    params, _, _ = load(maxtext_fixtures, "gemma2_scan")
    with pytest.raises(UnsupportedModelError, match="do not look like a mixtral model"):
        infer_arch("mixtral", params, num_experts_per_tok=2)
