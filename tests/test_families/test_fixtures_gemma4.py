"""Gemma 4 against MaxText 0.2.5's own checkpoints and logits (shared/fixtures/README.md, third batch).

gemma4_scan (gemma4-31b: one scanned block of 5 sliding + 1 full-attention layer, the full one with its own head width and
kv heads and no value kernel) is converted to HF, loaded by transformers' own Gemma4ForCausalLM (no missing or
unexpected keys) and must give MaxText's logits within 1e-4, as must gemma4_moe_scan (gemma4-26b: the dense MLP and
the packed routed experts side by side); so must maxckpt's reference forward, on the run,
on its unscanned form and on the HF export. Round trips are bit-exact. gemma4_scan_rem7 adds a remainder block
whose one layer slides: transformers forces the last layer to full attention, so its HF export is refused,
while MaxText <-> plain torch and scanned <-> unscanned stay exact and the reference still gives MaxText's
logits. gemma4_e2b_unscan_a (gemma4-e2b: per-layer inputs, KV-shared double-wide layers, unscanned) is refused
for HF for the same reason; a tiny transformers model with its features and a full last layer checks the HF
side. MaxText computes tied logits against a bfloat16 copy of the table (README: attend_on_embedding), so
transformers' comparison rounds its output table alike and the reference runs with attend_in_bf16.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.errors import UnsupportedModelError
from maxckpt.formats import MaxTextOptions
from fixture_checks import assert_same, hf_arrays, maxtext_arrays
from fixture_checks import transformers_logits as _transformers_logits

# (fixture run, --model, --set: what no tensor shows, the run's top-k), measured max |logits - MaxText's|
DENSE = ("gemma4_scan", "gemma4-31b", {})
MOE = ("gemma4_moe_scan", "gemma4-26b", {"num_experts_per_tok": 2})
VARIANTS = {"dense": DENSE, "moe": MOE}
REM7 = ("gemma4_scan_rem7", "gemma4-31b", {})


def source(root, name):
    return root / name / "checkpoints" / "5" / "items"


def expected(root, name):
    logits = np.load(root / "logits" / f"{name}_step5.npy")
    return logits, np.load(root / "logits" / f"{name}_step5_tokens.npy")


def transformers_logits(path, tokens) -> np.ndarray:
    """MaxText's attend_on_embedding: the tied output product uses a bfloat16 table."""
    return _transformers_logits(path, tokens, bf16_output_table=True)


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
    return VARIANTS[request.param]


@pytest.fixture(scope="module")
def dense(variant, tmp_path_factory):
    """The variant's run converted once: HF float32, HF bfloat16, unscanned MaxText."""
    from conftest import MAXTEXT_FIXTURES as root

    if not root.is_dir():
        pytest.skip(f"MaxText fixtures not found at {root} (set MAXCKPT_FIXTURES)")
    name, model, settings = variant
    out = tmp_path_factory.mktemp(name)
    src = source(root, name)
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    convert(src, out / "hf", to="hf", dtype="float32", **kw)
    convert(src, out / "hf_bf16", to="hf", dtype="bfloat16", **kw)
    convert(src, out / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), **kw)
    return out


def test_hf_export_gives_maxtexts_logits_in_transformers(maxtext_fixtures, variant, dense):
    want, tokens = expected(maxtext_fixtures, variant[0])
    got = transformers_logits(dense / "hf", tokens)
    assert np.abs(got - want).max() < 1e-4  # measured 1.1e-5 (dense), 4.5e-6 (moe)


