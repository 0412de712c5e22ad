"""MoE, MLA and Gemma families against MaxText's own checkpoints and logits.

Each fixture (a MaxText 0.2.5 training run, see shared/fixtures/README.md)
is converted to HF with maxckpt, loaded by transformers' own model code with
`from_pretrained` (no missing or unexpected keys allowed) and must give
MaxText's logits within 1e-4. MaxText's tied-embedding logits multiply by a
bfloat16 copy of the table (`attend_on_embedding`); for gemma2/gemma3 the
test's transformers forward does the same to the output table only (never
the converted files). Round trips through HF and between the scanned and
unscanned MaxText layouts must give back every array bit for bit, DeepSeek's
routing bias in `nnx_aux` included.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from maxckpt.formats import MaxTextOptions, MegatronOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.verify import verify, verify_logits
from fixture_checks import assert_same, hf_arrays, maxtext_arrays, transformers_logits

# (fixture, --model, --set): the tiny runs route to 2 of 4 experts, which no full-size preset does.
FAMILY_FIXTURES = [
    ("mixtral_moe_scan", "mixtral-8x7b", {}),
    ("qwen3_moe_scan", "qwen3-30b-a3b", {"num_experts_per_tok": 2}),
    ("deepseek3_scan", "deepseek3-671b", {"num_experts_per_tok": 2}),
    ("gpt_oss_scan", "gpt-oss-20b", {"num_experts_per_tok": 2}),
    ("gemma2_scan", "gemma2-2b", {}),
    ("gemma3_scan", "gemma3-4b", {}),
]
IDS = [f[0] for f in FAMILY_FIXTURES]
DEEPSEEK_BIAS = "nnx_aux/model/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"


def source(root, name):
    return root / name / "checkpoints" / "5" / "items"


@pytest.mark.parametrize("name,model,settings", FAMILY_FIXTURES, ids=IDS)
def test_converted_hf_model_gives_maxtexts_logits_in_transformers(maxtext_fixtures, tmp_path, name, model, settings):
    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")
    convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model, dtype="float32", source=SourceOptions(overrides=settings))
    logits = transformers_logits(tmp_path / "hf", tokens, bf16_output_table=name.startswith("gemma"))
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,model,settings", FAMILY_FIXTURES, ids=IDS)
def test_verify_logits_runs_the_family_reference_against_transformers(maxtext_fixtures, tmp_path, name, model, settings):
    """`verify --logits` for every family: maxckpt's reference of MaxText on the checkpoint vs transformers on
    the HF export agree, and the reference (with the spec's settings) gives MaxText's own logits on the
    fixture's tokens (the bf16 tied-table rounding aside, which the reference leaves out here)."""
    from maxckpt.conversion.verify import maxtext_params
    from maxckpt.reference import reference_logits

    convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model, dtype="float32", source=SourceOptions(overrides=settings))
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")
    report = verify_logits(source(maxtext_fixtures, name), tmp_path / "hf", tokens=tokens.tolist(), model=model, source=SourceOptions(overrides=settings))
    assert report.ok, report.max_abs_diff
    assert report.max_abs_diff < 1e-4
    if not name.startswith("gemma"):
        expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")
        with open_checkpoint(tmp_path / "hf", overrides=settings) as hf:  # the HF view goes through the same reference
            np.testing.assert_allclose(reference_logits(maxtext_params(hf), hf.spec, tokens.tolist()), expected, atol=1e-4, rtol=0)


