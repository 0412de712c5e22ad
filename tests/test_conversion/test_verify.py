"""`maxckpt verify`: tensor-by-tensor through the layouts, and by logits; exit status says the verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter
from maxckpt.conversion import convert
from maxckpt.conversion.verify import max_abs_diff, verify, verify_logits

import transformers  # noqa: F401 - a real dependency: fail, never skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    spec = tiny_spec("llama3.1")
    params = random_maxtext_params(spec)
    run = save_maxtext_run(root / "run", params).parent
    convert(run, root / "hf", to="hf", model="llama3.1")
    # A copy of the HF model with one tensor nudged.
    r = SafetensorsReader(root / "hf")
    w = SafetensorsWriter(root / "bad")
    for name in r.tensors():
        x = r.read(name)
        w.write(name, x + np.float32(1e-3) if name == "model.layers.1.mlp.up_proj.weight" else x)
    w.close()
    (root / "bad" / "config.json").write_bytes((root / "hf" / "config.json").read_bytes())
    return root


def test_identical_models_verify_across_formats(pair):
    report = verify(pair / "run", pair / "hf", model="llama3.1-8b")
    assert report.ok and report.max_abs_diff == 0.0 and len(report.rows) == 21


def test_a_changed_tensor_is_named_and_fails(pair, capsys):
    report = verify(pair / "hf", pair / "bad")
    assert not report.ok
    assert [r.name for r in report.failures] == ["model.layers.1.mlp.up_proj.weight"]
    assert report.failures[0].max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    code, out, err = run_cli(["verify", pair / "hf", pair / "bad"], capsys)
    assert code == 1 and "model.layers.1.mlp.up_proj.weight" in out and "verify failed" in err
    code, out, _ = run_cli(["verify", pair / "hf", pair / "bad", "--atol", "0.01"], capsys)
    assert code == 0 and "verify ok" in out


def test_missing_tensors_fail(pair, tmp_path):
    r = SafetensorsReader(pair / "hf")
    w = SafetensorsWriter(tmp_path / "tied")
    for name in r.tensors():
        if name != "lm_head.weight":
            w.write(name, r.read(name))
    w.close()
    config = json.loads((pair / "hf" / "config.json").read_text())
    (tmp_path / "tied" / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    report = verify(pair / "hf", tmp_path / "tied")
    assert not report.ok and [(r.name, r.problem) for r in report.failures] == [("lm_head.weight", "missing in B")]


def test_logits_of_maxtext_reference_and_transformers_agree(pair, capsys):
    report = verify_logits(pair / "run", pair / "hf", model="llama3.1-8b")
    assert report.ok and report.max_abs_diff < 1e-4 and report.logits_a.shape == (1, 8, 128)
    code, out, _ = run_cli(["verify", "--logits", pair / "run", pair / "hf", "--model", "llama3.1-8b", "--tokens", "3,1,4,1,5"], capsys)
    assert code == 0 and "verify ok" in out


def test_logits_expose_a_wrong_family(pair, capsys):
    # Read as llama3 (rotate-half, no rope scaling) the llama3.1 weights compute other logits.
    code, out, err = run_cli(["verify", "--logits", pair / "run", pair / "hf", "--model", "llama3", "--model-b", "llama3.1"], capsys)
    assert code == 1 and "FAIL" in out


def test_infinities_and_nans_in_the_same_places_are_no_difference():
    a = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
    assert max_abs_diff(a, a.copy()) == 0.0  # inf - inf is NaN, but equal values do not differ
    assert max_abs_diff(a, np.array([1.25, np.inf, -np.inf, np.nan], np.float32)) == 0.25
    assert max_abs_diff(a, np.array([1.0, np.inf, -np.inf, 0.0], np.float32)) == np.inf  # NaN on one side only
    assert max_abs_diff(a, np.array([1.0, 5.0, -np.inf, np.nan], np.float32)) == np.inf