def test_config_json_states_the_per_layer_geometry(variant, dense):
    config = json.loads((dense / "hf" / "config.json").read_text())
    assert config["model_type"] == "gemma4_text" and config["architectures"] == ["Gemma4ForCausalLM"]
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (config["head_dim"], config["num_key_value_heads"]) == (16, 2)
    assert (config["global_head_dim"], config["num_global_key_value_heads"], config["attention_k_eq_v"]) == (32, 1, True)
    assert config["rope_parameters"] == {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert (config["sliding_window"], config["final_logit_softcapping"], config["tie_word_embeddings"]) == (1024, 30.0, True)
    assert config["hidden_size_per_layer_input"] == 0 and config["enable_moe_block"] is (variant is MOE)
    names = hf_arrays(dense / "hf")
    if variant is MOE:  # transformers' packed experts beside the dense MLP
        assert (config["num_experts"], config["top_k_experts"], config["moe_intermediate_size"]) == (4, 2, 32)
        assert config["intermediate_size"] == 64 and names["model.layers.0.mlp.gate_proj.weight"].shape == (64, 64)
        assert names["model.layers.0.experts.gate_up_proj"].shape == (4, 64, 64)
        assert names["model.layers.0.experts.down_proj"].shape == (4, 64, 32)
        assert names["model.layers.0.router.per_expert_scale"].shape == (4,)
    assert "model.layers.5.self_attn.v_proj.weight" not in names and names["model.layers.5.layer_scalar"].shape == (1,)
    assert names["model.layers.5.self_attn.k_proj.weight"].shape == (32, 64)


def test_round_trips_are_bit_exact(maxtext_fixtures, variant, dense, tmp_path):
    from maxckpt.conversion.verify import verify

    name, model, settings = variant
    kw = {"model": model, "source": SourceOptions(overrides=settings)}
    original = maxtext_arrays(source(maxtext_fixtures, name))
    convert(dense / "hf", tmp_path / "scanned", to="maxtext", **kw)
    assert_same(maxtext_arrays(tmp_path / "scanned"), original)
    unscanned = maxtext_arrays(dense / "unscanned")
    assert "decoder/layers_5/self_attention/value/kernel" not in unscanned
    assert unscanned["decoder/layers_5/self_attention/key/kernel"].shape == (64, 1, 32)
    convert(dense / "unscanned", tmp_path / "rescanned", to="maxtext", **kw)
    assert_same(maxtext_arrays(tmp_path / "rescanned"), original)
    # HF -> MaxText -> HF in bfloat16, everything from config.json alone
    first = hf_arrays(dense / "hf_bf16")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    report = convert(dense / "hf_bf16", tmp_path / "mt", to="maxtext")
    assert (report.spec.family, report.spec.global_head_dim, report.spec.global_partial_rotary_factor) == (
        "gemma4-moe" if variant is MOE else "gemma4", 32, 0.25)
    assert report.spec.num_experts_per_tok == (2 if variant is MOE else 0)
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", dtype="bfloat16", **kw)
    assert_same(hf_arrays(tmp_path / "hf2"), first)
    assert verify(dense / "hf_bf16", tmp_path / "mt", model_b=model, source=SourceOptions(overrides=settings)).ok


def test_reference_forward_and_verify_logits(maxtext_fixtures, variant, dense):
    from maxckpt.conversion.verify import maxtext_params, verify_logits
    from maxckpt.reference import read_maxtext_params, reference_logits

    name, model, settings = variant
    want, tokens = expected(maxtext_fixtures, name)
    tokens = tokens.tolist()
    for path in (source(maxtext_fixtures, name), dense / "unscanned"):
        with open_checkpoint(path, model=model, overrides=settings) as ckpt:
            got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens, attend_in_bf16=True)
            assert np.abs(got - want).max() < 1e-4  # measured 4.7e-6 (dense), 4.3e-6 (moe)
    with open_checkpoint(dense / "hf") as hf:
        got = reference_logits(maxtext_params(hf), hf.spec, tokens, attend_in_bf16=True)
        assert np.abs(got - want).max() < 1e-4
    report = verify_logits(source(maxtext_fixtures, name), dense / "hf", tokens=tokens, model=model,
                           source=SourceOptions(overrides=settings))
    assert report.ok and report.max_abs_diff < 1e-4, report.max_abs_diff


def test_transformers_forces_the_last_layer_to_full_attention():
    """Why rem7's HF export is refused: transformers' own config rewrites a sliding last layer."""
    import transformers
    config = transformers.Gemma4TextConfig(num_hidden_layers=7, layer_types=["sliding_attention"] * 5 + [
        "full_attention", "sliding_attention"])
    assert config.layer_types[-1] == "full_attention"


