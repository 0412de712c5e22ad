"""The Gated DeltaNet hybrids (qwen3-next, qwen3.5) against MaxText 0.2.5's own checkpoints and logits.

The fixture (shared/fixtures/README.md, "The remaining MaxText 0.2.5 text families") is converted to
HF once, loaded by transformers' own Qwen3Next / Qwen3_5Moe code (its torch fallback for the Gated DeltaNet kernels
on CPU, no missing or unexpected keys) and must give MaxText's logits within 1e-4; maxckpt's reference
forward must too. Round trips through HF and between the scanned (blocks of local_layers + global_layer)
and unscanned layouts give back every array bit for bit (qwen3.5's HF projections are split and regrouped).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.formats import MaxTextOptions
from fixture_checks import assert_same, hf_arrays, maxtext_arrays, transformers_logits

# The run's settings no tensor shows: top-2 of 4 experts, 2 key heads of width 8 (README's $GDN).
QWEN3_NEXT = ("qwen3_next_scan", "qwen3-next-80b-a3b",
              {"num_experts_per_tok": 2, "gdn_num_key_heads": 2, "gdn_key_head_dim": 8})
QWEN3_5 = ("qwen3_5_scan", "qwen3.5-35b-a3b",
           {"num_experts_per_tok": 2, "gdn_num_key_heads": 2, "gdn_key_head_dim": 8, "mrope_section": [2, 1, 1]})
HYBRIDS = {"qwen3-next": QWEN3_NEXT, "qwen3.5": QWEN3_5}


def source(root, name):
    return root / name / "checkpoints" / "5" / "items"


@pytest.fixture(scope="module", params=list(HYBRIDS))
def hybrid(request):
    """(fixture run, --model, --set) of one hybrid family."""
    return HYBRIDS[request.param]


@pytest.fixture(scope="module")
def converted(hybrid, tmp_path_factory):
    """The fixture converted once: HF float32, HF bfloat16, unscanned MaxText."""
    from conftest import MAXTEXT_FIXTURES as maxtext_fixtures

    if not maxtext_fixtures.is_dir():
        pytest.skip(f"MaxText fixtures not found at {maxtext_fixtures} (set MAXCKPT_FIXTURES)")
    name, model, settings = hybrid
    out = tmp_path_factory.mktemp(name)
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    src = source(maxtext_fixtures, name)
    convert(src, out / "hf", to="hf", dtype="float32", **kw)
    convert(src, out / "hf_bf16", to="hf", dtype="bfloat16", **kw)
    convert(src, out / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), **kw)
    return out


def test_converted_hf_model_gives_maxtexts_logits_in_transformers(maxtext_fixtures, hybrid, converted):
    name = hybrid[0]
    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")
    np.testing.assert_allclose(transformers_logits(converted / "hf", tokens), expected, atol=1e-4, rtol=0)


def test_config_json_states_the_hybrid_as_transformers_reads_it(hybrid, converted):
    config = json.loads((converted / "hf" / "config.json").read_text())
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    if hybrid is QWEN3_NEXT:
        assert config["model_type"] == "qwen3_next" and config["architectures"] == ["Qwen3NextForCausalLM"]
    else:  # the text model of the multimodal qwen3_5_moe, with the run's multimodal rope split
        assert config["model_type"] == "qwen3_5_moe_text" and config["architectures"] == ["Qwen3_5MoeForCausalLM"]
        rope.update(mrope_section=[2, 1, 1], mrope_interleaved=True)
    assert config["rope_parameters"] == rope
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert (config["linear_num_key_heads"], config["linear_key_head_dim"]) == (2, 8)
    assert (config["linear_num_value_heads"], config["linear_value_head_dim"], config["linear_conv_kernel_dim"]) == (4, 8, 4)
    assert (config["num_experts"], config["num_experts_per_tok"], config["shared_expert_intermediate_size"]) == (4, 2, 32)


def test_maxtext_hf_maxtext_round_trip_is_bit_exact_scanned_and_unscanned(maxtext_fixtures, hybrid, converted,
                                                                          tmp_path):
    name, model, settings = hybrid
    original = maxtext_arrays(source(maxtext_fixtures, name))
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    convert(converted / "hf", tmp_path / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(tmp_path / "scanned"), original)
    unscanned = maxtext_arrays(converted / "unscanned")
    assert not any(n.startswith("decoder/layers/") for n in unscanned)
    assert "decoder/layers_3/attention/attention/query/kernel" in unscanned
    assert unscanned["decoder/layers_1/attention/conv1d/kernel"].shape == (4, 1, 64)
    convert(converted / "unscanned", tmp_path / "rescanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(tmp_path / "rescanned"), original)
    convert(converted / "unscanned", tmp_path / "hf2", to="hf", dtype="float32", **kw)
    assert_same(hf_arrays(tmp_path / "hf2"), hf_arrays(converted / "hf"))


def test_hf_maxtext_hf_round_trip_is_bit_exact_in_bf16(hybrid, converted, tmp_path):
    from maxckpt.conversion.verify import verify

    first = hf_arrays(converted / "hf_bf16")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    report = convert(converted / "hf_bf16", tmp_path / "mt", to="maxtext")  # everything from config.json alone
    family = "qwen3-next" if hybrid is QWEN3_NEXT else "qwen3.5"
    assert report.spec.family == family and report.spec.gdn_num_key_heads == 2
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", dtype="bfloat16", model=hybrid[1],
            source=SourceOptions(overrides=hybrid[2]))
    assert_same(hf_arrays(tmp_path / "hf2"), first)
    assert verify(converted / "hf_bf16", tmp_path / "mt", model_b=hybrid[1], source=SourceOptions(overrides=hybrid[2])).ok


def test_reference_forward_gives_maxtexts_logits_and_verify_logits_agrees(maxtext_fixtures, hybrid, converted):
    """maxckpt's reference (the recurrent delta rule) on the run and on the HF export, and `verify --logits`."""
    from maxckpt.conversion.verify import maxtext_params, verify_logits
    from maxckpt.reference import read_maxtext_params, reference_logits

    name, model, settings = hybrid
    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy").tolist()
    with open_checkpoint(source(maxtext_fixtures, name), overrides=settings) as ckpt:
        np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), expected,
                                   atol=1e-4, rtol=0)
    with open_checkpoint(converted / "unscanned", model=model, overrides=settings) as ckpt:  # unscanned layers
        np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), expected,
                                   atol=1e-4, rtol=0)
    with open_checkpoint(converted / "hf") as hf:  # the HF view, settings from config.json alone
        np.testing.assert_allclose(reference_logits(maxtext_params(hf), hf.spec, tokens), expected, atol=1e-4, rtol=0)
    report = verify_logits(source(maxtext_fixtures, name), converted / "hf", tokens=tokens, model=model,
                           source=SourceOptions(overrides=settings))
    assert report.ok and report.max_abs_diff < 1e-4, report.max_abs_diff


