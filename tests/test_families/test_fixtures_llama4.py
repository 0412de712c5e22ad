"""llama4 against MaxText 0.2.5's own checkpoint and logits, and against transformers' Llama4ForCausalLM.

The fixture `llama4_scan` (shared/fixtures/README.md, "The remaining MaxText 0.2.5 text families") is a
llama4-17b-16e run at small dims: 4 layers (the last NoPE), every layer MoE (4 experts, top-1, a shared
expert), the L2 q/k norm, llama3-scaled rope. It is converted to HF once, loaded by transformers' own
Llama4ForCausalLM (no missing or unexpected keys) and must give MaxText's logits within 1e-4; maxckpt's
reference forward must too. Round trips give back every array bit for bit, scanned (`decoder/layers/layers_{j}`)
and unscanned. The 17b-128e pattern (dense and MoE layers interleaved, no q/k norm, unscaled rope) has no
MaxText run: a tiny random transformers model of it goes HF -> MaxText -> HF and through the reference forward.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from maxckpt.conversion import convert, open_checkpoint
from maxckpt.formats import MaxTextOptions
from fixture_checks import assert_same, hf_arrays, maxtext_arrays
from fixture_checks import transformers_logits as _transformers_logits

RUN, MODEL = "llama4_scan", "llama4-17b-16e"


def source(root):
    return root / RUN / "checkpoints" / "5" / "items"


def transformers_logits(path, tokens) -> np.ndarray:
    return _transformers_logits(path, tokens, architecture="Llama4ForCausalLM")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The fixture converted once: HF float32, HF bfloat16, unscanned MaxText."""
    from conftest import MAXTEXT_FIXTURES as maxtext_fixtures

    if not maxtext_fixtures.is_dir():
        pytest.skip(f"MaxText fixtures not found at {maxtext_fixtures} (set MAXCKPT_FIXTURES)")
    out = tmp_path_factory.mktemp(RUN)
    src = source(maxtext_fixtures)
    convert(src, out / "hf", to="hf", dtype="float32", model=MODEL)
    convert(src, out / "hf_bf16", to="hf", dtype="bfloat16", model=MODEL)
    convert(src, out / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), model=MODEL)
    return out


def test_converted_hf_model_gives_maxtexts_logits_in_transformers(maxtext_fixtures, converted):
    expected = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5_tokens.npy")
    got = transformers_logits(converted / "hf", tokens)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)  # measured: 1.8e-6


def test_config_json_is_the_text_model_transformers_reads(converted):
    from transformers import AutoConfig

    config = json.loads((converted / "hf" / "config.json").read_text())
    assert config["model_type"] == "llama4_text" and config["architectures"] == ["Llama4ForCausalLM"]
    assert config["no_rope_layers"] == [1, 1, 1, 0] and config["moe_layers"] == [0, 1, 2, 3]
    assert config["layer_types"] == ["chunked_attention"] * 3 + ["full_attention"]
    assert (config["attention_chunk_size"], config["use_qk_norm"], config["attn_temperature_tuning"]) == (8192, True, True)
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"]) == (4, 1, 64)
    assert config["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}
    read = AutoConfig.from_pretrained(converted / "hf")
    assert read.no_rope_layers == [1, 1, 1, 0] and read.layer_types == config["layer_types"]
    names = hf_arrays(converted / "hf")
    assert names["model.layers.0.feed_forward.experts.gate_up_proj"].shape == (4, 64, 128)
    assert names["model.layers.0.feed_forward.experts.down_proj"].shape == (4, 64, 64)
    assert names["model.layers.0.feed_forward.router.weight"].shape == (4, 64)


def test_fused_experts_hold_gate_then_up_as_maxtext_has_them(maxtext_fixtures, converted):
    original = maxtext_arrays(source(maxtext_fixtures))
    hf = hf_arrays(converted / "hf")
    moe = "decoder/layers/layers_2/Llama4MoEBlock_0/MoeBlock_0"
    gate_up = hf["model.layers.2.feed_forward.experts.gate_up_proj"]
    np.testing.assert_array_equal(gate_up[..., :64], original[f"{moe}/wi_0"][:, 0])
    np.testing.assert_array_equal(gate_up[..., 64:], original[f"{moe}/wi_1"][:, 0])
    np.testing.assert_array_equal(hf["model.layers.2.feed_forward.experts.down_proj"], original[f"{moe}/wo"][:, 0])
    # interleaved rope on both sides: q/k rows copied as they are (the query scale is applied at runtime)
    q = original["decoder/layers/layers_1/self_attention/query/kernel"][:, 0]
    np.testing.assert_array_equal(hf["model.layers.1.self_attn.q_proj.weight"], q.reshape(64, -1).T)


def test_maxtext_hf_maxtext_round_trip_is_bit_exact_scanned_and_unscanned(maxtext_fixtures, converted, tmp_path):
    original = maxtext_arrays(source(maxtext_fixtures))
    convert(converted / "hf", tmp_path / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True))
    assert_same(maxtext_arrays(tmp_path / "scanned"), original)
    unscanned = maxtext_arrays(converted / "unscanned")
    assert not any(n.startswith("decoder/layers/") for n in unscanned)
    assert unscanned["decoder/layers_3/Llama4MoEBlock_0/MoeBlock_0/wi_0"].shape == (4, 64, 64)
    convert(converted / "unscanned", tmp_path / "rescanned", to="maxtext", options=MaxTextOptions(scan_layers=True))
    assert_same(maxtext_arrays(tmp_path / "rescanned"), original)
    convert(converted / "unscanned", tmp_path / "hf2", to="hf", dtype="float32")
    assert_same(hf_arrays(tmp_path / "hf2"), hf_arrays(converted / "hf"))


