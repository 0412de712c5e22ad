"""End-to-end conversion MaxText <-> HF on tiny random models of every family, as users run it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conversion_models import FAMILY_NAMES, TOKENS, nest, random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.formats import HFOptions, MaxTextOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.cli.main import main
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.pipeline import write_tensors
from maxckpt.conversion.verify import transformers_logits
from maxckpt.errors import ConversionError
from maxckpt.reference import forward
from maxckpt.tensors import LazyTensor

import transformers
import torch

CASES = [(family, scanned) for family in FAMILY_NAMES for scanned in (True, False)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{'scan' if s else 'noscan'}" for f, s in CASES])
def converted(request, tmp_path_factory):
    """A tiny MaxText run saved by Orbax, converted to HF and back to MaxText."""
    family, scanned = request.param
    root = tmp_path_factory.mktemp(f"{family}-{scanned}")
    spec = tiny_spec(family)
    params = random_maxtext_params(spec, scanned=scanned, seed=len(family))
    run = save_maxtext_run(root / "run", params, step=3, scan_layers=scanned).parent
    to_hf = convert(run, root / "hf", to="hf", model=family)
    to_mt = convert(root / "hf", root / "mt", to="maxtext", options=MaxTextOptions(scan_layers=scanned))
    return SimpleNamespace(family=family, scanned=scanned, spec=spec, params=params, root=root, to_hf=to_hf, to_mt=to_mt)


def test_round_trip_maxtext_hf_maxtext_is_bit_exact(converted):
    r = OrbaxReader(converted.root / "mt")
    stored = {name: r.read(name) for name in r.tensors()}
    assert set(stored) == {"params/params/" + n for n in converted.params}
    for name, array in converted.params.items():
        got = stored["params/params/" + name]
        assert got.dtype == array.dtype and np.array_equal(got, array), name
    assert converted.to_hf.bytes == converted.to_mt.bytes == sum(a.nbytes for a in converted.params.values())
    assert converted.to_mt.spec == converted.spec


def test_hf_output_loads_in_transformers_and_matches_the_reference_logits(converted):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(converted.root / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        hf_logits = model(torch.tensor(TOKENS)).logits.float().numpy()
    ref = forward(converted.params, converted.spec, TOKENS)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(hf_logits, ref, atol=1e-4, rtol=0)
    config = json.loads((converted.root / "hf" / "config.json").read_text())
    generation = json.loads((converted.root / "hf" / "generation_config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == converted.spec.rope_theta
    assert generation["eos_token_id"] == converted.spec.eos_token_id


def test_maxtext_output_restores_with_plain_orbax_and_matches_transformers(converted):
    restored = ocp.PyTreeCheckpointer().restore(converted.root / "mt" / "0" / "items")
    expected = {"params": {"params": nest(converted.params)}}
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    params = {n: np.asarray(a) for n, a in _flat(restored["params"]["params"]).items()}
    with open_checkpoint(converted.root / "hf") as hf:
        hf_logits = transformers_logits(hf, TOKENS)
    np.testing.assert_allclose(forward(params, converted.spec, TOKENS), hf_logits, atol=1e-4, rtol=0)
    meta = json.loads((converted.root / "mt" / "0" / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"] == {"scan_layers": converted.scanned}


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def test_bf16_through_float32_hf_and_back_is_exact(tmp_path):
    spec = tiny_spec("llama3.1")
    params = random_maxtext_params(spec, dtype=ml_dtypes.bfloat16)
    run = save_maxtext_run(tmp_path / "run", params)
    convert(run, tmp_path / "hf32", to="hf", model="llama3.1-8b", dtype="float32")
    assert {i.dtype for i in SafetensorsReader(tmp_path / "hf32").tensors().values()} == {np.dtype(np.float32)}
    assert json.loads((tmp_path / "hf32" / "config.json").read_text())["torch_dtype"] == "float32"
    convert(tmp_path / "hf32", tmp_path / "mt", to="maxtext", dtype="bfloat16")
    r = OrbaxReader(tmp_path / "mt")
    for name, array in params.items():
        assert np.array_equal(r.read("params/params/" + name), array), name


def test_hf_model_from_transformers_converts_to_maxtext_and_back(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        num_hidden_layers=2, vocab_size=100, tie_word_embeddings=True, max_position_embeddings=64, rope_theta=1e6,
    )
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").exists()
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS)).logits.numpy()
    report = convert(tmp_path / "src", tmp_path / "mt", to="maxtext", options=MaxTextOptions(scan_layers=False))
    assert report.source_format == "hf" and report.spec.family == "qwen3" and report.spec.head_dim == 8
    with open_checkpoint(tmp_path / "mt", model="qwen3") as mt:
        from maxckpt.conversion.verify import maxtext_params

        np.testing.assert_allclose(forward(maxtext_params(mt), mt.spec, TOKENS), expected, atol=1e-4, rtol=0)
    convert(tmp_path / "mt", tmp_path / "hf", to="hf", model="qwen3", options=HFOptions(max_shard_size="10KB"))
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 2
    original, back = SafetensorsReader(tmp_path / "src"), SafetensorsReader(tmp_path / "hf")
    for name in back.tensors():
        assert np.array_equal(original.read(name), back.read(name)), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        np.testing.assert_array_equal(reloaded(torch.tensor(TOKENS)).logits.numpy(), expected)


def test_tokenizer_files_are_copied(tmp_path):
    spec = tiny_spec("llama2")
    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(spec))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text('{"version": "1.0"}')
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    convert(run, tmp_path / "hf", to="hf", model="llama2-7b", options=HFOptions(tokenizer=tmp_path / "tok"))
    assert (tmp_path / "hf" / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert (tmp_path / "hf" / "tokenizer_config.json").exists()


def test_existing_destination_is_kept_unless_overwrite(tmp_path):
    spec = tiny_spec("llama2")
    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(spec))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep me")
    with pytest.raises(ConversionError, match="already exists; choose another destination or pass --overwrite"):
        convert(run, tmp_path / "hf", to="hf", model="llama2")
    # --overwrite replaces only a checkpoint (or an empty folder): a folder of other files is refused.
    with pytest.raises(ConversionError, match="neither an empty folder nor a checkpoint maxckpt recognises"):
        convert(run, tmp_path / "hf", to="hf", model="llama2", overwrite=True)
    assert (tmp_path / "hf" / "mine.txt").read_text() == "keep me"
    convert(run, tmp_path / "hf2", to="hf", model="llama2")
    (tmp_path / "hf").rename(tmp_path / "mine")
    (tmp_path / "hf2").rename(tmp_path / "hf")
    (tmp_path / "hf" / "mine.txt").write_text("an earlier export")
    convert(run, tmp_path / "hf", to="hf", model="llama2", overwrite=True)
    assert not (tmp_path / "hf" / "mine.txt").exists() and (tmp_path / "hf" / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine", "run"]  # no .tmp-* or .old-* left behind


def test_overwrite_never_replaces_a_destination_that_holds_the_source(tmp_path):
    spec = tiny_spec("llama2")
    run = save_maxtext_run(tmp_path / "work" / "run", random_maxtext_params(spec))
    for dst in (tmp_path / "work", run):  # a parent of the source, and the source itself
        with pytest.raises(ConversionError, match="holds the source .*; --overwrite would delete it"):
            convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert (run / "0" / "items" / "_METADATA").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_cli_convert_prints_a_summary_and_picks_the_step(tmp_path, capsys):
    spec = tiny_spec("mistral")
    params = random_maxtext_params(spec)
    run = tmp_path / "run"
    save_maxtext_run(run, params, step=1)
    save_maxtext_run(run, {n: a * 2 for n, a in params.items()}, step=2)
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(run), str(tmp_path / "hf"), "--to", "hf", "--model", "mistral-7b", "--step", "1", "--dtype", "bfloat16"])
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    for column in ("tensors", "bytes", "seconds", "MB/s", "peak RSS"):
        assert column in out
    assert "21/21 tensors" in err  # the progress bar counts tensors (and bytes)
    emb = SafetensorsReader(tmp_path / "hf").read("model.embed_tokens.weight")
    assert emb.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(emb, params["token_embedder/embedding"].astype(ml_dtypes.bfloat16))  # step 1, not 2


def test_hf_config_and_settings_state_what_shapes_cannot(tmp_path):
    spec = tiny_spec("llama2")
    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(spec))
    hf_config = tmp_path / "config.json"
    hf_config.write_text(json.dumps({"model_type": "llama", "rope_theta": 250000.0, "bos_token_id": 7, "eos_token_id": [8, 9]}))
    report = convert(run, tmp_path / "hf", to="hf", source=SourceOptions(hf_config=hf_config, overrides={"rms_norm_eps": 1e-6}))
    assert not report.notes  # the family came from the config, not a guess
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_theta": 250000.0, "rope_type": "default"} and config["rope_theta"] == 250000.0
    assert (config["bos_token_id"], config["eos_token_id"], config["rms_norm_eps"]) == (7, [8, 9], 1e-6)


def test_a_piece_of_the_wrong_dtype_is_refused_not_cast(tmp_path):
    pieces = (((0,), lambda: np.zeros(3, np.float32)), ((1,), lambda: np.zeros(3, np.float64)))
    t = LazyTensor("w", (2, 3), np.dtype(np.float32), lambda index: np.zeros((2, 3), np.float32), pieces)
    with pytest.raises(ConversionError, match="tensor w: computed dtype float64, expected float32"):
        write_tensors(SafetensorsWriter(tmp_path, plan=[t.info]), {"w": t})


@pytest.mark.parametrize("head_dim,dtype,rounds", [(128, np.float32, True), (64, np.float32, False),
                                                  (128, ml_dtypes.bfloat16, False)])
def test_a_float32_conversion_whose_query_scale_rounds_says_so(tmp_path, head_dim, dtype, rounds):
    """llama3.1's MaxText query kernel carries sqrt(head_dim): at head_dim 128 that rounds in float32 (a note
    says so, with what a round trip keeps), at 64 it is exact, and a bfloat16 model is widened, so exact."""
    spec = tiny_spec("llama3.1", head_dim=head_dim)
    params = {n: a.astype(dtype) for n, a in random_maxtext_params(spec).items()}
    src = save_maxtext_run(tmp_path / "run", params)
    report = convert(src, tmp_path / "hf", to="hf", model="llama3.1")
    notes = [n for n in report.notes if n.startswith("float32: MaxText and HF differ")]
    assert bool(notes) == rounds, report.notes
    if rounds:
        assert "the query kernels by 11.3137" in notes[0] and "1 ulp" in notes[0]
        back = convert(tmp_path / "hf", tmp_path / "mt", to="maxtext")
        assert any(n.startswith("float32: MaxText and HF differ") for n in back.notes)  # and the other way