def test_a_wrong_key_head_split_is_refused_not_converted(maxtext_fixtures, tmp_path):
    """The key heads' count and width show only as a product: the preset's 16 x 128 cannot be these tensors."""
    from maxckpt.errors import MaxckptError

    name, model, _ = QWEN3_NEXT
    with pytest.raises(MaxckptError, match="in_proj_qkvz"):
        convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model,
                source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("family,torchtitan", [("qwen3-next", "ships no qwen3-next model"),
                                               ("qwen3.5", "always builds its vision encoder")])
def test_megatron_and_torchtitan_refuse_the_hybrids_with_the_reason(maxtext_fixtures, tmp_path, family, torchtitan):
    from maxckpt.errors import UnsupportedModelError

    name, model, settings = HYBRIDS[family]
    for target, reason in (("megatron", "does not map its torch_dist layout"), ("torchtitan", torchtitan)):
        with pytest.raises(UnsupportedModelError, match=f"{family} cannot be converted to {target}: .*{reason}"):
            convert(source(maxtext_fixtures, name), tmp_path / target, to=target, model=model,
                    source=SourceOptions(overrides=settings))
    assert not list(tmp_path.iterdir())


def test_plain_torch_round_trip_is_bit_exact(maxtext_fixtures, hybrid, tmp_path):
    name, model, settings = hybrid
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    convert(source(maxtext_fixtures, name), tmp_path / "model.pt", to="torch", **kw)
    convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", **kw)
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source(maxtext_fixtures, name)))


