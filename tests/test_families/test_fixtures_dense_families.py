"""The dense families closest to Llama against MaxText 0.2.5's own runs: qwen2.5, llama3 and qwen3-8b.

Each fixture (shared/fixtures/README.md, "The remaining MaxText 0.2.5 text families") is converted to HF
once per module; transformers' own model code loads it with `from_pretrained` (no missing or unexpected
keys) and must give MaxText's logits within 1e-4, and so must maxckpt's JAX reference on the HF side.
MaxText -> HF -> MaxText is bit-exact scanned and unscanned, HF -> MaxText -> HF bit-exact in bfloat16,
and MaxText's own HF export (whose config.json keeps the full-size model's `layer_types`) converts back
to the training params. qwen2.5's q/k/v biases (and no output bias) are checked to matter.
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
from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError
from maxckpt.families import FAMILIES, resolve_model
from maxckpt.reference import reference_logits
from fixture_checks import assert_bf16_round_trip, assert_maxtext_round_trips, items, assert_same, hf_arrays, maxtext_arrays, transformers_logits

# (fixture, --model, family)
DENSE = [("qwen2_5_scan", "qwen2.5-7b", "qwen2.5"), ("llama3_scan", "llama3-8b", "llama3"),
         ("qwen3_8b_scan", "qwen3-8b", "qwen3")]
IDS = [d[0] for d in DENSE]
EXPORTS = ["qwen2_5_scan", "qwen3_8b_scan"]  # MaxText 0.2.5 makes an HF export of these two



@pytest.fixture(scope="module", params=DENSE, ids=IDS)
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
    np.testing.assert_allclose(transformers_logits(run["hf"], run["tokens"]), run["expected"], atol=1e-4, rtol=0)
    config = json.loads((run["hf"] / "config.json").read_text())
    fam = FAMILIES[run["family"]]
    assert (config["model_type"], config["architectures"]) == (fam.hf_model_type, [fam.hf_architecture])
    assert config["rope_parameters"] == {"rope_theta": fam.rope_theta, "rope_type": "default"}
    if fam.hf_layer_types:
        assert config["layer_types"] == ["full_attention"] * 2 and config["max_window_layers"] == 2


def test_verify_logits_and_the_reference_on_the_hf_side_give_maxtexts_logits(run):
    report = verify_logits(items(run["name"]), run["hf"], tokens=run["tokens"].tolist(), model=run["model"])
    assert report.ok and report.max_abs_diff < 1e-4
    with open_checkpoint(run["hf"]) as hf:  # HF -> MaxText layout -> the reference forward
        assert hf.spec.family == run["family"]
        got = reference_logits(maxtext_params(hf), hf.spec, run["tokens"].tolist())
    np.testing.assert_allclose(got, run["expected"], atol=1e-4, rtol=0)


def test_maxtext_hf_maxtext_is_bit_exact_scanned_and_unscanned(run):
    assert_maxtext_round_trips(run, ("decoder/layers/",), "decoder/layers_1/mlp/wo/kernel", model=run["model"])


def test_hf_maxtext_hf_is_bit_exact_in_bf16(run):
    assert_bf16_round_trip(run, model=run["model"])


@pytest.mark.parametrize("name", EXPORTS)
def test_maxtexts_own_hf_export_converts_back_to_the_training_params(tmp_path, name):
    """MaxText's config.json lists the full-size model's layer_types (28 / 36 for 2 layers): the first two are
    read, they say full attention as the family computes, and a note says so."""
    export = MAXTEXT_FIXTURES / "hf_by_maxtext" / name
    config = json.loads((export / "config.json").read_text())
    assert len(config["layer_types"]) > config["num_hidden_layers"] == 2
    report = convert(export, tmp_path / "mt", to="maxtext")
    assert any(f"lists {len(config['layer_types'])} layer_types for its 2 layers" in n for n in report.notes)
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items(name)))
    convert(items(name), tmp_path / "ours", to="hf", dtype="float32")  # and our export is MaxText's, bit for bit
    assert_same(hf_arrays(tmp_path / "ours"), hf_arrays(export))


def _export_with(tmp_path, **changes):
    """MaxText's qwen2.5 export with config.json keys changed (None: removed), the weights shared."""
    src = MAXTEXT_FIXTURES / "hf_by_maxtext" / "qwen2_5_scan"
    dst = tmp_path / "export"
    dst.mkdir()
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return dst


