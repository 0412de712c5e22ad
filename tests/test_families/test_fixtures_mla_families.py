"""The MLA families beyond deepseek3 against MaxText 0.2.5's own runs: deepseek2, deepseek3.2 and kimi-k2.

Each fixture (shared/fixtures/README.md, "The remaining MaxText 0.2.5 text families") is converted to HF
once per module; transformers' own DeepseekV2 / DeepseekV32 / DeepseekV3 code loads it with
`from_pretrained` (no missing or unexpected keys) and must give MaxText's logits within 1e-4, and so must
maxckpt's reference forward on either side. MaxText -> HF -> MaxText is bit-exact scanned and unscanned
(the `nnx_aux` routing bias included), HF -> MaxText -> HF bit-exact in bfloat16 with the family read from
config.json alone. deepseek2-16b's query has no LoRA (one q_proj) and routes by softmax + greedy top-k;
deepseek3.2's sparse-attention indexer converts; kimi-k2 is DeepSeek-V3's HF model type with its own rope
and routed scaling. Megatron-Core loads deepseek2 and TorchTitan deepseek2 and kimi-k2 (tests/test_frameworks_matrix.py,
from the registry: the same checks as deepseek3's); the other framework pairs are refused with their family
records' reasons.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import MAXTEXT_FIXTURES

from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion.spec import family_defaults
from maxckpt.conversion.verify import maxtext_params, verify_logits
from maxckpt.errors import ConfigError, MaxckptError, UnsupportedModelError
from maxckpt.families import FAMILIES, bridge_gap, resolve_model
from maxckpt.reference import read_maxtext_params, reference_logits
from fixture_checks import assert_bf16_round_trip, assert_maxtext_round_trips, items, assert_same, hf_arrays, maxtext_arrays, transformers_logits

# (fixture, --model, family, --set): the runs route to 2 of 4 experts, and deepseek3.2's indexer keeps 8 keys
MLA = [
    ("deepseek2_scan", "deepseek2-16b", "deepseek2", {"num_experts_per_tok": 2}),
    ("deepseek32_scan", "deepseek3.2-671b", "deepseek3.2", {"num_experts_per_tok": 2, "indexer_topk": 8}),
    ("kimi_k2_scan", "kimi-k2-1t", "kimi-k2", {"num_experts_per_tok": 2}),
]
IDS = [m[2] for m in MLA]
BIAS = "nnx_aux/model/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"



@pytest.fixture(scope="module", params=MLA, ids=IDS)
def run(request, tmp_path_factory):
    """One fixture converted once to HF (float32): its paths, MaxText's logits and the conversion's report."""
    name, model, family, sets = request.param
    if not items(name).is_dir():
        pytest.skip(f"MaxText fixture {name} not found under {MAXTEXT_FIXTURES}")
    root = tmp_path_factory.mktemp(name)
    report = convert(items(name), root / "hf", to="hf", model=model, dtype="float32",
                     source=SourceOptions(overrides=sets))
    logits = MAXTEXT_FIXTURES / "logits"
    return {"name": name, "model": model, "family": family, "sets": sets, "root": root, "hf": root / "hf",
            "report": report, "tokens": np.load(logits / f"{name}_step5_tokens.npy"),
            "expected": np.load(logits / f"{name}_step5.npy")}


def test_the_hf_export_gives_maxtexts_logits_in_transformers(run):
    assert run["report"].spec.family == run["family"]
    got = transformers_logits(run["hf"], run["tokens"])
    np.testing.assert_allclose(got, run["expected"], atol=1e-4, rtol=0)
    config = json.loads((run["hf"] / "config.json").read_text())
    fam = FAMILIES[run["family"]]
    assert (config["model_type"], config["architectures"]) == (fam.hf_model_type, [fam.hf_architecture])
    assert (config["n_routed_experts"], config["num_experts_per_tok"], config["first_k_dense_replace"]) == (
        4, 2, {"deepseek2": 1, "deepseek3.2": 3, "kimi-k2": 1}[run["family"]])
    assert config["n_group"] == config["topk_group"] == 1  # MaxText's n_routing_groups -1: no groups


def test_config_json_states_each_familys_own_settings(run):
    config = json.loads((run["hf"] / "config.json").read_text())
    rope = config["rope_parameters"]
    if run["family"] == "deepseek2":  # no query LoRA, softmax + greedy top-k, not renormalised, two shared experts
        assert config["q_lora_rank"] is None and config["kv_lora_rank"] == 16
        assert (config["topk_method"], config["norm_topk_prob"], config["routed_scaling_factor"]) == ("greedy", False, 1.0)
        assert config["n_shared_experts"] == 2 and rope["mscale"] == rope["mscale_all_dim"] == 0.707
    elif run["family"] == "deepseek3.2":
        assert (config["index_n_heads"], config["index_head_dim"], config["index_topk"]) == (2, 128, 8)
        assert config["q_lora_rank"] == 16 and config["routed_scaling_factor"] == 2.5
    else:  # kimi-k2: DeepSeek-V3's model type with Kimi's rope and scaling
        assert rope == {"rope_theta": 50000.0, "rope_type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "truncate": True}
        assert config["routed_scaling_factor"] == 2.827 and config["max_position_embeddings"] == 131072


def test_the_reference_forward_and_verify_logits_give_maxtexts_logits(run):
    tokens = run["tokens"].tolist()
    with open_checkpoint(items(run["name"]), model=run["model"], overrides=run["sets"]) as ckpt:
        np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), run["expected"],
                                   atol=1e-4, rtol=0)
    with open_checkpoint(run["hf"]) as hf:  # the HF view, family and settings from config.json alone
        assert hf.spec.family == run["family"]
        np.testing.assert_allclose(reference_logits(maxtext_params(hf), hf.spec, tokens), run["expected"],
                                   atol=1e-4, rtol=0)
    report = verify_logits(items(run["name"]), run["hf"], tokens=tokens, model=run["model"],
                           source=SourceOptions(overrides=run["sets"]))
    assert report.ok and report.max_abs_diff < 1e-4, report.max_abs_diff


def test_maxtext_hf_maxtext_is_bit_exact_scanned_and_unscanned(run):
    assert (BIAS in maxtext_arrays(items(run["name"]))) == (run["family"] != "deepseek2")  # deepseek2: no bias
    assert_maxtext_round_trips(run, ("decoder/dense_layers/", "decoder/moe_layers/"),
                               "decoder/dense_layers_0/self_attention/wkv_b/kernel", model=run["model"],
                               source=SourceOptions(overrides=run["sets"]))


def test_hf_maxtext_hf_is_bit_exact_in_bf16(run):
    report = assert_bf16_round_trip(run, model=run["model"], source=SourceOptions(overrides=run["sets"]))
    # kimi-k2 read from config.json alone: deepseek_v3 with rope theta 5e4
    assert report.spec.num_experts_per_tok == 2 and report.spec.indexer_topk == run["sets"].get("indexer_topk", 0)


def test_plain_torch_round_trip_is_bit_exact(run, tmp_path):
    kw = {"model": run["model"], "source": SourceOptions(overrides=run["sets"])}
    convert(items(run["name"]), tmp_path / "model.pt", to="torch", **kw)
    convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", **kw)
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items(run["name"])))


def test_the_tree_names_deepseek2_and_deepseek3_2_and_kimi_k2_needs_model(tmp_path):
    """deepseek2-16b's one query kernel and deepseek3.2's indexer are their own; kimi-k2's tree is deepseek3's."""
    for name, family in (("deepseek2_scan", "deepseek2"), ("deepseek32_scan", "deepseek3.2"), ("kimi_k2_scan", "deepseek3")):
        with open_checkpoint(items(name), overrides={"num_experts_per_tok": 2}) as ckpt:
            assert ckpt.spec.family == family
    with pytest.raises(UnsupportedModelError, match="tensors are those of a deepseek3.2 model"):
        convert(items("deepseek32_scan"), tmp_path / "x", to="hf", model="deepseek3-671b",
                source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    with pytest.raises(UnsupportedModelError, match="gate/bias is a model variable .* that deepseek2 .* has no place"):
        convert(items("deepseek3_scan"), tmp_path / "x", to="hf", model="deepseek2-236b",  # its tree reads alike
                source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    with pytest.raises(UnsupportedModelError, match="tensors are those of a deepseek2 model"):
        convert(items("deepseek2_scan"), tmp_path / "x", to="hf", model="kimi-k2-1t",
                source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert not (tmp_path / "x").exists()


def _logits(name):
    return (np.load(MAXTEXT_FIXTURES / "logits" / f"{name}_step5_tokens.npy"),
            np.load(MAXTEXT_FIXTURES / "logits" / f"{name}_step5.npy"))


def test_kimi_k2s_settings_matter(tmp_path):
    """Read as deepseek3 (same tree, same HF model type) the kimi run computes other logits: the family counts."""
    tokens, expected = _logits("kimi_k2_scan")
    convert(items("kimi_k2_scan"), tmp_path / "hf", to="hf", model="deepseek3-671b", dtype="float32",
            source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert np.abs(transformers_logits(tmp_path / "hf", tokens) - expected).max() > 1e-3


def test_deepseek2s_greedy_softmax_routing_matters():
    """Renormalising deepseek2's top-k weights (what every other softmax family does) computes other logits."""
    tokens, expected = _logits("deepseek2_scan")
    with open_checkpoint(items("deepseek2_scan"), model="deepseek2-16b",
                         overrides={"num_experts_per_tok": 2, "norm_topk_prob": True}) as ckpt:
        got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens.tolist())
    assert np.abs(got - expected).max() > 1e-3