def test_remainder_block_hf_export_is_refused_but_maxtext_and_torch_are_exact(maxtext_fixtures, tmp_path):
    from maxckpt.reference import read_maxtext_params, reference_logits

    name, model, _ = REM7
    src = source(maxtext_fixtures, name)
    with pytest.raises(UnsupportedModelError, match="transformers makes the last layer full attention.*layer 6"):
        convert(src, tmp_path / "hf", to="hf", model=model)
    assert not (tmp_path / "hf").exists()
    original = maxtext_arrays(src)
    assert original["decoder/layers_remainder/local_layers/self_attention/value/kernel"].shape == (64, 1, 2, 16)
    convert(src, tmp_path / "model.pt", to="torch", model=model)
    convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", model=model)
    assert_same(maxtext_arrays(tmp_path / "mt"), original)
    convert(src, tmp_path / "un", to="maxtext", options=MaxTextOptions(scan_layers=False), model=model)
    convert(tmp_path / "un", tmp_path / "re", to="maxtext", model=model)
    assert_same(maxtext_arrays(tmp_path / "re"), original)
    want, tokens = expected(maxtext_fixtures, name)
    with open_checkpoint(src, model=model) as ckpt:
        got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens.tolist(), attend_in_bf16=True)
        assert np.abs(got - want).max() < 1e-4  # measured 6.3e-6


@pytest.mark.parametrize("which", ["dense", "moe", "e2b"])
def test_megatron_and_torchtitan_refuse_gemma4_with_the_reason(maxtext_fixtures, tmp_path, which):
    name, model, settings = {**VARIANTS, "e2b": E2B}[which]
    family = {"dense": "gemma4", "moe": "gemma4-moe", "e2b": "gemma4-small"}[which]
    for target, reason in (("megatron", "ships no Gemma 4 model"), ("torchtitan", "ships no such model")):
        with pytest.raises(UnsupportedModelError, match=f"{family} cannot be converted to {target}: .*{reason}"):
            convert(source(maxtext_fixtures, name), tmp_path / target, to=target, model=model,
                    source=SourceOptions(overrides=settings))
    assert not list(tmp_path.iterdir())


E2B = ("gemma4_e2b_unscan_a", "gemma4-e2b", {})


def test_e2b_hf_export_is_refused_but_torch_round_trip_and_reference_are_exact(maxtext_fixtures, tmp_path):
    """e2b's 7 layers (4 sliding + 1 full, then 2 KV-shared sliding ones): the last slides, so no HF export."""
    from maxckpt.reference import read_maxtext_params, reference_logits

    name, model, _ = E2B
    src = source(maxtext_fixtures, name)
    with pytest.raises(UnsupportedModelError, match="transformers makes the last layer full attention.*layer 6"):
        convert(src, tmp_path / "hf", to="hf", model=model)
    report = convert(src, tmp_path / "model.pt", to="torch", model=model)
    spec = report.spec
    assert (spec.family, spec.sliding_window_pattern, spec.global_head_dim, spec.global_k_eq_v) == (
        "gemma4-small", 5, 32, False)
    assert (spec.per_layer_input_dim, spec.per_layer_vocab_size, spec.num_kv_shared_layers, spec.double_wide_mlp) == (
        8, 256, 2, True)
    with pytest.raises(UnsupportedModelError, match="unscanned only"):
        convert(tmp_path / "model.pt", tmp_path / "scanned", to="maxtext", model=model)
    convert(tmp_path / "model.pt", tmp_path / "mt", to="maxtext", model=model,
            options=MaxTextOptions(scan_layers=False))
    original = maxtext_arrays(src)
    assert "decoder/layers_5/self_attention/key/kernel" not in original
    assert original["decoder/layers_5/mlp/wi_0/kernel"].shape == (64, 128)  # double-wide on KV-shared layers
    assert_same(maxtext_arrays(tmp_path / "mt"), original)
    want, tokens = expected(maxtext_fixtures, name)
    with open_checkpoint(src, model=model) as ckpt:
        got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens.tolist(), attend_in_bf16=True)
        assert np.abs(got - want).max() < 1e-4  # measured 9.5e-6


