"""The reference forward of MaxText's MoE, MLA and Gemma families against MaxText's own logits.

Ground truth: the six training runs MaxText 0.2.5 wrote in shared/fixtures/maxtext
(`<name>_scan/checkpoints/5`) and the logits MaxText's forward computed for
them (`logits/<name>_step5.npy`). The rules these tests settle are written out
in shared/fixtures/README.md, section "MoE, MLA and Gemma families". The model
record is the ModelSpec conversion builds for each run (shapes, the family
record, the settings no shape shows).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from maxckpt.conversion import open_checkpoint
from maxckpt.errors import ConfigError, ShapeMismatchError, TensorNotFoundError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.reference import Model, family_forward, read_maxtext_params
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
_specs: dict[tuple, ModelSpec] = {}


def load(root, run):
    if run not in _cache:
        reader = OrbaxReader(root / run / "checkpoints" / "5" / "items")
        try:
            _cache[run] = read_maxtext_params(reader)
        finally:
            reader.close()
    params = _cache[run]
    expected = np.load(root / "logits" / f"{run}_step5.npy")
    tokens = np.load(root / "logits" / f"{run}_step5_tokens.npy")
    return dict(params), expected, tokens


def spec_of(root, run, family, **settings) -> ModelSpec:
    """The ModelSpec conversion builds for a fixture run: shapes, the family record, `settings` (`--set`)."""
    key = (run, family, tuple(sorted(settings.items())))
    if key not in _specs:
        with open_checkpoint(root / run / "checkpoints" / "5", model=family, overrides=settings or None) as ckpt:
            _specs[key] = ckpt.spec
    return _specs[key]


def unstacked(params, family):
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
            if family in ("gemma3", "gpt-oss"):  # layers/layers_{j}[block b] -> layers_{P*b + j}
                j, sub = re.match(r"^layers_(\d+)/(.*)$", rest).groups()
                pattern = 6 if family == "gemma3" else 2
                out[f"decoder/layers_{pattern * i + int(j)}/{sub}"] = piece
            else:
                out[f"{aux or ''}decoder/{group}_{i}/{rest}"] = piece
    if family == "gemma3":  # the remainder follows the full blocks
        blocks = params["decoder/layers/layers_0/mlp/wo/kernel"].shape[1]
        for name, array in params.items():
            m = re.match(r"^decoder/layers_remainder/layers_(\d+)/(.*)$", name)
            if m:
                out[f"decoder/layers_{6 * blocks + int(m.group(1))}/{m.group(2)}"] = array
    return out


@pytest.mark.parametrize("run,family,extra", FIXTURES, ids=IDS)
def test_reference_forward_reproduces_maxtexts_logits(maxtext_fixtures, run, family, extra):
    params, expected, tokens = load(maxtext_fixtures, run)
    spec = spec_of(maxtext_fixtures, run, family, **extra)
    logits = family_forward(params, spec, tokens, attend_in_bf16=True)
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("run,family,extra", FIXTURES, ids=IDS)
def test_unscanned_layout_gives_the_same_logits(maxtext_fixtures, run, family, extra):
    params, _, tokens = load(maxtext_fixtures, run)
    spec = spec_of(maxtext_fixtures, run, family, **extra)
    flat = unstacked(params, spec.family)
    assert not any(n.startswith(("decoder/layers/", "decoder/moe_layers/", "decoder/dense_layers/")) for n in flat)
    assert len(layer_groups(FAMILIES[spec.family], flat)) == spec.num_layers
    np.testing.assert_array_equal(
        family_forward(flat, spec, tokens, attend_in_bf16=True),
        family_forward(params, spec, tokens, attend_in_bf16=True),
    )


def test_layers_are_numbered_as_hf_numbers_them(maxtext_fixtures):
    gemma3, _, _ = load(maxtext_fixtures, "gemma3_scan")
    refs = layer_groups(FAMILIES["gemma3"], gemma3)
    assert [(r.index, r.prefix, r.stacked_at) for r in refs] == [
        *[(j, f"decoder/layers/layers_{j}/", 0) for j in range(6)],
        (6, "decoder/layers_remainder/layers_0/", None),
    ]
    types = Model.of(spec_of(maxtext_fixtures, "gemma3_scan", "gemma3")).layer_types
    assert types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    gemma2, _, _ = load(maxtext_fixtures, "gemma2_scan")
    assert [(r.index, r.stacked_at, r.half) for r in layer_groups(FAMILIES["gemma2"], gemma2)] == [
        (0, 0, "local"), (1, 0, "global"), (2, 1, "local"), (3, 1, "global"),
    ]
    deepseek, _, _ = load(maxtext_fixtures, "deepseek3_scan")
    assert [(r.index, r.moe) for r in layer_groups(FAMILIES["deepseek3"], deepseek)] == [
        (0, False), (1, False), (2, False), (3, True), (4, True),
    ]


def test_dimensions_come_from_the_shapes(maxtext_fixtures):
    ds = spec_of(maxtext_fixtures, "deepseek3_scan", "deepseek3", num_experts_per_tok=2)
    assert (ds.num_layers, ds.first_dense_layers, ds.num_heads) == (5, 3, 2)
    assert (ds.q_lora_rank, ds.kv_lora_rank, ds.qk_nope_head_dim, ds.qk_rope_head_dim, ds.v_head_dim) == (
        16, 16, 128, 64, 16)
    assert (ds.num_experts, ds.moe_mlp_dim, ds.num_shared_experts, ds.mlp_dim) == (4, 32, 1, 64)
    g = spec_of(maxtext_fixtures, "gemma2_scan", "gemma2")
    assert (g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim, g.mlp_dim) == (4, 4, 2, 16, 128)
    assert g.tie_word_embeddings and g.vocab_size == 256


def test_a_dropped_expert_changes_the_logits(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "mixtral_moe_scan")
    spec = spec_of(maxtext_fixtures, "mixtral_moe_scan", "mixtral", num_experts_per_tok=2)
    dropped = dict(params)
    wo = params["decoder/layers/MoeBlock_0/wo"].copy()
    wo[1] = 0.0  # expert 1 outputs nothing, in every layer
    dropped["decoder/layers/MoeBlock_0/wo"] = wo
    assert np.abs(family_forward(dropped, spec, tokens, attend_in_bf16=True) - expected).max() > 1e-2


def test_one_expert_per_token_instead_of_two_changes_the_logits(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "qwen3_moe_scan")
    spec = spec_of(maxtext_fixtures, "qwen3_moe_scan", "qwen3-moe", num_experts_per_tok=1)
    assert np.abs(family_forward(params, spec, tokens, attend_in_bf16=True) - expected).max() > 1e-2


def test_deepseek_routing_bias_matters_and_is_required(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "deepseek3_scan")
    spec = spec_of(maxtext_fixtures, "deepseek3_scan", "deepseek3", num_experts_per_tok=2)
    assert np.abs(params[BIAS_PATH]).max() > 0  # training moved it (steps of 0.05)
    zeroed = {**params, BIAS_PATH: np.zeros_like(params[BIAS_PATH])}
    assert np.abs(family_forward(zeroed, spec, tokens, attend_in_bf16=True) - expected).max() > 1e-2
    missing = {n: a for n, a in params.items() if n != BIAS_PATH}
    with pytest.raises(TensorNotFoundError, match=re.escape(ROUTING_BIAS)):
        family_forward(missing, spec, tokens)


def test_gemma_tied_logits_use_maxtexts_bfloat16_table(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "gemma2_scan")
    spec = spec_of(maxtext_fixtures, "gemma2_scan", "gemma2")
    exact = family_forward(params, spec, tokens)  # float32 table, as an exact HF forward would
    assert 1e-3 < np.abs(exact - expected).max() < 2e-2
    untied_params, _, _ = load(maxtext_fixtures, "gpt_oss_scan")
    untied = spec_of(maxtext_fixtures, "gpt_oss_scan", "gpt-oss", num_experts_per_tok=2)
    assert not untied.tie_word_embeddings
    np.testing.assert_array_equal(
        family_forward(untied_params, untied, tokens),
        family_forward(untied_params, untied, tokens, attend_in_bf16=True),
    )


def test_gemma2_softcaps_and_gpt_oss_sinks_are_applied(maxtext_fixtures):
    params, expected, tokens = load(maxtext_fixtures, "gemma2_scan")
    spec = spec_of(maxtext_fixtures, "gemma2_scan", "gemma2")
    no_cap = dataclasses.replace(spec, final_logit_softcap=None, attn_logit_softcap=None)
    assert np.abs(family_forward(params, no_cap, tokens, attend_in_bf16=True) - expected).max() > 1e-3
    oss, oss_expected, _ = load(maxtext_fixtures, "gpt_oss_scan")
    spec = spec_of(maxtext_fixtures, "gpt_oss_scan", "gpt-oss", num_experts_per_tok=2)
    no_sinks = dataclasses.replace(spec, attention_sinks=False)
    assert np.abs(family_forward(oss, no_sinks, tokens, attend_in_bf16=True) - oss_expected).max() > 1e-3


def test_yarn_frequencies_match_transformers():
    import transformers
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


def test_the_model_is_a_static_jit_argument_and_refuses_an_impossible_top_k():
    spec = _moe_spec(family="gpt-oss", num_layers=2, sliding_window=128, sliding_window_pattern=2,
                     rope_scaling={"rope_type": "yarn", "factor": 32.0}, activation="swiglu_oai")
    model = Model.of(spec)
    assert model.layer_types == ("sliding_attention", "full_attention")
    assert model.rope_scaling_dict["factor"] == 32.0 and model.swiglu_limit == 7.0 and not model.rope_interleave
    assert hash(model) == hash(Model.of(dataclasses.replace(spec))) and model == Model.of(dataclasses.replace(spec))
    assert model != Model.of(dataclasses.replace(spec, rope_scaling={"rope_type": "yarn", "factor": 16.0}))
    assert Model.of(_moe_spec(family="deepseek3")).rope_interleave and Model.of(_moe_spec(family="deepseek3")).mla
    with pytest.raises(ConfigError, match="num_experts_per_tok=5 must be between 1 and num_experts=4"):
        Model.of(dataclasses.replace(spec, num_experts_per_tok=5))
    with pytest.raises(ConfigError, match="n_group"):
        Model.of(_moe_spec(family="deepseek3", routing="sigmoid_bias", n_group=3))


def test_a_spec_with_the_wrong_layer_count_is_refused(maxtext_fixtures):
    params, _, tokens = load(maxtext_fixtures, "mixtral_moe_scan")
    spec = spec_of(maxtext_fixtures, "mixtral_moe_scan", "mixtral", num_experts_per_tok=2)
    wrong = dataclasses.replace(spec, num_layers=3)
    with pytest.raises(ShapeMismatchError, match="2 mixtral decoder layers"):
        family_forward(params, wrong, tokens)


def _moe_spec(**fields) -> ModelSpec:
    base = {
        "family": "deepseek3", "num_layers": 1, "emb_dim": 8, "num_heads": 1, "num_kv_heads": 1, "head_dim": 8,
        "mlp_dim": 8, "vocab_size": 16, "rms_norm_eps": 1e-6, "num_experts": 4, "num_experts_per_tok": 2,
        "routing": "softmax_topk",
    }
    return ModelSpec(**{**base, **fields})


def test_routing_rules_by_hand():
    from maxckpt.reference.moe import route

    logits = np.array([[[2.0, 1.0, 0.5, -1.0]]], np.float32)
    top2 = np.asarray(route(logits, Model.of(_moe_spec(routing="softmax_topk"))))[0, 0]
    e = np.exp([2.0, 1.0])
    np.testing.assert_allclose(top2, [e[0] / e.sum(), e[1] / e.sum(), 0, 0], rtol=1e-6)

    s = 1 / (1 + np.exp(-logits[0, 0]))
    bias = np.array([0.0, 0.0, 1.0, 0.0], np.float32)  # lifts expert 2 into the choice, not into its weight
    deepseek = _moe_spec(routing="sigmoid_bias", routed_scaling_factor=2.5)
    got = np.asarray(route(logits, Model.of(deepseek), bias))[0, 0]
    np.testing.assert_allclose(got, 2.5 * np.array([s[0], 0, s[2], 0]) / (s[0] + s[2]), rtol=1e-6)
    # Groups {0,1} and {2,3} score 0.88+0.73 and 1.62+0.27 (biased): only the second may be chosen.
    grouped = np.asarray(route(logits, Model.of(dataclasses.replace(deepseek, n_group=2, topk_group=1)), bias))[0, 0]
    np.testing.assert_allclose(grouped, 2.5 * np.array([0, 0, s[2], s[3]]) / (s[2] + s[3]), rtol=1e-6)


def test_top_k_is_not_guessed_when_it_cannot_hold(maxtext_fixtures):
    with pytest.raises(ConfigError, match="num_experts_per_tok=8 but the checkpoint has 4 experts"):
        spec_of(maxtext_fixtures, "qwen3_moe_scan", "qwen3-moe")  # the full-size model's top-8 cannot apply to 4
    params, _, tokens = load(maxtext_fixtures, "qwen3_moe_scan")
    spec = spec_of(maxtext_fixtures, "qwen3_moe_scan", "qwen3-moe", num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="num_experts_per_tok=8 must be between 1 and num_experts=4"):
        family_forward(params, dataclasses.replace(spec, num_experts_per_tok=8), tokens)


def test_gemma3_27b_scales_queries_by_width_over_heads(maxtext_fixtures):
    assert spec_of(maxtext_fixtures, "gemma3_scan", "gemma3-4b").query_pre_attn_scalar is None  # head_dim, 16 here
    assert spec_of(maxtext_fixtures, "gemma3_scan", "gemma3-27b").query_pre_attn_scalar == 5376 // 32  # emb / heads
    params, _, tokens = load(maxtext_fixtures, "gemma3_scan")
    four_b = spec_of(maxtext_fixtures, "gemma3_scan", "gemma3-4b")
    as_27b = dataclasses.replace(four_b, query_pre_attn_scalar=float(64 // 4))  # emb / heads of this tiny model
    np.testing.assert_array_equal(family_forward(params, as_27b, tokens), family_forward(params, four_b, tokens))
    assert np.abs(family_forward(params, dataclasses.replace(four_b, query_pre_attn_scalar=168.0), tokens)
                  - family_forward(params, four_b, tokens)).max() > 1e-3


def test_reading_an_opened_checkpoint_gives_maxtext_params_and_no_rng_state(maxtext_fixtures):
    from maxckpt.conversion.verify import maxtext_params
    from maxckpt.formats.maxtext.layout import canonical_names

    with open_checkpoint(maxtext_fixtures / "llama2_scan/checkpoints/5", model="llama2-7b") as ckpt:
        ours, via_conversion = read_maxtext_params(ckpt), maxtext_params(ckpt)
        lazies = ckpt.lazy_tensors()
        names = canonical_names(lazies).items()
        theirs = {canon: np.asarray(lazies[stored].read(), np.float32) for canon, stored in names}
    assert set(ours) == set(theirs) == set(via_conversion)  # nnx_aux there is RNG state only
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name]), name
    deepseek, _, _ = load(maxtext_fixtures, "deepseek3_scan")
    assert [n for n in deepseek if n.startswith("nnx_aux/")] == [BIAS_PATH]
    assert deepseek[BIAS_PATH].shape == (2, 4)


def test_reference_logits_picks_the_forward_by_family(maxtext_fixtures):
    from maxckpt.conversion.verify import maxtext_params
    from maxckpt.reference import forward, reference_logits, runs_llama_forward

    uses_llama = {name: runs_llama_forward(_moe_spec(family=name, num_experts=0)) for name in FAMILIES}
    assert uses_llama == {name: name in ("llama2", "llama3", "llama3.1", "mistral", "qwen3") for name in FAMILIES}
    params, expected, tokens = load(maxtext_fixtures, "gpt_oss_scan")
    spec = spec_of(maxtext_fixtures, "gpt_oss_scan", "gpt-oss-20b", num_experts_per_tok=2)
    logits = reference_logits(params, spec, tokens, attend_in_bf16=True)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(logits, family_forward(params, spec, tokens, attend_in_bf16=True))
    dense_expected = np.load(maxtext_fixtures / "logits" / "mistral_scan_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / "mistral_scan_step5_tokens.npy")
    with open_checkpoint(maxtext_fixtures / "mistral_scan/checkpoints/5", model="mistral-7b") as ckpt:
        dense_params, dense_spec = maxtext_params(ckpt), ckpt.spec
    dense = reference_logits(dense_params, dense_spec, tokens)
    np.testing.assert_array_equal(dense, forward(dense_params, dense_spec, tokens))
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
    model = Model.of(_moe_spec(family="gpt-oss", num_experts=1, num_experts_per_tok=1, activation="swiglu_oai"))
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
    np.testing.assert_allclose(np.asarray(routed_experts(x, p, "m", model)), want, rtol=1e-5, atol=1e-5)


def test_the_wrong_family_for_the_parameters_is_a_clear_error(maxtext_fixtures):
    params, _, tokens = load(maxtext_fixtures, "gemma2_scan")
    with pytest.raises(UnsupportedModelError, match="tensors are those of a gemma2 model"):
        spec_of(maxtext_fixtures, "gemma2_scan", "mixtral-8x7b", num_experts_per_tok=2)
    mixtral = spec_of(maxtext_fixtures, "mixtral_moe_scan", "mixtral", num_experts_per_tok=2)
    with pytest.raises(UnsupportedModelError, match="do not look like a mixtral model"):
        family_forward(params, mixtral, tokens)