def test_deepseek3_2s_indexer_converts_and_the_reference_refuses_what_it_would_select(tmp_path):
    """The indexer's weights (LayerNorm scale and bias included) reach HF as transformers names them; more
    tokens than indexer_topk would need its selection, which the dense reference does not compute."""
    name, model, _, sets = MLA[1]
    convert(items(name), tmp_path / "hf", to="hf", model=model, dtype="float32", source=SourceOptions(overrides=sets))
    hf, mt = hf_arrays(tmp_path / "hf"), maxtext_arrays(items(name))
    for layer, (stack, k) in enumerate([("dense_layers", 0), ("dense_layers", 1), ("dense_layers", 2), ("moe_layers", 0)]):
        p, q = f"model.layers.{layer}.self_attn.indexer", f"decoder/{stack}/self_attention/indexer"
        assert np.array_equal(hf[f"{p}.wq_b.weight"], mt[f"{q}/wq_b/kernel"][:, k].reshape(16, 256).T)
        assert np.array_equal(hf[f"{p}.wk.weight"], mt[f"{q}/wk/kernel"][:, k].T)
        assert np.array_equal(hf[f"{p}.k_norm.weight"], mt[f"{q}/k_norm/scale"][:, k])
        assert np.array_equal(hf[f"{p}.k_norm.bias"], mt[f"{q}/k_norm/bias"][:, k])
        assert np.array_equal(hf[f"{p}.weights_proj.weight"], mt[f"{q}/weights_proj/kernel"][:, k].T)
    assert np.abs(hf["model.layers.3.self_attn.indexer.k_norm.bias"]).max() > 0
    with open_checkpoint(items(name), model=model, overrides={**sets, "indexer_topk": 4}) as ckpt:
        with pytest.raises(ConfigError, match="indexer_topk 4"):
            reference_logits(read_maxtext_params(ckpt), ckpt.spec, [list(range(8))])


