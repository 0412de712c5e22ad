"""Ground truth: checkpoints MaxText wrote, the logits MaxText computed, and MaxText's own HF export.

These tests settle the family facts in maxckpt/families/:
llama2 and mistral use rotate-half rotary, llama3.1 interleaved pairs with
llama3 frequency scaling; llama/mistral query kernels carry 1/sqrt(head_dim),
qwen3's do not (MaxText scales qwen3 queries at runtime, after the q/k norms).
"""

from __future__ import annotations

import numpy as np
import pytest

from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.verify import transformers_logits, verify
from maxckpt.conversion.verify import maxtext_params
from maxckpt.reference import forward

from logit_fixtures import FIXTURES  # shared with the --to torch tests
IDS = [f[1] for f in FIXTURES]


def maxtext_logits(root, stem):
    return np.load(root / "logits" / f"{stem}.npy"), np.load(root / "logits" / f"{stem}_tokens.npy")


@pytest.mark.parametrize("path,stem,model", FIXTURES, ids=IDS)
def test_reference_forward_reproduces_maxtexts_logits(maxtext_fixtures, path, stem, model):
    expected, tokens = maxtext_logits(maxtext_fixtures, stem)
    with open_checkpoint(maxtext_fixtures / path, model=model) as ckpt:
        # MaxText's tied logits use a bfloat16 copy of the embedding (attend_on_embedding).
        logits = forward(maxtext_params(ckpt), ckpt.spec, tokens, attend_in_bf16=True)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("path,stem,model", FIXTURES, ids=IDS)
def test_converted_hf_model_reproduces_maxtexts_logits_in_transformers(maxtext_fixtures, tmp_path, path, stem, model):
    import transformers  # noqa: F401 - a real dependency: fail, never skip
    expected, tokens = maxtext_logits(maxtext_fixtures, stem)
    convert(maxtext_fixtures / path, tmp_path / "hf", to="hf", model=model, dtype="float32")
    with open_checkpoint(tmp_path / "hf") as hf:
        logits = transformers_logits(hf, tokens)
    # qwen3 is tied: MaxText's logits carry its bfloat16 embedding copy (~1e-3 relative); transformers' do not.
    atol = 2e-3 * np.abs(expected).max() if model.startswith("qwen3") else 1e-4
    np.testing.assert_allclose(logits, expected, atol=atol, rtol=0)


def test_our_export_equals_maxtexts_own_hf_export(maxtext_fixtures, tmp_path):
    theirs = maxtext_fixtures / "hf_by_maxtext" / "llama31_from_params"
    convert(maxtext_fixtures / "llama31_scan_params/checkpoints/0", tmp_path / "ours", to="hf", model="llama3.1-8b", dtype="float32")
    ours_r, theirs_r = SafetensorsReader(tmp_path / "ours"), SafetensorsReader(theirs)
    assert set(ours_r.tensors()) == set(theirs_r.tensors())
    for name in theirs_r.tensors():
        assert np.array_equal(ours_r.read(name), theirs_r.read(name)), name
    assert verify(tmp_path / "ours", theirs).ok


def test_maxtexts_hf_export_converts_back_to_the_original_params(maxtext_fixtures, tmp_path):
    convert(maxtext_fixtures / "hf_by_maxtext" / "llama31_from_params", tmp_path / "mt", to="maxtext", dtype="bfloat16")
    with open_checkpoint(maxtext_fixtures / "llama31_scan_params/checkpoints/0", model="llama3.1") as original, \
            open_checkpoint(tmp_path / "mt", model="llama3.1") as back:
        a, b = maxtext_params(original), maxtext_params(back)
    assert set(a) == set(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_a_training_checkpoint_ignores_optimizer_and_rng_state(maxtext_fixtures, tmp_path):
    report = convert(maxtext_fixtures / "llama2_scan", tmp_path / "hf", to="hf", model="llama2")
    assert report.tensors == 21  # params only: no opt_state, nnx_aux or step
    assert report.bytes == sum(i.nbytes for i in SafetensorsReader(tmp_path / "hf").tensors().values())
