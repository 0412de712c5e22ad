"""Conversions through the PyTorch formats: Megatron `torch_dist`, TorchTitan DCP and plain torch.

Round trips start from tiny random MaxText runs saved by Orbax itself; the
hand-off tests start from tiny transformers models and end in stock
`torch.distributed.checkpoint.load`, an independent recomputation of the HF
tensors, and the reference forwards of tests/torch_reference.py.

Head dims are 4 and 16: their square roots (2 and 4) are powers of two, so
MaxText's folded 1/sqrt(head_dim) query scaling is multiplied out and back in
exactly and MaxText round trips are bit-exact. (With head_dim 128 they are not:
about 15% of the query values move by one ulp, see docs/conversion.md.)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from logit_fixtures import FIXTURES
from torch_reference import (
    hf_arrays,
    hf_logits,
    megatron_forward,
    megatron_shapes,
    spec_of,
    tiny_hf_model,
    torchtitan_forward,
    torchtitan_shapes,
)
from maxckpt.formats import MegatronOptions, TorchTitanOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.cli.main import main
from maxckpt.containers.dcp import DcpReader
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.containers.torch_file import TorchFileReader
from maxckpt.conversion import convert, open_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore")

# family, query heads, kv heads (groups), head_dim, tied, vocab, dtype, Megatron/TorchTitan options
CASES = [
    ("llama3.1", 4, 2, 16, False, 250, np.float32, {}),  # GQA, interleaved MaxText rotary, vocab padded to 256
    ("llama2", 8, 2, 4, False, 128, ml_dtypes.bfloat16,
     {"megatron": MegatronOptions(spec="local", make_vocab_size_divisible_by=1),
      "torchtitan": TorchTitanOptions(keys="classic")}),  # 4 heads per group
    ("mistral", 4, 4, 16, False, 128, np.float32, {}),  # MHA
    ("qwen3", 4, 1, 16, True, 200, np.float32, {"megatron": MegatronOptions(make_vocab_size_divisible_by=64)}),  # MQA, q/k norms, tied
]
IDS = [c[0] for c in CASES]


def stock_load(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP dir through stock torch: FileSystemReader metadata, then dcp.load (no process group)."""
    md = dcp.FileSystemReader(str(directory)).read_metadata()
    state = {
        name: torch.empty(tuple(item.size), dtype=item.properties.dtype)
        for name, item in md.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }
    dcp.load(state, checkpoint_id=str(directory))
    return state


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    md = dcp.FileSystemReader(str(directory)).read_metadata()
    return {n: tuple(i.size) for n, i in md.state_dict_metadata.items() if isinstance(i, TensorStorageMetadata)}


# ---------------------------------------------------------------- round trips


@pytest.fixture(scope="module", params=IDS)
def round_trip(request, tmp_path_factory):
    """A MaxText run (checkpoint 4, train step 5) converted to each PyTorch format and back to MaxText."""
    family, heads, groups, head_dim, tied, vocab, dtype, opts = CASES[IDS.index(request.param)]
    root = tmp_path_factory.mktemp(family)
    spec = dataclasses.replace(
        tiny_spec(family, tied=tied, vocab=vocab), num_heads=heads, num_kv_heads=groups, head_dim=head_dim
    )
    params = random_maxtext_params(spec, dtype=dtype, seed=heads + groups)
    run = save_maxtext_run(root / "run", params, step=4).parent
    reports, back = {}, {}
    for target, dst in (("megatron", "mega"), ("torchtitan", "titan"), ("torch", "torch-dir")):
        reports[target] = convert(run, root / dst, to=target, model=family, options=opts.get(target))
        # No --model on the way back: the family travels with the output.
        back[target] = convert(root / dst, root / f"{dst}-mt", to="maxtext")
    return SimpleNamespace(spec=spec, params=params, root=root, run=run, reports=reports, back=back, opts=opts)


