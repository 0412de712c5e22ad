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

import ml_dtypes
import numpy as np
import pytest
from conftest import MAXTEXT_FIXTURES

from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.verify import maxtext_params, verify, verify_logits
from maxckpt.errors import UnsupportedModelError
from maxckpt.families import FAMILIES
from maxckpt.formats import MaxTextOptions
from maxckpt.formats.maxtext.layout import canonical_names
from maxckpt.reference import reference_logits

# (fixture, --model, family)
RUNS = [("gemma_scan", "gemma-2b", "gemma")]
IDS = [r[0] for r in RUNS]


def items(name):
    return MAXTEXT_FIXTURES / name / "checkpoints" / "5" / "items"


def maxtext_arrays(path) -> dict[str, np.ndarray]:
    with open_checkpoint(path, format="maxtext") as ckpt:
        lazies = ckpt.lazy_tensors()
        return {canon: lazies[stored].read() for canon, stored in canonical_names(lazies).items()}


def hf_arrays(path) -> dict[str, np.ndarray]:
    reader = SafetensorsReader(path)
    return {n: reader.read(n) for n in reader.tensors()}


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for n in want:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
        assert np.array_equal(got[n].view(np.uint8), want[n].view(np.uint8)), n


def transformers_logits(path, tokens, bf16_output_table: bool = False):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    if bf16_output_table:  # MaxText's attend_on_embedding: the tied output product uses a bf16 table
        table = model.get_input_embeddings().weight.detach().to(torch.bfloat16).float().clone()
        model.lm_head.weight = torch.nn.Parameter(table)
    with torch.no_grad():
        return model.eval()(torch.tensor(np.asarray(tokens, np.int64))).logits.numpy()


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
    root, kw = run["root"], {"model": run["model"]}
    original = maxtext_arrays(items(run["name"]))
    convert(run["hf"], root / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(root / "scanned"), original)
    convert(items(run["name"]), root / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), **kw)
    unscanned = maxtext_arrays(root / "unscanned")
    assert not any(n.startswith("decoder/layers/") for n in unscanned) and "decoder/layers_1/mlp/wo/kernel" in unscanned
    convert(root / "unscanned", root / "rescanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(root / "rescanned"), original)
    convert(root / "unscanned", root / "hf2", to="hf", dtype="float32", **kw)
    assert_same(hf_arrays(root / "hf2"), hf_arrays(run["hf"]))


def test_hf_maxtext_hf_is_bit_exact_in_bf16(run):
    root = run["root"]
    convert(items(run["name"]), root / "hf16", to="hf", model=run["model"], dtype="bfloat16")
    first = hf_arrays(root / "hf16")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    report = convert(root / "hf16", root / "mt16", to="maxtext")  # family and settings from config.json alone
    assert report.spec.family == run["family"]
    convert(root / "mt16", root / "hf16b", to="hf", model=run["model"], dtype="bfloat16")
    assert_same(hf_arrays(root / "hf16b"), first)
    assert verify(root / "hf16", root / "mt16", model_b=run["model"]).ok


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_the_frameworks_that_cannot_express_the_family_refuse_it_with_its_reason(run, fmt, tmp_path):
    reason = FAMILIES[run["family"]].bridge_gaps[fmt]
    with pytest.raises(UnsupportedModelError, match=f"cannot be converted to {fmt}"):
        convert(items(run["name"]), tmp_path / "out", to=fmt, model=run["model"])
    assert not (tmp_path / "out").exists()
    assert reason


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