@pytest.mark.parametrize("changes,error,match", [
    ({"layer_types": ["full_attention", "sliding_attention"] + ["full_attention"] * 26},
     UnsupportedModelError, "layer_types make layer 1 sliding_attention, but maxckpt converts qwen2.5 with full"),
    ({"layer_types": ["full_attention"]}, CorruptCheckpointError, "lists 1 layer_types for its 2 layers"),
    ({"layer_types": None, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
     UnsupportedModelError, "turns on use_sliding_window \\(window 4\\) from layer 1 of 2"),
], ids=["a-sliding-layer", "too-few", "implied-sliding"])
def test_layer_types_saying_another_attention_are_refused(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        convert(_export_with(tmp_path, **changes), tmp_path / "mt", to="maxtext")
    assert not (tmp_path / "mt").exists()


def test_qwen2_5s_qkv_biases_convert_and_matter(tmp_path):
    """q/k/v biases, no output bias, on both sides; without them transformers computes something else."""
    names = set(maxtext_arrays(items("qwen2_5_scan")))
    assert {f"decoder/layers/self_attention/{p}/bias" for p in ("query", "key", "value")} <= names
    assert "decoder/layers/self_attention/out/bias" not in names
    convert(items("qwen2_5_scan"), tmp_path / "hf", to="hf", model="qwen2.5-7b", dtype="float32")
    hf = hf_arrays(tmp_path / "hf")
    assert not any(n.endswith("o_proj.bias") for n in hf)
    biases = [n for n in hf if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    assert len(biases) == 6 and all(np.abs(hf[n]).max() > 0 for n in biases)
    from safetensors.numpy import save_file

    save_file({n: (np.zeros_like(a) if n in biases else a) for n, a in hf.items()}, str(tmp_path / "hf" / "model.safetensors"))
    tokens = np.load(MAXTEXT_FIXTURES / "logits" / "qwen2_5_scan_step5_tokens.npy")
    expected = np.load(MAXTEXT_FIXTURES / "logits" / "qwen2_5_scan_step5.npy")
    assert np.abs(transformers_logits(tmp_path / "hf", tokens) - expected).max() > 1e-3


def test_qkv_biases_pick_qwen2_5_and_refuse_a_family_without_them(tmp_path):
    report = convert(items("qwen2_5_scan"), tmp_path / "guessed", to="hf")
    assert report.spec.family == "qwen2.5" and report.spec.qkv_bias and not report.spec.attention_bias
    assert any("q/k/v biases without an output bias say qwen2.5" in n for n in report.notes)
    with pytest.raises(UnsupportedModelError, match="q/k/v biases .* which a llama3 model lacks"):
        convert(items("qwen2_5_scan"), tmp_path / "llama", to="hf", model="llama3-8b")
    with pytest.raises(CorruptCheckpointError, match="query/bias.* --model names the right family"):  # qwen2.5 needs them
        convert(items("llama3_scan"), tmp_path / "qwen", to="hf", model="qwen2.5-7b")


def test_qwen2_5_through_plain_torch_is_bit_exact(tmp_path):
    """A single torch.save file states no head geometry: --set head_dim does (the biases are in the names)."""
    convert(items("qwen2_5_scan"), tmp_path / "model.pt", to="torch", model="qwen2.5-7b")
    report = convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", source=SourceOptions(overrides={"head_dim": 16}))
    assert report.spec.family == "qwen2.5"
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(items("qwen2_5_scan")))


def _yml(model: str) -> dict:
    from maxckpt.config.maxtext_run import configs_dir

    return yaml.safe_load((configs_dir()[0] / "models" / f"{model}.yml").read_text())


# MaxText 0.2.5's model names of these families (configs/models/*.yml), as the issue lists them.
PRESETS = {
    "qwen2.5": ["qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"],
    "llama3": ["llama3-8b", "llama3-70b", "llama3-405b", "llama3.3-70b"],
    "qwen3": ["qwen3-0.6b", "qwen3-1.7b", "qwen3-1.7b-base", "qwen3-4b", "qwen3-4b-base", "qwen3-4b-thinking-2507",
              "qwen3-8b", "qwen3-8b-base", "qwen3-14b", "qwen3-14b-base", "qwen3-32b"],
    "qwen3-moe": ["qwen3-30b-a3b", "qwen3-30b-a3b-base", "qwen3-235b-a22b", "qwen3-480b-a35b"],
}


@pytest.mark.parametrize("family", PRESETS)
def test_every_maxtext_model_name_is_a_preset_with_its_ymls_settings(family):
    """Each preset's rope theta, norm eps, q/k norm and decoder block are what MaxText 0.2.5's yml says."""
    assert FAMILIES[family].maxtext_models == tuple(PRESETS[family])
    for model in PRESETS[family]:
        assert resolve_model(model).name == family
        yml, values = _yml(model), family_defaults(resolve_model(model), model)
        assert values["rope_theta"] == float(yml["rope_max_timescale"]), model
        assert values["rms_norm_eps"] == float(yml["normalization_layer_epsilon"]), model
        assert values["qk_norm"] == bool(yml.get("use_qk_norm", False)), model
        assert yml.get("rope_type", "default") == "default" and values["rope_scaling"] is None, model
        block = FAMILIES[family].maxtext_decoder_block or "llama2"  # llama3 is llama2's block
        assert yml["decoder_block"] == block, model
        assert values.get("qkv_bias", False) == bool(yml.get("attention_bias", False)), model


def test_a_run_config_naming_the_qwen2_block_reads_as_qwen2_5(tmp_path):
    """True to the run: the run's own MaxText config (here its command line as --set) settles the family and
    its settings, so the notes name no preset guess."""
    sets = {"model_name": "qwen2.5-7b", "override_model_config": True, "base_emb_dim": 64,
            "base_num_query_heads": 4, "base_num_kv_heads": 2, "head_dim": 16, "vocab_size": 256,
            "base_mlp_dim": 96, "base_num_decoder_layers": 2}
    report = convert(items("qwen2_5_scan"), tmp_path / "hf", to="hf", source=SourceOptions(overrides=sets))
    assert report.spec.family == "qwen2.5" and report.spec.rope_theta == 1e6 and report.spec.rms_norm_eps == 1e-6
    assert not any("assumed from" in n for n in report.notes)



def test_megatron_args_state_qwen2_5s_biases_both_ways():
    """The run args Megatron-LM needs for q/k/v biases alone (`--add-qkv-bias --disable-bias-linear`, as
    Megatron-Bridge's Qwen2 provider sets them), read back as qwen2.5; an output bias stays refused."""
    from maxckpt.formats.megatron.args import megatron_args, megatron_cli_flags, spec_fields_from_megatron_args
    from maxckpt.formats.megatron.layout import MegatronLayout
    from maxckpt.formats.megatron.support import check_supported_args, check_supported_keys

    with open_checkpoint(items("qwen2_5_scan"), model="qwen2.5-7b") as ckpt:
        spec = ckpt.spec
    args = megatron_args(spec, MegatronLayout())
    assert (args.add_qkv_bias, args.add_bias_linear, args.qk_layernorm) == (True, False, False)
    check_supported_args(args)
    back = spec_fields_from_megatron_args(args)
    assert back["family"] == "qwen2.5" and back["qkv_bias"] is True and back["rope_theta"] == 1e6
    flags = megatron_cli_flags(spec, MegatronLayout())
    assert "--add-qkv-bias" in flags and "--disable-bias-linear" in flags
    check_supported_keys({"embedding.word_embeddings.weight": 0, "decoder.layers.self_attention.linear_qkv.bias": 0})
    with pytest.raises(UnsupportedModelError, match="linear_proj.bias"):
        check_supported_keys({"embedding.word_embeddings.weight": 0, "decoder.layers.self_attention.linear_qkv.bias": 0,
                              "decoder.layers.self_attention.linear_proj.bias": 0})
    with pytest.raises(UnsupportedModelError, match="add_bias_linear=True"):
        check_supported_args({**vars(args), "add_bias_linear": True})