def test_maxtext_round_trips_through_each_pytorch_format_are_bit_exact(round_trip):
    for target, dst in (("megatron", "mega"), ("torchtitan", "titan"), ("torch", "torch-dir")):
        assert round_trip.reports[target].target_format == target
        assert round_trip.back[target].source_format == target
        assert round_trip.back[target].spec == round_trip.spec, target
        reader = OrbaxReader(round_trip.root / f"{dst}-mt")
        assert set(reader.tensors()) == {"params/params/" + n for n in round_trip.params}
        for name, array in round_trip.params.items():
            got = reader.read("params/params/" + name)
            assert got.dtype == array.dtype and np.array_equal(got, array), (target, name)


def test_megatron_and_torchtitan_outputs_record_the_training_step(round_trip):
    # MaxText checkpoint 4 holds step 5 (completed updates), as Megatron's iteration and TorchTitan's step count.
    assert round_trip.reports["megatron"].step == 5 and round_trip.reports["torchtitan"].step == 5
    mega = round_trip.root / "mega"
    assert (mega / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert json.loads((mega / "iter_0000005" / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    objects = DcpReader(mega / "iter_0000005").objects()
    te = round_trip.opts.get("megatron", MegatronOptions()).spec == "te"
    assert ("decoder.layers.self_attention.core_attention._extra_state/shard_0_2" in objects) == te
    assert "decoder.layers.mlp.linear_fc2._extra_state/shard_1_2" in objects
    titan = DcpReader(round_trip.root / "titan" / "step-5")
    assert titan.read_object("train_state.step") == 5 and titan.read_object("train_state.ntokens_seen") == 0
    with open_checkpoint(round_trip.root / "titan") as ckpt:
        assert ckpt.step == 5 and ckpt.format.name == "torchtitan"
    classic = round_trip.opts.get("torchtitan", TorchTitanOptions()).keys == "classic"
    assert ("layers.0.attention.wq.weight" in titan.tensors()) == classic
    assert ("output.weight" in titan.tensors()) == classic


def test_vocabulary_padding_follows_make_vocab_size_divisible_by(round_trip):
    spec, opts = round_trip.spec, round_trip.opts
    multiple = opts.get("megatron", MegatronOptions()).make_vocab_size_divisible_by
    padded = -(-spec.vocab_size // multiple) * multiple
    shapes = tensor_shapes(round_trip.root / "mega" / "iter_0000005")
    assert shapes["embedding.word_embeddings.weight"] == (padded, spec.emb_dim)
    emb = stock_load(round_trip.root / "mega" / "iter_0000005")["embedding.word_embeddings.weight"]
    assert not emb[spec.vocab_size:].any()  # padding rows are zeros
    assert ("output_layer.weight" in shapes) == (not spec.tie_word_embeddings)


def test_release_and_explicit_iteration(tmp_path):
    spec = tiny_spec("llama3")
    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(spec), step=9).parent
    release = convert(run, tmp_path / "rel", to="megatron", model="llama3", options=MegatronOptions(release=True))
    assert release.step is None and (tmp_path / "rel" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert (tmp_path / "rel" / "release" / ".metadata").is_file()
    titan = convert(run, tmp_path / "titan", to="torchtitan", model="llama3", options=TorchTitanOptions(iteration=0))
    assert titan.step == 0 and "train_state.step" not in DcpReader(tmp_path / "titan" / "step-0").objects()
    convert(run, tmp_path / "it", to="megatron", model="llama3", options=MegatronOptions(iteration=42))
    assert (tmp_path / "it" / "iter_0000042" / "common.pt").is_file()
    # Megatron -> TorchTitan carries the iteration, and a torch file has none to carry.
    assert convert(tmp_path / "it", tmp_path / "titan42", to="torchtitan").step == 42
    assert (tmp_path / "titan42" / "step-42").is_dir()


@pytest.mark.parametrize("round_trip", ["llama3.1"], indirect=True)
def test_cli_verifies_the_conversions_by_tensors_and_by_logits(round_trip, capsys):
    root = round_trip.root
    for argv in (
        ["verify", round_trip.run, root / "mega", "--model", "llama3.1"],
        ["verify", root / "mega", root / "titan"],
        ["verify", "--logits", root / "titan", root / "torch-dir"],
        ["verify", "--logits", round_trip.run, root / "mega", "--model", "llama3.1"],
    ):
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert info.value.code in (0, None), err + out
        assert "verify ok" in out


@pytest.mark.parametrize("round_trip", ["llama3.1"], indirect=True)
def test_cli_convert_prints_the_other_sides_flags(round_trip, tmp_path, capsys):
    for target in ("megatron", "torchtitan"):
        with pytest.raises(SystemExit) as info:
            main(["convert", str(round_trip.run), str(tmp_path / target), "--to", target, "--model", "llama3.1-8b"])
        out, err = capsys.readouterr()
        assert info.value.code in (0, None), err
        text = " ".join(out.split())
        assert "training step 5 of the source carried over" in " ".join(err.split())
        if target == "megatron":
            assert f"Megatron-LM: --load {tmp_path / target} --num-layers 2" in text
            assert "--use-rope-scaling --rope-scaling-factor 8" in text and "--no-load-optim" in text
        else:
            assert f"--checkpoint.initial_load_path {tmp_path / target / 'step-5'}" in text
            assert "ComplexRoPE scaling='llama' (factor 8.0" in text


# ------------------------------------------------------- hand-off from HF models


def _hf_from_megatron(sd: dict[str, torch.Tensor], spec) -> dict[str, torch.Tensor]:
    """HF tensors recomputed from Megatron's, the way Megatron-Core's attention reads the fused QKV."""
    H, G, D, E = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.emb_dim
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"][: spec.vocab_size],
           "model.norm.weight": sd["decoder.final_layernorm.weight"]}
    if "output_layer.weight" in sd:
        out["lm_head.weight"] = sd["output_layer.weight"][: spec.vocab_size]
    for i in range(spec.num_layers):
        p, lay = f"model.layers.{i}.", (lambda n: sd["decoder.layers." + n][i])  # noqa: E731
        groups = lay("self_attention.linear_qkv.weight").view(G, (H // G + 2) * D, E)
        out[p + "self_attn.q_proj.weight"] = groups[:, : H // G * D].reshape(H * D, E)
        out[p + "self_attn.k_proj.weight"] = groups[:, H // G * D: (H // G + 1) * D].reshape(G * D, E)
        out[p + "self_attn.v_proj.weight"] = groups[:, (H // G + 1) * D:].reshape(G * D, E)
        out[p + "self_attn.o_proj.weight"] = lay("self_attention.linear_proj.weight")
        gate, up = torch.chunk(lay("mlp.linear_fc1.weight"), 2, dim=0)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = lay("mlp.linear_fc2.weight")
        out[p + "input_layernorm.weight"] = lay("self_attention.linear_qkv.layer_norm_weight")
        out[p + "post_attention_layernorm.weight"] = lay("mlp.linear_fc1.layer_norm_weight")
        if spec.qk_norm:
            out[p + "self_attn.q_norm.weight"] = lay("self_attention.q_layernorm.weight")
            out[p + "self_attn.k_norm.weight"] = lay("self_attention.k_layernorm.weight")
    return out


def _hf_from_torchtitan(sd: dict[str, torch.Tensor], spec, interleaved: bool) -> dict[str, torch.Tensor]:
    """HF tensors recomputed from TorchTitan's, permuting q/k rows as TorchTitan's HF adapter does."""
    H, G, D, E = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.emb_dim

    def to_half(w, heads):
        return w.view(heads, D // 2, 2, E).transpose(1, 2).reshape(heads * D, E) if interleaved else w

    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(spec.num_layers):
        p, t = f"model.layers.{i}.", f"layers.{i}."
        out[p + "self_attn.q_proj.weight"] = to_half(sd[t + "attention.qkv_linear.wq.weight"], H)
        out[p + "self_attn.k_proj.weight"] = to_half(sd[t + "attention.qkv_linear.wk.weight"], G)
        out[p + "self_attn.v_proj.weight"] = sd[t + "attention.qkv_linear.wv.weight"]
        out[p + "self_attn.o_proj.weight"] = sd[t + "attention.wo.weight"]
        out[p + "mlp.gate_proj.weight"] = sd[t + "feed_forward.w1.weight"]
        out[p + "mlp.up_proj.weight"] = sd[t + "feed_forward.w3.weight"]
        out[p + "mlp.down_proj.weight"] = sd[t + "feed_forward.w2.weight"]
        out[p + "input_layernorm.weight"] = sd[t + "attention_norm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[t + "ffn_norm.weight"]
        if spec.qk_norm:
            out[p + "self_attn.q_norm.weight"] = sd[t + "attention.q_norm.weight"]
            out[p + "self_attn.k_norm.weight"] = sd[t + "attention.k_norm.weight"]
    return out


@pytest.fixture(scope="module", params=[("llama", False), ("qwen3", True)], ids=["llama-gqa", "qwen3-tied"])
def handed_off(request, tmp_path_factory):
    """A transformers model saved with save_pretrained, converted by `maxckpt convert` to each PyTorch format."""
    family, tied = request.param
    root = tmp_path_factory.mktemp(f"hf-{family}")
    model = tiny_hf_model(family, tied=tied, vocab=250, heads=4, kv_heads=2, head_dim=16)
    model.save_pretrained(root / "hf")
    for target, dst in (("megatron", "mega"), ("torchtitan", "titan"), ("torch", "torch-dir"), ("torch", "model.pt")):
        convert(root / "hf", root / dst, to=target)
    return SimpleNamespace(model=model, spec=spec_of(model), root=root, hf=hf_arrays(model))


def test_megatron_output_loads_with_stock_dcp_and_gives_back_transformers_tensors_and_logits(handed_off):
    spec, model = handed_off.spec, handed_off.model
    iter_dir = handed_off.root / "mega" / "release"  # an HF source has no step: a release checkpoint
    assert (handed_off.root / "mega" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert tensor_shapes(iter_dir) == megatron_shapes(spec, 256)
    sd = stock_load(iter_dir)
    recomputed = _hf_from_megatron(sd, spec)
    assert set(recomputed) == set(handed_off.hf)
    for name, array in handed_off.hf.items():
        assert torch.equal(recomputed[name], torch.from_numpy(array)), name
    logits = megatron_forward(sd, spec)
    assert (logits - hf_logits(model)).abs().max().item() < 1e-4


def test_torchtitan_output_loads_with_stock_dcp_and_gives_back_transformers_tensors_and_logits(handed_off):
    spec, model = handed_off.spec, handed_off.model
    step_dir = handed_off.root / "titan" / "step-0"  # model only, no train_state
    assert tensor_shapes(step_dir) == torchtitan_shapes(spec)
    assert not DcpReader(step_dir).objects()
    sd = stock_load(step_dir)
    interleaved = not spec.qk_norm  # TorchTitan's Llama is interleaved-pair rotary, its Qwen 3 rotate-half
    recomputed = _hf_from_torchtitan(sd, spec, interleaved)
    assert set(recomputed) == set(handed_off.hf)
    for name, array in handed_off.hf.items():
        assert torch.equal(recomputed[name], torch.from_numpy(array)), name
    logits = torchtitan_forward(sd, spec, rotary="interleaved" if interleaved else "half")
    assert (logits - hf_logits(model)).abs().max().item() < 1e-4


def test_torch_outputs_are_plain_state_dicts_transformers_loads(handed_off):
    import transformers

    single = torch.load(handed_off.root / "model.pt", weights_only=True)
    assert set(single) == set(handed_off.hf)
    for name, array in handed_off.hf.items():
        assert torch.equal(single[name], torch.from_numpy(array)), name
    directory = handed_off.root / "torch-dir"
    assert (directory / "pytorch_model.bin").is_file() and (directory / "config.json").is_file()
    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, use_safetensors=False, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(hf_logits(reloaded.eval()), hf_logits(handed_off.model), atol=1e-5, rtol=0)


def test_pytorch_outputs_convert_back_to_the_same_hf_tensors(handed_off, tmp_path):
    """Megatron -> HF, TorchTitan -> torch file -> HF: every path returns the original tensors exactly."""
    from maxckpt.containers.safetensors import SafetensorsReader

    convert(handed_off.root / "mega", tmp_path / "from-mega", to="hf")
    convert(handed_off.root / "titan", tmp_path / "titan.pt", to="torch")
    # A lone .pt file states nothing beyond shapes: the family and one head factor come from flags.
    family = "qwen3" if handed_off.spec.qk_norm else "llama2"
    convert(tmp_path / "titan.pt", tmp_path / "from-pt", to="hf", model=family, source=SourceOptions(overrides={"head_dim": 16}))
    for out in ("from-mega", "from-pt"):
        reader = SafetensorsReader(tmp_path / out)
        assert set(reader.tensors()) == set(handed_off.hf), out
        for name, array in handed_off.hf.items():
            assert np.array_equal(reader.read(name), array), (out, name)
    assert TorchFileReader(tmp_path / "titan.pt").tensors().keys() == handed_off.hf.keys()


# ------------------------------------------------- MaxText's own checkpoints

# FIXTURES: (checkpoint under maxtext/, logits file stem, --model as the user passes it), shared with test_fixtures_logits.


@pytest.mark.parametrize("path,stem,model", FIXTURES, ids=[f[1] for f in FIXTURES])
def test_maxtext_written_checkpoints_reproduce_maxtexts_logits_in_megatron_and_torchtitan_layouts(
    maxtext_fixtures, tmp_path, path, stem, model
):
    expected = np.load(maxtext_fixtures / "logits" / f"{stem}.npy")[0]
    tokens = [int(t) for t in np.load(maxtext_fixtures / "logits" / f"{stem}_tokens.npy").reshape(-1)]
    convert(maxtext_fixtures / path, tmp_path / "mega", to="megatron", model=model, dtype="float32")
    convert(maxtext_fixtures / path, tmp_path / "titan", to="torchtitan", model=model, dtype="float32")
    with open_checkpoint(tmp_path / "mega") as mega, open_checkpoint(tmp_path / "titan") as titan:
        spec = mega.spec
        assert titan.spec == spec and spec.family == model.split("-")[0]
        mega_dir, titan_dir = mega.reader.path, titan.reader.path
    qwen = spec.family == "qwen3"
    logits = {
        "megatron": megatron_forward(stock_load(mega_dir), spec, tokens).numpy(),
        "torchtitan": torchtitan_forward(stock_load(titan_dir), spec, tokens, rotary="half" if qwen else "interleaved").numpy(),
    }
    # qwen3 is tied: MaxText's logits carry its bfloat16 embedding copy (~1e-3 relative); these forwards do not.
    atol = 2e-3 * np.abs(expected).max() if qwen else 1e-4
    for target, got in logits.items():
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0, err_msg=target)


# ------------------------------------------------------------ listing, lazily


def test_open_checkpoint_lists_a_torchtitan_checkpoint_even_before_its_model_is_pinned_down(tmp_path):
    model = tiny_hf_model("llama")
    model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "titan", to="torchtitan", options=TorchTitanOptions(iteration=7))
    shutil.rmtree(tmp_path / "hf")
    (tmp_path / "titan" / "step-7" / "maxckpt_model.json").unlink()  # as TorchTitan itself writes it
    with open_checkpoint(tmp_path / "titan") as ckpt:
        assert ckpt.format.name == "torchtitan" and ckpt.step == 7
        infos = ckpt.tensors()
        assert infos["layers.1.attention.qkv_linear.wk.weight"].shape == (32, 64)
        assert "train_state.step" in ckpt.reader.objects()
        with pytest.raises(Exception, match="pass --set head_dim=D"):
            ckpt.spec  # noqa: B018
    with open_checkpoint(tmp_path / "titan", overrides={"head_dim": 16}) as ckpt:
        assert (ckpt.spec.num_heads, ckpt.spec.num_kv_heads) == (4, 2)