def test_maxtexts_own_hf_exports(tmp_path):
    """deepseek2's export is ours, tensor for tensor, and reads back as the run; deepseek3.2's lacks the routing
    bias (README: "yes, but wrong"), which maxckpt refuses to guess rather than route without it."""
    export = MAXTEXT_FIXTURES / "hf_by_maxtext" / "deepseek2_scan"
    convert(items("deepseek2_scan"), tmp_path / "ours", to="hf", model="deepseek2-16b", dtype="float32",
            source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    theirs, ours = hf_arrays(export), hf_arrays(tmp_path / "ours")
    assert sorted(theirs) == sorted(ours)
    for n in ours:
        np.testing.assert_array_equal(theirs[n].astype(np.float32), ours[n].astype(np.float32), err_msg=n)
    report = convert(export, tmp_path / "mt", to="maxtext")
    assert report.spec.family == "deepseek2" and report.spec.q_lora_rank == 0
    back, original = maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items("deepseek2_scan"))
    assert set(back) == set(original)
    for n in original:
        np.testing.assert_array_equal(back[n].astype(np.float32), original[n].astype(np.float32), err_msg=n)
    theirs32 = MAXTEXT_FIXTURES / "hf_by_maxtext" / "deepseek32_scan"
    with pytest.raises(MaxckptError, match="n_group=8, topk_group=4 does not fit 4 experts"):
        convert(theirs32, tmp_path / "mt32", to="maxtext")
    with pytest.raises(MaxckptError, match="e_score_correction_bias' is missing"):  # the groups fixed by hand
        convert(theirs32, tmp_path / "mt32", to="maxtext", source=SourceOptions(overrides={"n_group": 1, "topk_group": 1}))
    assert not (tmp_path / "mt32").exists()