def test_hf_maxtext_hf_round_trip_is_bit_exact_in_bf16(converted, tmp_path):
    from maxckpt.conversion.verify import verify

    first = hf_arrays(converted / "hf_bf16")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    report = convert(converted / "hf_bf16", tmp_path / "mt", to="maxtext")  # everything from config.json alone
    spec = report.spec
    assert spec.family == "llama4" and (spec.nope_layer_interval, spec.qk_l2_norm, spec.routing) == (
        4, True, "sigmoid_input")
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", dtype="bfloat16")
    assert_same(hf_arrays(tmp_path / "hf2"), first)
    assert verify(converted / "hf_bf16", tmp_path / "mt").ok


def test_reference_forward_gives_maxtexts_logits_and_verify_logits_agrees(maxtext_fixtures, converted):
    from maxckpt.conversion.verify import maxtext_params, verify_logits
    from maxckpt.reference import read_maxtext_params, reference_logits

    expected = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5_tokens.npy").tolist()
    with open_checkpoint(source(maxtext_fixtures), model=MODEL) as ckpt:
        np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), expected,
                                   atol=1e-4, rtol=0)  # measured: 2.0e-6
    with open_checkpoint(converted / "unscanned", model=MODEL) as ckpt:
        np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), expected,
                                   atol=1e-4, rtol=0)
    with open_checkpoint(converted / "hf") as hf:  # the HF view, settings from config.json alone
        np.testing.assert_allclose(reference_logits(maxtext_params(hf), hf.spec, tokens), expected, atol=1e-4, rtol=0)
    report = verify_logits(source(maxtext_fixtures), converted / "hf", tokens=tokens, model=MODEL)
    assert report.ok and report.max_abs_diff < 1e-4, report.max_abs_diff


# The fixture run's own MaxText command line (README: `$A` and the table's overrides).
RUN_SETS = dict(base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=2, head_dim=16, vocab_size=256,
                max_target_length=32, base_mlp_dim=96, base_moe_mlp_dim=64, base_num_decoder_layers=4, num_experts=4,
                num_experts_per_tok=1, override_model_config=True)