def test_verify_logits_fails_when_the_top_k_is_wrong(maxtext_fixtures, tmp_path):
    """A MoE run with the wrong top-k computes a different model: the logits check must say so."""
    convert(source(maxtext_fixtures, "qwen3_moe_scan"), tmp_path / "hf", to="hf", model="qwen3-30b-a3b",
            dtype="float32", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    report = verify_logits(source(maxtext_fixtures, "qwen3_moe_scan"), tmp_path / "hf", model="qwen3-30b-a3b",
                           model_b="qwen3-moe", source=SourceOptions(overrides={"num_experts_per_tok": 1}))
    assert not report.ok


def test_a_dropped_routing_bias_would_change_deepseeks_logits(maxtext_fixtures, tmp_path):
    """The bias lives outside params; the export carries it, and it matters (so the logits test can fail)."""
    expected = np.load(maxtext_fixtures / "logits" / "deepseek3_scan_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / "deepseek3_scan_step5_tokens.npy")
    convert(source(maxtext_fixtures, "deepseek3_scan"), tmp_path / "hf", to="hf", model="deepseek3-671b",
            source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    hf = hf_arrays(tmp_path / "hf")
    bias = maxtext_arrays(source(maxtext_fixtures, "deepseek3_scan"))[DEEPSEEK_BIAS]  # [L, X]: layer axis first
    assert np.abs(bias).max() > 0
    for k, layer in enumerate((3, 4)):
        assert np.array_equal(hf[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"], bias[k])
    from safetensors.numpy import save_file

    for layer in (3, 4):
        hf[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = np.zeros(4, np.float32)
    save_file(hf, str(tmp_path / "hf" / "model.safetensors"))
    assert np.abs(transformers_logits(tmp_path / "hf", tokens, False) - expected).max() > 1e-2


def test_config_json_states_what_maxtext_computed(maxtext_fixtures, tmp_path):
    configs = {}
    for name, model, settings in FAMILY_FIXTURES:
        convert(source(maxtext_fixtures, name), tmp_path / name, to="hf", model=model, source=SourceOptions(overrides=settings))
        configs[name] = json.loads((tmp_path / name / "config.json").read_text())
    g2, g3, ds, oss = configs["gemma2_scan"], configs["gemma3_scan"], configs["deepseek3_scan"], configs["gpt_oss_scan"]
    assert g2["query_pre_attn_scalar"] == 16 and g3["query_pre_attn_scalar"] == 16  # head_dim, not the 2b's 256
    assert g2["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (g2["attn_logit_softcapping"], g2["final_logit_softcapping"], g2["sliding_window"]) == (50.0, 30.0, 4096)
    assert g3["model_type"] == "gemma3_text" and g3["architectures"] == ["Gemma3ForCausalLM"]
    assert g3["rope_parameters"]["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert g3["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    assert g3["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert (ds["n_group"], ds["topk_group"], ds["first_k_dense_replace"], ds["n_shared_experts"]) == (1, 1, 3, 1)
    assert (ds["n_routed_experts"], ds["num_experts_per_tok"], ds["routed_scaling_factor"]) == (4, 2, 2.5)
    assert (ds["qk_nope_head_dim"], ds["qk_rope_head_dim"], ds["v_head_dim"], ds["rope_interleave"]) == (128, 64, 16, True)
    assert oss["experts_per_token"] == oss["num_experts_per_tok"] == 2
    assert oss["layer_types"] == ["sliding_attention", "full_attention"] * 2 and oss["sliding_window"] == 128
    assert configs["qwen3_moe_scan"]["num_experts"] == 4 and configs["qwen3_moe_scan"]["norm_topk_prob"] is True
    assert configs["mixtral_moe_scan"]["num_local_experts"] == 4


@pytest.mark.parametrize("name,model,settings", FAMILY_FIXTURES, ids=IDS)
def test_maxtext_hf_maxtext_round_trip_is_bit_exact_scanned_and_unscanned(maxtext_fixtures, tmp_path, name, model, settings):
    original = maxtext_arrays(source(maxtext_fixtures, name))
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", **kw)
    convert(tmp_path / "hf", tmp_path / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(tmp_path / "scanned"), original)
    # Unscanned and back: every layer under its own name, then stacked again.
    convert(source(maxtext_fixtures, name), tmp_path / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), **kw)
    unscanned = maxtext_arrays(tmp_path / "unscanned")
    assert not any(n.startswith(("decoder/layers/", "decoder/moe_layers/", "decoder/dense_layers/")) for n in unscanned)
    convert(tmp_path / "unscanned", tmp_path / "rescanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(tmp_path / "rescanned"), original)
    convert(tmp_path / "unscanned", tmp_path / "hf2", to="hf", **kw)
    assert_same(hf_arrays(tmp_path / "hf2"), hf_arrays(tmp_path / "hf"))


@pytest.mark.parametrize("name,model,settings", FAMILY_FIXTURES, ids=IDS)
def test_hf_maxtext_hf_round_trip_is_bit_exact_in_bf16(maxtext_fixtures, tmp_path, name, model, settings):
    convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model, dtype="bfloat16", source=SourceOptions(overrides=settings))
    first = hf_arrays(tmp_path / "hf")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    convert(tmp_path / "hf", tmp_path / "mt", to="maxtext")  # family and settings from config.json alone
    # Gemma's norm scales (HF weight + 1) stay float32 in MaxText: in bfloat16 the sum would lose bits.
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", model=model, source=SourceOptions(overrides=settings), dtype="bfloat16")
    assert_same(hf_arrays(tmp_path / "hf2"), first)
    assert verify(tmp_path / "hf", tmp_path / "mt", model_b=model, source=SourceOptions(overrides=settings)).ok


@pytest.mark.parametrize("name", ["mixtral_moe_scan", "qwen3_moe_scan", "gpt_oss_scan"])
def test_maxtexts_own_hf_export_converts_back_to_the_training_params(maxtext_fixtures, tmp_path, name):
    """Where MaxText's exporter is right (weights and config), its export and ours meet."""
    report = convert(maxtext_fixtures / "hf_by_maxtext" / name, tmp_path / "mt", to="maxtext")
    assert report.spec.num_experts_per_tok == 2
    # MaxText's gpt-oss config keeps the 20B's experts_per_token 4 beside num_experts_per_tok 2: said, not hidden.
    assert any("experts_per_token=4" in n for n in report.notes) == (name == "gpt_oss_scan")
    back = maxtext_arrays(tmp_path / "mt")
    original = maxtext_arrays(source(maxtext_fixtures, name))
    assert set(back) == set(original)
    for n in original:
        np.testing.assert_allclose(back[n], original[n], rtol=0, atol=1e-6, err_msg=n)


def test_gemma3_multimodal_export_is_read_as_its_text_model(maxtext_fixtures, tmp_path):
    """MaxText's gemma3 export wraps the text model (model.language_model.*) and a wrong rope/scalar config."""
    ours = tmp_path / "ours"
    convert(source(maxtext_fixtures, "gemma3_scan"), ours, to="hf", model="gemma3-4b")
    theirs = maxtext_fixtures / "hf_by_maxtext" / "gemma3_scan"
    with open_checkpoint(theirs) as ckpt:
        assert ckpt.spec.family == "gemma3" and ckpt.spec.num_layers == 7
        tensors = {n: t.read() for n, t in ckpt.hf_tensors().items()}
    assert_same(tensors, hf_arrays(ours))


def test_dropping_an_expert_fails_verify_and_conversion(maxtext_fixtures, tmp_path):
    from safetensors.numpy import save_file

    convert(source(maxtext_fixtures, "mixtral_moe_scan"), tmp_path / "hf", to="hf", model="mixtral-8x7b")
    arrays = {n: a for n, a in hf_arrays(tmp_path / "hf").items() if ".experts.3." not in n or ".layers.1." not in n}
    (tmp_path / "bad").mkdir()
    save_file(arrays, str(tmp_path / "bad" / "model.safetensors"))
    (tmp_path / "bad" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    assert verify(source(maxtext_fixtures, "mixtral_moe_scan"), tmp_path / "hf", model="mixtral-8x7b").ok
    # A consistent 3-expert copy (config, router and experts agree) still fails verify, layer by layer.
    three = {n: (a[:3] if n.endswith("block_sparse_moe.gate.weight") else a) for n, a in hf_arrays(tmp_path / "hf").items()
             if ".experts.3." not in n}
    (tmp_path / "three").mkdir()
    save_file(three, str(tmp_path / "three" / "model.safetensors"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "three" / "config.json").write_text(json.dumps({**config, "num_local_experts": 3}))
    report = verify(source(maxtext_fixtures, "mixtral_moe_scan"), tmp_path / "three", model="mixtral-8x7b")
    assert not report.ok
    assert [r.problem for r in report.rows if r.name.endswith(" experts")] == ["experts: 4 vs 3 (specs say 4 and 3)"] * 2
    from maxckpt.errors import MaxckptError

    with pytest.raises(MaxckptError, match="layer 1 has 3 experts"):
        convert(tmp_path / "bad", tmp_path / "mt", to="maxtext")


def test_top_k_beyond_the_experts_is_refused_with_the_flag_to_pass(maxtext_fixtures, tmp_path):
    from maxckpt.errors import ConfigError

    with pytest.raises(ConfigError, match="--set num_experts_per_tok=K"):
        convert(source(maxtext_fixtures, "qwen3_moe_scan"), tmp_path / "hf", to="hf", model="qwen3-30b-a3b")
    assert not (tmp_path / "hf").exists()


def test_family_is_read_from_the_tree_and_a_contradicting_model_is_refused(maxtext_fixtures):
    from maxckpt.errors import UnsupportedModelError

    with open_checkpoint(source(maxtext_fixtures, "gemma2_scan")) as ckpt:
        assert ckpt.spec.family == "gemma2" and ckpt.spec.num_layers == 4
    with open_checkpoint(source(maxtext_fixtures, "gemma2_scan"), model="llama2-7b") as ckpt:
        with pytest.raises(UnsupportedModelError, match="tensors are those of a gemma2 model"):
            _ = ckpt.spec


def test_megatron_and_torchtitan_refuse_the_families_they_cannot_hold_yet(maxtext_fixtures, tmp_path):
    from maxckpt.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="gemma2 cannot be converted to megatron: .*softcapping"):
        convert(source(maxtext_fixtures, "gemma2_scan"), tmp_path / "mc", to="megatron", model="gemma2-2b")
    with pytest.raises(UnsupportedModelError, match="gemma2 cannot be converted to torchtitan: TorchTitan 0.3.0 ships no such model"):
        convert(source(maxtext_fixtures, "gemma2_scan"), tmp_path / "tt", to="torchtitan", model="gemma2-2b")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("megatron_spec", ["te", "local"])
@pytest.mark.parametrize("name,model,settings", FAMILY_FIXTURES[:4], ids=IDS[:4])
def test_maxtext_megatron_maxtext_round_trip_is_bit_exact_for_either_layer_spec(maxtext_fixtures, tmp_path, name, model, settings, megatron_spec):
    """The MoE and MLA families to Megatron with the TE spec's names (the default) or the local spec's, and
    back to MaxText with nothing said: reading finds the spec from the names."""
    from maxckpt.containers.dcp import DcpReader

    convert(source(maxtext_fixtures, name), tmp_path / "mega", to="megatron", model=model, options=MegatronOptions(spec=megatron_spec), source=SourceOptions(overrides=settings))
    names = set(DcpReader(next((tmp_path / "mega").glob("iter_*"))).tensors())
    te_names = {"decoder.layers.pre_mlp_layernorm.weight",  # stacked MoE layers; MLA's fused q norm:
                "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight"}
    assert bool(names & te_names) == (megatron_spec == "te")
    report = convert(tmp_path / "mega", tmp_path / "back", to="maxtext")
    assert report.spec.family == FAMILIES_OF[name]
    assert_same(maxtext_arrays(tmp_path / "back"), maxtext_arrays(source(maxtext_fixtures, name)))


FAMILIES_OF = {"mixtral_moe_scan": "mixtral", "qwen3_moe_scan": "qwen3-moe", "deepseek3_scan": "deepseek3", "gpt_oss_scan": "gpt-oss"}


@pytest.mark.parametrize("name,model,settings", [FAMILY_FIXTURES[2], FAMILY_FIXTURES[3], FAMILY_FIXTURES[5]], ids=["deepseek3", "gpt-oss", "gemma3"])
def test_plain_torch_round_trip_is_bit_exact(maxtext_fixtures, tmp_path, name, model, settings):
    convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model, source=SourceOptions(overrides=settings))
    convert(source(maxtext_fixtures, name), tmp_path / "model.pt", to="torch", model=model, source=SourceOptions(overrides=settings))
    convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", model=model, source=SourceOptions(overrides=settings))
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source(maxtext_fixtures, name)))
    convert(tmp_path / "mt", tmp_path / "sharded", to="torch", model=model, source=SourceOptions(overrides=settings))
    convert(tmp_path / "sharded", tmp_path / "hf2", to="hf", model=model, source=SourceOptions(overrides=settings))
    assert_same(hf_arrays(tmp_path / "hf2"), hf_arrays(tmp_path / "hf"))


def test_cli_converts_and_verifies_a_moe_run_as_users_type_it(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    src = source(maxtext_fixtures, "qwen3_moe_scan")
    code, out, err = run_cli(["convert", src, tmp_path / "hf", "--to", "hf", "--model", "qwen3-30b-a3b",
                              "--set", "num_experts_per_tok=2", "-q"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["verify", src, tmp_path / "hf", "--model", "qwen3-30b-a3b", "--set", "num_experts_per_tok=2"], capsys)
    assert code == 0 and "verify ok" in out, out + err
    code, out, err = run_cli(["convert", src, tmp_path / "hf2", "--to", "hf", "--model", "qwen3-30b-a3b", "-q"], capsys)
    assert code != 0 and "error:" in err and "--set num_experts_per_tok=K" in err
    code, out, err = run_cli(["convert", "--help"], capsys)
    assert "Pairs that are not possible" in out