@pytest.mark.parametrize("family,targets", [("deepseek2", ()), ("deepseek3.2", ("megatron", "torchtitan")),
                                            ("kimi-k2", ("megatron",))])
def test_megatron_and_torchtitan_refuse_what_they_cannot_hold_with_the_records_reason(tmp_path, family, targets):
    """deepseek2 reaches both, kimi-k2 TorchTitan (its deepseek_v3 model; tests/test_frameworks_matrix.py loads
    them both ways); Megatron-LM cannot state Kimi's YaRN beta_fast; DSA's indexer is in neither's models maxckpt
    maps (TorchTitan has none, Megatron-Core only as an experimental attention variant)."""
    name, model, _, sets = next(m for m in MLA if m[2] == family)
    for target in ("megatron", "torchtitan"):
        gap = bridge_gap(target, family)
        assert (gap is not None) == (target in targets)
        if gap is None:
            continue
        with pytest.raises(UnsupportedModelError) as info:
            convert(items(name), tmp_path / target, to=target, model=model, source=SourceOptions(overrides=sets))
        assert str(info.value) == f"{family} cannot be converted to {target}: {gap}"
    assert not list(tmp_path.iterdir())


def _yml(model: str) -> dict:
    from maxckpt.config.maxtext_run import configs_dir

    return yaml.safe_load((configs_dir()[0] / "models" / f"{model}.yml").read_text())


PRESETS = {"deepseek2": ["deepseek2-16b", "deepseek2-236b"], "deepseek3.2": ["deepseek3.2-671b"],
           "kimi-k2": ["kimi-k2-1t"]}


@pytest.mark.parametrize("family", PRESETS)
def test_every_maxtext_model_name_is_a_preset_with_its_ymls_settings(family):
    """Each preset's rope, norm eps, top-k, routed scaling and routing kind are what MaxText 0.2.5's yml says."""
    assert FAMILIES[family].maxtext_models == tuple(PRESETS[family])
    for model in PRESETS[family]:
        assert resolve_model(model).name == family
        yml, values = _yml(model), family_defaults(resolve_model(model), model)
        assert yml["decoder_block"] == FAMILIES[family].maxtext_decoder_block == "deepseek", model
        assert values["rope_theta"] == float(yml["rope_max_timescale"]), model
        assert values["rms_norm_eps"] == float(yml["normalization_layer_epsilon"]), model
        assert values["max_position_embeddings"] == yml["max_position_embeddings"], model
        assert values["num_experts_per_tok"] == yml["num_experts_per_tok"], model
        assert values["routed_scaling_factor"] == float(yml["routed_scaling_factor"]), model
        assert values["routing"] == {"softmax": "softmax_greedy", "sigmoid": "sigmoid_bias"}[yml["routed_score_func"]]
        rope = values["rope_scaling"]
        assert yml["rope_type"] == rope["rope_type"] == "yarn", model
        assert (rope["factor"], rope["beta_fast"]) == (float(yml["rope_factor"]), float(yml["beta_fast"])), model
        assert rope["beta_slow"] == float(yml.get("beta_slow", 1)), model
        assert rope["mscale"] == rope["mscale_all_dim"] == float(yml["mscale"]), model  # rope_attention_scaling off
        assert values.get("indexer_topk", 0) == (yml["indexer_topk"] if yml.get("use_indexer") else 0), model