def test_the_runs_maxtext_keys_settle_what_no_tensor_shows(maxtext_fixtures):
    """True to the run: MaxText's use_qk_norm, chunk_attn_window_size, nope_layer_interval... set the spec; the
    weight-free q/k norm shows only in the logits, and the 128e yml's MoE pattern contradicts the tree."""
    from maxckpt.errors import ShapeMismatchError
    from maxckpt.reference import read_maxtext_params, reference_logits

    expected = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / f"{RUN}_step5_tokens.npy").tolist()
    with open_checkpoint(source(maxtext_fixtures), model=MODEL, overrides=RUN_SETS) as ckpt:
        spec = ckpt.spec
        assert (spec.qk_l2_norm, spec.nope_layer_interval, spec.attention_chunk_size, spec.attn_temperature_tuning,
                spec.layer_cycle_interval, spec.interleave_moe_layer_step) == (True, 4, 8192, True, 4, 1)
    changed = {**RUN_SETS, "use_qk_norm": False, "chunk_attn_window_size": 4, "nope_layer_interval": 2,
               "rope_use_scale": False}
    with open_checkpoint(source(maxtext_fixtures), model=MODEL, overrides=changed) as ckpt:
        spec = ckpt.spec
        assert (spec.qk_l2_norm, spec.attention_chunk_size, spec.nope_layer_interval) == (False, 4, 2)
        assert spec.rope_scaling is None  # LLaMARotaryEmbedding without its llama3 scaling
        got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens)
    assert np.abs(got - expected).max() > 1e-2
    with pytest.raises(ShapeMismatchError, match="interleave_moe_layer_step=2 but the tensor shapes say 1"):
        with open_checkpoint(source(maxtext_fixtures), model="llama4-17b-128e", overrides=RUN_SETS) as ckpt:
            ckpt.spec  # noqa: B018 - the spec is settled on first use


def test_megatron_and_torchtitan_refuse_llama4_with_the_reason(maxtext_fixtures, tmp_path):
    from maxckpt.errors import UnsupportedModelError

    for target, reason in (("megatron", "NoPE layers included, where llama4 has none"), ("torchtitan", "ships no llama4 model")):
        with pytest.raises(UnsupportedModelError, match=f"llama4 cannot be converted to {target}: .*{reason}"):
            convert(source(maxtext_fixtures), tmp_path / target, to=target, model=MODEL)
    assert not list(tmp_path.iterdir())


def test_plain_torch_round_trip_is_bit_exact(maxtext_fixtures, tmp_path):
    """A torch.save file states no head geometry (--set head_dim does); its fused expert names say llama4."""
    from maxckpt.conversion.options import SourceOptions

    convert(source(maxtext_fixtures), tmp_path / "model.pt", to="torch", model=MODEL)
    report = convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext",
                     source=SourceOptions(overrides={"head_dim": 16}))
    assert report.spec.family == "llama4"
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source(maxtext_fixtures)))


@pytest.fixture(scope="module")
def interleaved_hf(tmp_path_factory):
    """A tiny random transformers Llama4ForCausalLM of the 17b-128e pattern: MoE every 2nd layer, dense MLPs
    between (their own width), no q/k norm, unscaled rope, NoPE every 4th layer; chunks of 4 tokens, so the
    rope layers' chunked attention shows in 8 tokens."""
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        vocab_size=128, hidden_size=32, intermediate_size=24, intermediate_size_mlp=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=3, num_experts_per_tok=1,
        interleave_moe_layer_step=2, use_qk_norm=False, attention_chunk_size=4, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():  # every weight non-trivial (norms included), so a misplaced one shows
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    path = tmp_path_factory.mktemp("llama4_128e") / "hf"
    model.save_pretrained(path)
    tokens = np.array([[3, 17, 99, 5, 64, 2, 8, 120]])
    with torch.no_grad():
        logits = model(torch.tensor(tokens)).logits.numpy()
    return path, tokens, logits