def test_e2b_shaped_hf_model_round_trips_and_the_reference_gives_transformers_logits(tmp_path):
    """A tiny transformers Gemma 4 with e2b's features whose last layer is full (10 layers, pattern 5, the last 2
    KV-shared and double-wide, per-layer inputs): HF -> MaxText -> HF bit-exact, the reference forward on the
    MaxText side gives transformers' logits, and transformers loads the re-export with the same logits."""
    import torch
    import transformers
    from maxckpt.reference import read_maxtext_params, reference_logits

    torch.manual_seed(0)
    layers = 10
    config = transformers.Gemma4TextConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, global_head_dim=16, sliding_window=512, final_logit_softcapping=30.0,
        layer_types=["full_attention" if i % 5 == 4 else "sliding_attention" for i in range(layers)],
        hidden_size_per_layer_input=4, vocab_size_per_layer_input=128, num_kv_shared_layers=2,
        use_double_wide_mlp=True, attention_k_eq_v=False, tie_word_embeddings=True)
    model = transformers.Gemma4ForCausalLM(config).eval()
    with torch.no_grad():  # move every weight off its initial value, the layer scalars too
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(1 + 0.1 * torch.randn_like(b))
    model.save_pretrained(tmp_path / "hf")
    tokens = [[3, 17, 99, 5, 60, 2, 41, 7]]
    with torch.no_grad():
        want = model(torch.tensor(tokens)).logits.numpy()
    report = convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", options=MaxTextOptions(scan_layers=False))
    spec = report.spec
    assert (spec.family, spec.sliding_window_pattern, spec.num_kv_shared_layers, spec.per_layer_input_dim) == (
        "gemma4-small", 5, 2, 4)
    with open_checkpoint(tmp_path / "mt", model="gemma4-e2b") as ckpt:
        got = reference_logits(read_maxtext_params(ckpt), ckpt.spec, tokens)
    assert np.abs(got - want).max() < 1e-4  # measured 1.1e-6
    convert(tmp_path / "mt", tmp_path / "hf2", to="hf", model="gemma4-e2b")
    assert_same(hf_arrays(tmp_path / "hf2"), hf_arrays(tmp_path / "hf"))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf2", dtype=torch.float32).eval()
    with torch.no_grad():
        assert np.array_equal(again(torch.tensor(tokens)).logits.numpy(), want)


@pytest.mark.parametrize("family,experts", [("gemma4", 0), ("gemma4-moe", 3)])
def test_several_blocks_and_a_remainder_stack_block_major_and_round_trip(family, experts):
    """13 layers: 2 scanned blocks (local_layers [.., block, position, ..]) and a remainder of one; every HF layer
    lands where MaxText's scan puts it and comes back bit-exact, scanned and unscanned."""
    import dataclasses

    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES
    from maxckpt.formats.hf import layout as hfl
    from maxckpt.formats.maxtext.layout import MaxTextLayout
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import LazyTensor

    values = {k: v for k, v in family_defaults(FAMILIES[family]).items() if k != "qk_norm"}
    spec = ModelSpec(family, 13, 16, 2, 2, 4, 24, 32, qk_norm=True, tie_word_embeddings=True, **values)
    spec = dataclasses.replace(spec, global_head_dim=8, global_num_kv_heads=1, num_experts=experts,
                               num_experts_per_tok=2 if experts else 0, moe_mlp_dim=6 if experts else 0)
    rng = np.random.default_rng(0)
    hf = {n: rng.standard_normal(s).astype(np.float32) for n, s in hfl.expected_tensors(spec).items()}
    assert "model.layers.11.self_attn.v_proj.weight" not in hf and hf["model.layers.11.self_attn.k_proj.weight"].shape == (8, 16)
    lazies = {n: LazyTensor.from_array(n, a) for n, a in hf.items()}
    for scanned in (True, False):
        mt = {n[len("params/params/"):]: t.read() for n, t in MaxTextLayout(scan_layers=scanned).from_hf(lazies, spec).items()}
        if scanned:
            query = mt["decoder/scanned_blocks/local_layers/self_attention/query/kernel"]  # [E, blocks, 5, H, D]
            assert query.shape == (16, 2, 5, 2, 4)
            for b in range(2):
                for j in range(5):
                    assert np.array_equal(query[:, b, j].reshape(16, -1).T, hf[f"model.layers.{b * 6 + j}.self_attn.q_proj.weight"])
            glob = mt["decoder/scanned_blocks/global_layer/self_attention/key/kernel"]
            assert glob.shape == (16, 2, 1, 8)
            assert np.array_equal(glob[:, 1].reshape(16, -1).T, hf["model.layers.11.self_attn.k_proj.weight"])
            assert mt["decoder/layers_remainder/local_layers/layer_scalar"].shape == (1, 1)
            if experts:
                packed = mt["decoder/scanned_blocks/global_layer/mlp/moe_block/MoeBlock_0/wi_1"]  # [X, blocks, E, M]
                assert np.array_equal(packed[:, 1].transpose(0, 2, 1), hf["model.layers.11.experts.gate_up_proj"][:, 6:])
        back = MaxTextLayout().to_hf({n: LazyTensor.from_array(n, a) for n, a in mt.items()}, spec)
        assert sorted(back) == sorted(hf)
        for n, a in hf.items():
            assert np.array_equal(back[n].read(), a), (scanned, n)


