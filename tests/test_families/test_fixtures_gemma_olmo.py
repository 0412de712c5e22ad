"""gemma (v1) and olmo3 against MaxText 0.2.5's own runs (`gemma_scan`, `olmo3_scan`).

Each fixture (shared/fixtures/README.md, "The remaining MaxText 0.2.5 text families (third batch)") is
converted to HF once per module; transformers' own model code loads it with `from_pretrained` (no missing or
unexpected keys) and must give MaxText's logits within 1e-4, and so must maxckpt's JAX reference on the HF
side. gemma's output is tied: MaxText multiplies by a bfloat16 copy of the table (`attend_on_embedding`), so
the transformers forward here does the same to its output table only (never to the converted files).
MaxText -> HF -> MaxText is bit-exact scanned and unscanned, HF -> MaxText -> HF bit-exact in bfloat16, and
the formats whose models cannot express a family refuse it with the family record's reason.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import MAXTEXT_FIXTURES

from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion.verify import maxtext_params, verify_logits
from maxckpt.errors import UnsupportedModelError
from maxckpt.families import FAMILIES
from maxckpt.formats import MaxTextOptions
from maxckpt.reference import reference_logits
from fixture_checks import assert_bf16_round_trip, assert_maxtext_round_trips, items, assert_same, hf_arrays, maxtext_arrays, transformers_logits

# (fixture, --model, family)
RUNS = [("gemma_scan", "gemma-2b", "gemma"), ("olmo3_scan", "olmo3-7b", "olmo3")]
IDS = [r[0] for r in RUNS]



@pytest.fixture(scope="module", params=RUNS, ids=IDS)
def run(request, tmp_path_factory):
    """One fixture converted once to HF (float32): its paths, MaxText's logits and the conversion's report."""
    name, model, family = request.param
    if not items(name).is_dir():
        pytest.skip(f"MaxText fixture {name} not found under {MAXTEXT_FIXTURES}")
    root = tmp_path_factory.mktemp(name)
    report = convert(items(name), root / "hf", to="hf", model=model, dtype="float32")
    logits = MAXTEXT_FIXTURES / "logits"
    return {"name": name, "model": model, "family": family, "root": root, "hf": root / "hf", "report": report,
            "tokens": np.load(logits / f"{name}_step5_tokens.npy"), "expected": np.load(logits / f"{name}_step5.npy")}


def test_the_hf_export_gives_maxtexts_logits_in_transformers(run):
    assert run["report"].spec.family == run["family"]
    fam = FAMILIES[run["family"]]
    tied = run["report"].spec.tie_word_embeddings
    got = transformers_logits(run["hf"], run["tokens"], bf16_output_table=tied)
    np.testing.assert_allclose(got, run["expected"], atol=1e-4, rtol=0)
    config = json.loads((run["hf"] / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (fam.hf_model_type, [fam.hf_architecture])


def test_verify_logits_and_the_reference_on_the_hf_side_give_maxtexts_logits(run):
    report = verify_logits(items(run["name"]), run["hf"], tokens=run["tokens"].tolist(), model=run["model"])
    assert report.ok and report.max_abs_diff < 1e-4
    with open_checkpoint(run["hf"]) as hf:  # HF -> MaxText layout -> the reference forward
        assert hf.spec.family == run["family"]
        got = reference_logits(maxtext_params(hf), hf.spec, run["tokens"].tolist(),
                               attend_in_bf16=hf.spec.tie_word_embeddings)
    np.testing.assert_allclose(got, run["expected"], atol=1e-4, rtol=0)


def test_maxtext_hf_maxtext_is_bit_exact_scanned_and_unscanned(run):
    assert_maxtext_round_trips(run, ("decoder/layers/",), "decoder/layers_1/mlp/wo/kernel", model=run["model"])


def test_hf_maxtext_hf_is_bit_exact_in_bf16(run):
    assert_bf16_round_trip(run, model=run["model"])


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_the_frameworks_that_cannot_express_the_family_refuse_it_with_its_reason(run, fmt, tmp_path):
    reason = FAMILIES[run["family"]].bridge_gaps[fmt]
    with pytest.raises(UnsupportedModelError, match=f"cannot be converted to {fmt}: {re.escape(reason)}"):
        convert(items(run["name"]), tmp_path / "out", to=fmt, model=run["model"])
    assert not (tmp_path / "out").exists()


def test_the_gemma_tree_reads_as_gemma_without_a_model_name(tmp_path):
    """A pre-MLP norm without gemma2/3's sandwich norms names gemma (v1); its settings are the family's."""
    report = convert(items("gemma_scan"), tmp_path / "hf", to="hf", dtype="float32")
    spec = report.spec
    assert spec.family == "gemma" and spec.num_kv_heads == 1 and spec.tie_word_embeddings
    assert (spec.norm_offset, spec.maxtext_embedding_scaled, spec.activation) == (1.0, True, "gelu_tanh")
    assert not spec.sandwich_norms and spec.sliding_window_pattern == 0 and spec.attn_logit_softcap is None
    hf = hf_arrays(tmp_path / "hf")
    mt = maxtext_arrays(items("gemma_scan"))
    # HF's (1 + w) norms and its runtime sqrt(emb) embedding scale: the stored values move accordingly
    np.testing.assert_array_equal(hf["model.layers.0.input_layernorm.weight"],
                                  mt["decoder/layers/pre_self_attention_norm/scale"][:, 0] - 1)
    np.testing.assert_allclose(hf["model.embed_tokens.weight"], mt["token_embedder/embedding"] / 8, rtol=1e-6)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["hidden_activation"] == "gelu_pytorch_tanh" and config["num_key_value_heads"] == 1


@pytest.mark.parametrize("model", ["gemma-2b", "gemma-7b"])
def test_gemma_presets_are_maxtexts_model_names(model):
    from maxckpt.families import resolve_model

    assert resolve_model(model).name == "gemma"


def test_olmo3s_post_norms_and_whole_projection_qk_norms_map_to_hfs(tmp_path):
    """MaxText's post_self_attention / post_mlp norms are HF's post_attention / post_feedforward norms (no
    input norm); the q/k norms span all heads [Hq*D], [Hkv*D]; the layers go 3 sliding, 1 full."""
    report = convert(items("olmo3_scan"), tmp_path / "hf", to="hf", dtype="float32")  # the tree names olmo3
    spec = report.spec
    assert spec.family == "olmo3" and spec.qk_norm and not spec.maxtext_query_scale
    assert (spec.sliding_window, spec.sliding_window_pattern) == (4096, 4)
    hf, mt = hf_arrays(tmp_path / "hf"), maxtext_arrays(items("olmo3_scan"))
    assert not any("input_layernorm" in n for n in hf)
    a = "decoder/layers/layers_2/attention"
    np.testing.assert_array_equal(hf["model.layers.2.self_attn.q_norm.weight"], mt[f"{a}/query_norm/scale"][:, 0])
    np.testing.assert_array_equal(hf["model.layers.2.self_attn.k_norm.weight"], mt[f"{a}/key_norm/scale"][:, 0])
    assert hf["model.layers.2.self_attn.q_norm.weight"].shape == (64,) and hf["model.layers.2.self_attn.k_norm.weight"].shape == (32,)
    np.testing.assert_array_equal(hf["model.layers.3.post_feedforward_layernorm.weight"],
                                  mt["decoder/layers/layers_3/post_mlp_layer_norm/scale"][:, 0])
    np.testing.assert_array_equal(hf["model.layers.1.post_attention_layernorm.weight"],
                                  mt["decoder/layers/layers_1/post_self_attention_layer_norm/scale"][:, 0])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    rope = config["rope_parameters"]
    assert rope["sliding_attention"] == rope["full_attention"] and rope["full_attention"]["rope_type"] == "yarn"


def test_olmo3s_sliding_layers_need_the_yarn_rope_and_other_rope_is_refused(tmp_path):
    """Default rope on the sliding layers (what transformers 5 reads from a flat rope_parameters) computes
    another model: its logits are off, and maxckpt refuses to convert it to MaxText rather than drop it."""
    convert(items("olmo3_scan"), tmp_path / "hf", to="hf", model="olmo3-7b", dtype="float32")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"]["sliding_attention"] = {"rope_type": "default", "rope_theta": 500000.0}
    path.write_text(json.dumps(config))
    tokens = np.load(MAXTEXT_FIXTURES / "logits" / "olmo3_scan_step5_tokens.npy")
    expected = np.load(MAXTEXT_FIXTURES / "logits" / "olmo3_scan_step5.npy")
    assert np.abs(transformers_logits(tmp_path / "hf", tokens) - expected).max() > 1e-2
    with pytest.raises(UnsupportedModelError, match="applies one rope .* to every layer"):
        convert(tmp_path / "hf", tmp_path / "mt", to="maxtext")
    assert not (tmp_path / "mt").exists()


@pytest.mark.parametrize("model", ["olmo3-7b", "olmo3-32b"])
def test_olmo3_presets_are_maxtexts_model_names_with_their_yml_settings(model):
    import yaml

    from maxckpt.config.maxtext_run import configs_dir
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import resolve_model

    yml = yaml.safe_load((configs_dir()[0] / "models" / f"{model}.yml").read_text())
    values = family_defaults(resolve_model(model), model)
    assert resolve_model(model).name == "olmo3" and yml["decoder_block"] == "olmo3"
    assert values["rope_theta"] == float(yml["rope_max_timescale"])
    assert values["rms_norm_eps"] == float(yml["normalization_layer_epsilon"])
    assert values["sliding_window"] == yml["sliding_window_size"]
    assert values["sliding_window_pattern"] == yml["inhomogeneous_layer_cycle_interval"]
    scaling = values["rope_scaling"]
    assert scaling["rope_type"] == yml["rope_type"] == "yarn" and scaling["factor"] == yml["rope_factor"]
    assert scaling["original_max_position_embeddings"] == yml["original_max_position_embeddings"]
    assert (scaling["beta_fast"], scaling["beta_slow"]) == (yml["beta_fast"], yml["beta_slow"])
    assert yml["rope_attention_scaling"] and yml["rope_truncate"] and not yml["rope_interleave"]


@pytest.mark.parametrize("name,model,named", [("gemma_scan", "gemma-2b", True), ("olmo3_scan", "olmo3-7b", False)])
def test_plain_torch_round_trip_is_bit_exact(tmp_path, name, model, named):
    """A torch.save file of HF names states no head geometry (--set head_dim does); olmo3's norm names say the
    family, gemma's are Llama's, so gemma needs --model."""
    convert(items(name), tmp_path / "model.pt", to="torch", model=model)
    report = convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", model=model if named else None,
                     source=SourceOptions(overrides={"head_dim": 16}))
    assert report.spec.family == model.split("-")[0]
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items(name)))


@pytest.mark.parametrize("name,sets", [
    ("gemma_scan", {"model_name": "gemma-2b", "base_num_kv_heads": 1, "base_mlp_dim": 128, "base_num_decoder_layers": 2}),
    ("olmo3_scan", {"model_name": "olmo3-7b", "base_mlp_dim": 96, "base_num_decoder_layers": 4}),
])
def test_the_runs_own_config_settles_the_family_and_its_settings(tmp_path, name, sets):
    """True to the run: the run's MaxText command line (as --set) gives the settings, so no preset is assumed."""
    sets = {"override_model_config": True, "base_emb_dim": 64, "base_num_query_heads": 4, "base_num_kv_heads": 2,
            "head_dim": 16, "vocab_size": 256, "max_target_length": 32, **sets}
    report = convert(items(name), tmp_path / "hf", to="hf", dtype="float32", source=SourceOptions(overrides=sets))
    assert report.spec.family == sets["model_name"].split("-")[0]
    assert not any("assumed from" in n for n in report.notes)
    tokens = np.load(MAXTEXT_FIXTURES / "logits" / f"{name}_step5_tokens.npy")
    expected = np.load(MAXTEXT_FIXTURES / "logits" / f"{name}_step5.npy")
    got = transformers_logits(tmp_path / "hf", tokens, bf16_output_table=report.spec.tie_word_embeddings)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_olmo3s_rope_stated_once_in_the_4x_form_is_read_for_every_layer_with_a_note(tmp_path):
    """A 4.x config.json (rope_theta + rope_scaling, as the Hub's OLMo 3 releases) means YaRN on every layer
    to transformers 4.x and MaxText, on the full layers alone to transformers 5: read as the former, said."""
    convert(items("olmo3_scan"), tmp_path / "hf", to="hf", model="olmo3-7b", dtype="float32")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    del config["rope_parameters"]
    path.write_text(json.dumps(config))
    report = convert(tmp_path / "hf", tmp_path / "mt", to="maxtext")
    assert report.spec.rope_scaling["rope_type"] == "yarn" and report.spec.local_rope_theta is None
    assert any("transformers 5 would apply it to the full-attention layers only" in n for n in report.notes)
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items("olmo3_scan")))