# The fixture runs' own MaxText command lines (shared/fixtures/README.md, the third batch's table).
RUN_SETS = {
    "deepseek2_scan": dict(model_name="deepseek2-16b", base_emb_dim=64, base_num_query_heads=2, base_num_kv_heads=2,
                           base_num_decoder_layers=3, first_num_dense_layers=1, shared_experts=2),
    "deepseek32_scan": dict(model_name="deepseek3.2-671b", base_emb_dim=64, base_num_query_heads=2, base_num_kv_heads=2,
                            base_num_decoder_layers=4, first_num_dense_layers=3, shared_experts=1, q_lora_rank=16,
                            indexer_n_heads=2, indexer_head_dim=128, indexer_topk=8, indexer_sparse_training=True,
                            indexer_loss_scaling_factor=0.01, routed_bias_update_rate=0.05),
    "kimi_k2_scan": dict(model_name="kimi-k2-1t", base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=4,
                         base_num_decoder_layers=3, first_num_dense_layers=1, shared_experts=1, q_lora_rank=16,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, routed_bias_update_rate=0.05),
}
_COMMON = dict(override_model_config=True, vocab_size=256, base_mlp_dim=64, base_moe_mlp_dim=32, num_experts=4,
               num_experts_per_tok=2, kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=16)


def test_the_runs_own_maxtext_settings_are_enough(run, tmp_path):
    """True to the run: MaxText's own keys (override_model_config, indexer_*, ...) settle what shapes cannot;
    the export is the one --model with --set gives, config.json and every tensor."""
    sets = {**_COMMON, **RUN_SETS[run["name"]]}
    report = convert(items(run["name"]), tmp_path / "hf", to="hf", dtype="float32", source=SourceOptions(overrides=sets))
    assert report.spec.family == run["family"] and not any("assumed from" in n for n in report.notes)
    assert_same(hf_arrays(tmp_path / "hf"), hf_arrays(run["hf"]))
    ours = json.loads((tmp_path / "hf" / "config.json").read_text())
    theirs = json.loads((run["hf"] / "config.json").read_text())
    for key in ("rope_parameters", "num_experts_per_tok", "routed_scaling_factor", "n_group", "index_topk"):
        assert ours.get(key) == theirs.get(key), key


def test_a_runs_mscale_sets_both_of_hfs_mscales(tmp_path):
    """MaxText's one `mscale` scales MLA's softmax (HF mscale_all_dim) and leaves its rope alone (HF's attention
    factor mscale / mscale_all_dim = 1): both HF keys follow it, and transformers still gives the reference's
    logits on the run's weights."""
    sets = {**_COMMON, **RUN_SETS["deepseek2_scan"], "mscale": 0.5}
    convert(items("deepseek2_scan"), tmp_path / "hf", to="hf", dtype="float32", source=SourceOptions(overrides=sets))
    rope = json.loads((tmp_path / "hf" / "config.json").read_text())["rope_parameters"]
    assert rope["mscale"] == rope["mscale_all_dim"] == 0.5
    tokens, expected = _logits("deepseek2_scan")
    got = transformers_logits(tmp_path / "hf", tokens)
    assert np.abs(got - expected).max() > 1e-3  # another model than the run's 0.707 ...
    with open_checkpoint(items("deepseek2_scan"), overrides=sets) as ckpt:  # ... which the reference computes alike
        np.testing.assert_allclose(got, reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens.tolist()),
                                   atol=1e-4, rtol=0)