def test_the_text_model_of_a_multimodal_gemma4_checkpoint_reads_alike(variant, dense, tmp_path):
    """Hub Gemma 4 checkpoints are Gemma4ForConditionalGeneration: `model.language_model.*` names and the text
    settings under `text_config`; maxckpt reads the same MaxText model from them, family and settings included."""
    from safetensors.numpy import save_file

    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    hf = hf_arrays(dense / "hf")
    save_file({"model.language_model." + n[len("model."):]: a for n, a in hf.items()}, str(wrapped / "model.safetensors"))
    text = json.loads((dense / "hf" / "config.json").read_text())
    text.pop("maxckpt_assumed_settings", None)
    (wrapped / "config.json").write_text(json.dumps(
        {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text}))
    report = convert(wrapped, tmp_path / "mt", to="maxtext")
    assert report.spec.family == ("gemma4-moe" if variant is MOE else "gemma4")
    assert_same(maxtext_arrays(tmp_path / "mt"), maxtext_arrays(source_of(variant)))


def source_of(variant):
    from conftest import MAXTEXT_FIXTURES as root

    return source(root, variant[0])


_A = dict(base_emb_dim=64, base_num_query_heads=4, base_num_kv_heads=2, head_dim=16, vocab_size=256,
          max_target_length=32, override_model_config=True)
RUN_SETS = {  # each run's MaxText overrides (shared/fixtures/README.md, third batch)
    "gemma4_scan": dict(_A, base_mlp_dim=64, base_num_decoder_layers=6, global_head_dim=32, global_num_kv_heads=1),
    "gemma4_moe_scan": dict(_A, base_mlp_dim=64, base_moe_mlp_dim=32, base_num_decoder_layers=6, global_head_dim=32,
                            global_num_kv_heads=1, num_experts=4, num_experts_per_tok=2),
    "gemma4_e2b_unscan_a": dict(_A, base_num_kv_heads=1, base_mlp_dim=64, base_num_decoder_layers=7, global_head_dim=32,
                                hidden_size_per_layer_input=8, vocab_size_per_layer_input=256, num_kv_shared_layers=2,
                                scan_layers=False),
}


@pytest.mark.parametrize("name,model", [(DENSE[0], DENSE[1]), (MOE[0], MOE[1]), (E2B[0], E2B[1])])
def test_the_runs_own_maxtext_settings_are_enough(maxtext_fixtures, tmp_path, name, model):
    """True to the run: MaxText's own keys (override_model_config, global_head_dim, hidden_size_per_layer_input,
    num_experts_per_tok, ...) are accepted and agree with the shapes."""
    report = convert(source(maxtext_fixtures, name), tmp_path / "model.pt", to="torch", model=model,
                     source=SourceOptions(overrides=RUN_SETS[name]))
    spec = report.spec
    assert (spec.global_head_dim, spec.max_position_embeddings, spec.global_partial_rotary_factor) == (32, 32, 0.25)
    assert spec.num_experts_per_tok == (2 if name == MOE[0] else 0)
    assert (spec.per_layer_input_dim, spec.num_kv_shared_layers) == ((8, 2) if name == E2B[0] else (0, 0))