def test_qwen3_5_without_renormalised_routing_is_refused_for_hf(maxtext_fixtures, tmp_path):
    """transformers' Qwen3.5 router always renormalises: a run that does not would export other logits."""
    from maxckpt.errors import ConfigError, UnsupportedModelError

    name, model, settings = QWEN3_5
    with pytest.raises(UnsupportedModelError, match="always renormalises"):
        convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model,
                source=SourceOptions(overrides={**settings, "norm_topk_prob": False}))
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ConfigError, match="gdn_num_key_heads must be a whole number"):
        convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model,
                source=SourceOptions(overrides={**settings, "gdn_num_key_heads": "two"}))


# The fixture runs' own MaxText command lines (README: `$A`, `$GDN` and the table's overrides).
RUN_SETS = {
    "qwen3_next_scan": {"head_dim": 16},
    "qwen3_5_scan": {"head_dim": 32, "mrope_section": [2, 1, 1]},
}


def test_the_runs_own_maxtext_settings_are_enough(maxtext_fixtures, hybrid, converted, tmp_path):
    """True to the run: MaxText's own keys (override_model_config, gdn_*, ...) settle what shapes cannot."""
    name, model, settings = hybrid
    sets = dict(base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=2, vocab_size=256, max_target_length=32,
                base_mlp_dim=32, base_moe_mlp_dim=32, base_num_decoder_layers=4, num_experts=4, num_experts_per_tok=2,
                gdn_key_head_dim=8, gdn_value_head_dim=8, gdn_num_key_heads=2, gdn_num_value_heads=4,
                gdn_chunk_size=16, override_model_config=True, **RUN_SETS[name])
    report = convert(source(maxtext_fixtures, name), tmp_path / "hf", to="hf", model=model, dtype="float32",
                     source=SourceOptions(overrides=sets))
    assert (report.spec.gdn_num_key_heads, report.spec.gdn_key_head_dim, report.spec.num_experts_per_tok) == (2, 8, 2)
    assert_same(hf_arrays(tmp_path / "hf"), hf_arrays(converted / "hf"))
    ours = json.loads((tmp_path / "hf" / "config.json").read_text())
    theirs = json.loads((converted / "hf" / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "linear_num_key_heads", "linear_key_head_dim", "num_experts_per_tok"):
        assert ours[key] == theirs[key], key


def test_a_checkpoint_with_transformers_fused_experts_reads_as_the_per_expert_one(maxtext_fixtures, hybrid,
                                                                                   converted, tmp_path):
    """Hub checkpoints may hold transformers 5's fused experts (gate_up_proj [X, 2M, E], down_proj [X, E, M])."""
    from safetensors.numpy import save_file

    name, model, settings = hybrid
    per_expert = hf_arrays(converted / "hf")
    fused = {n: a for n, a in per_expert.items() if ".experts." not in n}
    for layer in range(4):
        p = f"model.layers.{layer}.mlp.experts"
        fused[f"{p}.gate_up_proj"] = np.stack([np.concatenate([per_expert[f"{p}.{e}.gate_proj.weight"],
                                                               per_expert[f"{p}.{e}.up_proj.weight"]]) for e in range(4)])
        fused[f"{p}.down_proj"] = np.stack([per_expert[f"{p}.{e}.down_proj.weight"] for e in range(4)])
    (tmp_path / "fused").mkdir()
    save_file(fused, str(tmp_path / "fused" / "model.safetensors"))
    (tmp_path / "fused" / "config.json").write_text((converted / "hf" / "config.json").read_text())
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")
    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")
    np.testing.assert_allclose(transformers_logits(tmp_path / "fused", tokens), expected, atol=1e-4, rtol=0)
    convert(tmp_path / "fused", tmp_path / "mt", to="maxtext")  # family, dims and settings from the files alone
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source(maxtext_fixtures, name)))