def test_olmo3_scanned_with_a_partial_block_is_refused_unscanned_written(tmp_path):
    """MaxText 0.2.5 scans olmo3 in whole blocks of 4 and drops leftover layers: 3 layers cannot be written
    scanned (no decoder/layers_remainder MaxText would load), only unscanned."""
    from safetensors.numpy import save_file

    convert(items("olmo3_scan"), tmp_path / "hf", to="hf", model="olmo3-7b", dtype="float32")
    hf = {n: a for n, a in hf_arrays(tmp_path / "hf").items() if not n.startswith("model.layers.3.")}
    (tmp_path / "hf3").mkdir()
    save_file(hf, str(tmp_path / "hf3" / "model.safetensors"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(num_hidden_layers=3, layer_types=config["layer_types"][:3])
    (tmp_path / "hf3" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="3 layers is not a whole number of blocks of 4"):
        convert(tmp_path / "hf3", tmp_path / "mt", to="maxtext", options=MaxTextOptions(scan_layers=True))
    convert(tmp_path / "hf3", tmp_path / "mt", to="maxtext", options=MaxTextOptions(scan_layers=False))
    assert "decoder/layers_2/attention/query_norm/scale" in maxtext_arrays(tmp_path / "mt")


def test_olmo3_7b_pt_is_the_pretraining_preset_with_default_rope_on_every_layer(tmp_path):
    """MaxText's olmo3-7b-pt (stage 1 / 2 pretraining revisions): its yml's default rope over 8192 positions,
    not olmo3-7b's YaRN; the HF model written for it computes what the reference computes with that rope,
    which is not what the YaRN run computed."""
    import yaml

    from maxckpt.config.maxtext_run import configs_dir
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import resolve_model

    yml = yaml.safe_load((configs_dir()[0] / "models" / "olmo3-7b-pt.yml").read_text())
    values = family_defaults(resolve_model("olmo3-7b-pt"), "olmo3-7b-pt")
    assert yml["rope_type"] == "default" and values["rope_scaling"] is None
    assert values["max_position_embeddings"] == yml["max_position_embeddings"] == 8192
    report = convert(items("olmo3_scan"), tmp_path / "hf", to="hf", model="olmo3-7b-pt", dtype="float32")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: v["rope_type"] for k, v in config["rope_parameters"].items()} == {
        "full_attention": "default", "sliding_attention": "default"}
    tokens = np.load(MAXTEXT_FIXTURES / "logits" / "olmo3_scan_step5_tokens.npy")
    got = transformers_logits(tmp_path / "hf", tokens)
    with open_checkpoint(items("olmo3_scan"), model="olmo3-7b-pt") as ckpt:
        want = reference_logits(maxtext_params(ckpt), ckpt.spec, tokens.tolist())
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert report.spec.rope_scaling is None
    assert np.abs(got - np.load(MAXTEXT_FIXTURES / "logits" / "olmo3_scan_step5.npy")).max() > 1e-3  # not the YaRN run