def test_interleaved_dense_and_moe_layers_round_trip_and_run_in_the_reference(interleaved_hf, tmp_path):
    from maxckpt.conversion.options import SourceOptions
    from maxckpt.reference import read_maxtext_params, reference_logits

    path, tokens, logits = interleaved_hf
    original = hf_arrays(path)
    assert "model.layers.0.feed_forward.gate_proj.weight" in original
    assert "model.layers.1.feed_forward.experts.gate_up_proj" in original
    report = convert(path, tmp_path / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True))
    spec = report.spec
    assert (spec.interleave_moe_layer_step, spec.mlp_dim, spec.moe_mlp_dim, spec.qk_l2_norm) == (2, 40, 24, False)
    assert spec.attention_chunk_size == 4
    assert spec.rope_scaling is None
    scanned = maxtext_arrays(tmp_path / "scanned")
    assert scanned["decoder/layers/layers_0/mlp/wi_0/kernel"].shape == (32, 1, 40)
    assert scanned["decoder/layers/layers_1/Llama4MoEBlock_0/MoeBlock_0/wi_0"].shape == (3, 1, 32, 24)
    assert not any(n.startswith("decoder/layers/layers_0/Llama4MoEBlock_0") for n in scanned)
    convert(path, tmp_path / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False))
    chunk = {"attention_chunk_size": 4}  # a MaxText tree shows neither chunks nor the q/k norm: preset and --set do
    for mt in ("scanned", "unscanned"):
        with open_checkpoint(tmp_path / mt, model="llama4-17b-128e", overrides=chunk) as ckpt:
            np.testing.assert_allclose(reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens), logits,
                                       atol=1e-4, rtol=0)
        convert(tmp_path / mt, tmp_path / f"hf_{mt}", to="hf", model="llama4-17b-128e",
                source=SourceOptions(overrides=chunk))
        assert_same(hf_arrays(tmp_path / f"hf_{mt}"), original)
    np.testing.assert_allclose(transformers_logits(tmp_path / "hf_unscanned", tokens), logits, atol=1e-5, rtol=0)
    with open_checkpoint(tmp_path / "scanned", model="llama4-17b-128e") as ckpt:  # whole-sequence attention differs
        unchunked = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens)
    assert np.abs(unchunked[:, 4:] - logits[:, 4:]).max() > 1e-2


def test_layer_patterns_maxckpt_cannot_hold_are_refused(converted, tmp_path):
    """A config whose per-layer lists are not a pattern, and a scanned write of layers MaxText would drop."""
    import shutil

    from maxckpt.conversion.options import SourceOptions
    from maxckpt.errors import UnsupportedModelError

    bad = tmp_path / "bad"
    shutil.copytree(converted / "hf", bad)
    config = json.loads((bad / "config.json").read_text())
    config["no_rope_layers"] = [1, 0, 1, 1]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="no_rope_layers"):
        convert(bad, tmp_path / "mt", to="maxtext")
    config["no_rope_layers"], config["floor_scale"] = [1, 1, 1, 0], 4096
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="floor_scale=4096: MaxText's llama4 tunes"):
        convert(bad, tmp_path / "mt", to="maxtext")
    with pytest.raises(UnsupportedModelError, match="whole blocks"):
        convert(converted / "hf", tmp_path / "mt", to="maxtext", options=MaxTextOptions(scan_layers=True),
                source=SourceOptions(overrides={"layer_cycle_interval": 3}))
    assert not (tmp_path / "mt").exists()


def test_the_multimodal_wrappers_text_model_reads_as_the_text_model(maxtext_fixtures, converted, tmp_path):
    """A hub Llama4ForConditionalGeneration: config `llama4` with a text_config, tensors under
    `language_model.` (vision tensors beside them are left out)."""
    from safetensors.numpy import save_file

    text = hf_arrays(converted / "hf")
    wrapped = {f"language_model.{n}": a for n, a in text.items()}
    wrapped["vision_model.patch_embedding.linear.weight"] = np.zeros((8, 4), np.float32)
    (tmp_path / "mm").mkdir()
    save_file(wrapped, str(tmp_path / "mm" / "model.safetensors"))
    text_config = json.loads((converted / "hf" / "config.json").read_text())
    config = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": text_config,
              "vision_config": {"model_type": "llama4_vision_model"}, "tie_word_embeddings": False}
    (tmp_path / "mm" / "config.json").write_text(json.dumps(config))
    report = convert(tmp_path / "mm", tmp_path / "mt", to="maxtext")
    assert report.spec.family == "llama4" and report.spec.nope_layer_interval == 4
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source(maxtext_fixtures)))
