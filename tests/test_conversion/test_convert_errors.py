"""Bad input to `maxckpt convert`: one clear message, a non-zero exit, and nothing half-written at DST."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.families import FAMILIES, bridge_gap
from maxckpt.formats import HFOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion import convert


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    spec = tiny_spec("llama2")
    run = save_maxtext_run(root / "run", random_maxtext_params(spec), step=2).parent
    convert(run, root / "hf", to="hf", model="llama2", options=HFOptions(max_shard_size="30KB"))
    convert(run, root / "mega", to="megatron", model="llama2")  # mega/iter_0000003
    convert(run, root / "titan", to="torchtitan", model="llama2")  # titan/step-3
    return root


def assert_clean_failure(tmp_path: Path, dst: Path, code: int, err: str, *expected: str) -> None:
    assert code != 0
    message = " ".join(err.split())  # rich wraps long lines
    for text in expected:
        assert text in message, message
    assert "Traceback" not in err
    assert not dst.exists()
    assert not list(dst.parent.glob(dst.name + ".tmp-*"))


def copy_hf(sources: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sources / "hf", tmp_path / "hf"))


def test_unknown_family(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", sources / "run", dst, "--to", "hf", "--model", "llama9-7b"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "error: unknown model 'llama9-7b'", "Supported families:")


def test_wrong_family_for_the_checkpoint(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", sources / "run", dst, "--to", "hf", "--model", "qwen3-0.6b"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "has no q/k norm tensors, which a qwen3 model needs")


def test_unknown_target_format(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", sources / "run", dst, "--to", "onnx"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "unknown format 'onnx'; known formats: maxtext, hf, megatron, torchtitan, torch")


def test_config_that_disagrees_with_the_tensors(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config["intermediate_size"] = 96
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "says mlp_dim=96 but the tensor shapes say 64")


def test_one_tensor_with_a_wrong_shape(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config["num_attention_heads"], config["head_dim"] = 8, 8  # q_proj rows still 4*16 = 8*8, but k_proj is 2*16 != 2*8
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "say num_heads=8, num_kv_heads=2, head_dim=8 (64 query and 16 key/value features) but the tensor shapes have 64 query and 32 key/value features")


def test_truncated_safetensors_file(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    shard = sorted(hf.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, f"{shard.name}: tensor", "(truncated file?)")


def test_hostile_header_lengths_and_offsets(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    shard = sorted(hf.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 2**60) + data[8:])
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "header claims 1152921504606846976 bytes")

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    names = [k for k in header if k != "__metadata__"]
    header[names[1]]["data_offsets"] = [header[names[0]]["data_offsets"][0] + 4, header[names[0]]["data_offsets"][0] + 4 + (header[names[1]]["data_offsets"][1] - header[names[1]]["data_offsets"][0])]
    raw = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "overlap; the header is corrupt or hostile")


def test_missing_index_entry(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "tensor 'model.norm.weight' is stored but missing from the index")


def test_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text("nothing here")
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", tmp_path / "src", dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "not a checkpoint maxckpt can read; tried maxtext, hf, megatron, torchtitan, torch")


@pytest.mark.parametrize(
    "tensors",
    [
        {"model.embed_tokens.weight": (8,), "model.layers.0.input_layernorm.weight": (8,)},  # a 1-D embedding
        {"model.embed_tokens.weight": (8, 4), "model.layers.0.self_attn.q_norm.weight": (2,)},  # q norm without q
    ],
    ids=["embedding-rank", "q-norm-without-q"],
)
def test_safetensors_that_are_not_a_llama_model(tmp_path, capsys, tensors):
    from safetensors.numpy import save_file

    (tmp_path / "src").mkdir()
    save_file({n: np.zeros(s, np.float32) for n, s in tensors.items()}, str(tmp_path / "src" / "model.safetensors"))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", tmp_path / "src", dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "hf tensors do not have the names and shapes of a model maxckpt converts")


def test_damage_found_mid_conversion_leaves_nothing_behind(sources, tmp_path, capsys):
    run = Path(shutil.copytree(sources / "run", tmp_path / "run"))
    items = next(run.glob("checkpoints/*/items"))
    # Damage the stored data (the B-tree stays readable, so the conversion starts and fails while writing).
    for f in (items / "ocdbt.process_0" / "d").iterdir():
        if f.stat().st_size > 20_000:
            f.write_bytes(f.read_bytes()[:1000])
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", run, dst, "--to", "hf", "--model", "llama2"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "error:", "reading array")


# ------------------------------------------------------------ PyTorch formats


class _RunsCode:
    """A pickle that would call os.system when unpickled by a plain pickle.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_hostile_dcp_metadata_is_refused_without_running_it(sources, tmp_path, capsys):
    import pickle

    mega = Path(shutil.copytree(sources / "mega", tmp_path / "mega"))
    marker = tmp_path / "PWNED"
    (mega / "iter_0000003" / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", mega, dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "refused to load", "global 'posix.system' is not a DCP metadata class")
    assert len(err.strip().splitlines()) <= 3 and not marker.exists()  # one message (rich may wrap it); nothing ran


def test_truncated_distcp_file(sources, tmp_path, capsys):
    titan = Path(shutil.copytree(sources / "titan", tmp_path / "titan"))
    data = titan / "step-3" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", titan, dst, "--to", "megatron"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "__0_0.distcp: truncated", "the checkpoint was cut short")


def test_megatron_run_outside_the_llama_family(sources, tmp_path, capsys):
    import argparse

    import torch

    mega = Path(shutil.copytree(sources / "mega", tmp_path / "mega"))
    common = mega / "iter_0000003" / "common.pt"
    from maxckpt.containers.torch_safety import load_weights_only

    # Not torch's safe_globals context: leaving it un-registers Namespace for the whole process, even when
    # megatron-core (imported by other tests) had registered it, and Megatron's own loads then fail.
    state = load_weights_only(common, allow=[argparse.Namespace])
    state["args"].swiglu = False
    torch.save(state, common)
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", mega, dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "the run was trained with swiglu=False", "Llama-family models")

    state["args"].swiglu, state["args"].hidden_size = True, "wide"  # args of the wrong type
    torch.save(state, common)
    code, _, err = run_cli(["convert", mega, dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "common.pt: its saved args do not describe a model (ValueError")


def test_megatron_config_that_disagrees_with_the_tensors(sources, tmp_path, capsys):
    mega = Path(shutil.copytree(sources / "mega", tmp_path / "mega"))
    model_json = mega / "iter_0000003" / "maxckpt_model.json"
    data = json.loads(model_json.read_text())
    data["model_spec"]["mlp_dim"] = 96
    model_json.write_text(json.dumps(data))
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", mega, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "says mlp_dim=96 but the tensor shapes say 64")


def test_torchtitan_checkpoint_that_does_not_state_head_dim(sources, tmp_path, capsys):
    titan = Path(shutil.copytree(sources / "titan", tmp_path / "titan"))
    (titan / "step-3" / "maxckpt_model.json").unlink()  # what TorchTitan itself writes: tensors only
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", titan, dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "cannot tell num_heads, num_kv_heads, head_dim", "pass --set head_dim=D")
    code, _, err = run_cli(["convert", titan, dst, "--to", "hf", "--set", "head_dim=16", "--model", "llama2"], capsys)
    assert code == 0, err


def test_contradicting_step_options(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", sources / "run", dst, "--to", "megatron", "--iteration", "5", "--release"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "iteration=5 and release contradict")
    code, _, err = run_cli(["convert", sources / "run", dst, "--to", "megatron", "--megatron-spec", "fast"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "megatron_spec must be one of te, local, got 'fast'")


# ------------------------------------------------------ family against tensors

TARGETS = ("hf", "maxtext", "megatron", "torchtitan", "torch")
NO_EXPERTS = "is a mixture-of-experts family, but the checkpoint has no expert tensors"


def dense_source(sources: Path, tmp_path: Path, kind: str) -> tuple[Path, list[str]]:
    """A dense llama2 checkpoint of one source format, and the flags it needs besides --model."""
    if kind == "maxtext":
        return sources / "run", []
    if kind == "hf-without-config":
        hf = copy_hf(sources, tmp_path)
        (hf / "config.json").unlink()
        return hf, ["--set", "head_dim=16"]
    titan = Path(shutil.copytree(sources / "titan", tmp_path / "titan"))
    (titan / "step-3" / "maxckpt_model.json").unlink()  # tensors only, as TorchTitan writes them
    return titan, ["--set", "head_dim=16"]


@pytest.mark.parametrize("kind", ["maxtext", "hf-without-config", "torchtitan-tensors-only"])
def test_a_moe_family_over_a_dense_checkpoint_is_refused_for_every_target(sources, tmp_path, capsys, kind):
    src, flags = dense_source(sources, tmp_path, kind)
    dst = tmp_path / "out"
    for model in ("mixtral", "mixtral-8x7b", "deepseek3", "gpt-oss-20b"):
        for target in TARGETS:
            code, _, err = run_cli(["convert", src, dst, "--to", target, "--model", model, *flags], capsys)
            family = model.split('-8x')[0].replace('-20b', '')
            gap = bridge_gap("torchtitan", family) if kind.startswith("torchtitan") else None
            # a family TorchTitan cannot hold is refused with the registry's reason before its tensors are read
            expected = f"{family} cannot be converted from torchtitan: {gap}" if gap else f"{family} {NO_EXPERTS}"
            assert_clean_failure(tmp_path, dst, code, err, expected)


def test_an_hf_config_naming_a_moe_family_over_dense_tensors_is_refused(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config.update(model_type="mixtral", architectures=["MixtralForCausalLM"])  # and no num_local_experts
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    for target in TARGETS:
        code, _, err = run_cli(["convert", hf, dst, "--to", target], capsys)
        assert_clean_failure(tmp_path, dst, code, err, f"mixtral {NO_EXPERTS}", "or fix the config that names mixtral")


def test_qwen3_moe_over_a_dense_qwen3_is_refused(maxtext_fixtures, tmp_path, capsys):
    src = maxtext_fixtures / "qwen3_scan" / "checkpoints" / "5" / "items"
    dst = tmp_path / "out"
    for target in TARGETS:
        code, _, err = run_cli(["convert", src, dst, "--to", target, "--model", "qwen3-30b-a3b"], capsys)
        dense = f"({', '.join(n for n, f in FAMILIES.items() if f.maxtext_moe is None)})"  # every dense family
        assert_clean_failure(tmp_path, dst, code, err, f"qwen3-moe {NO_EXPERTS}", dense)


MOE_FIXTURES = {"mixtral_moe_scan": "mixtral", "qwen3_moe_scan": "qwen3-moe",
                "deepseek3_scan": "deepseek3", "gpt_oss_scan": "gpt-oss"}


@pytest.mark.parametrize("name", list(MOE_FIXTURES))
def test_a_dense_family_over_a_moe_checkpoint_is_refused(maxtext_fixtures, tmp_path, capsys, name):
    """The reverse: a MoE checkpoint (MaxText, and HF without its config.json) given a dense --model."""
    src = maxtext_fixtures / name / "checkpoints" / "5" / "items"
    hf = tmp_path / "hf"
    convert(src, hf, to="hf", source=SourceOptions(overrides={} if name == "mixtral_moe_scan" else {"num_experts_per_tok": 2}))
    (hf / "config.json").unlink()
    dst = tmp_path / "out"
    for source in (src, hf):
        for model in ("llama2", "llama3.1-8b", "mistral", "qwen3", "gemma3"):
            code, _, err = run_cli(["convert", source, dst, "--to", "hf", "--model", model], capsys)
            assert_clean_failure(tmp_path, dst, code, err, f"tensors are those of a {MOE_FIXTURES[name]} model")


# ------------------------------------------------------------- rope parameters


@pytest.mark.parametrize(
    "scaling, problem",
    [
        ({"factor": 0.0}, "llama3 scaling needs factor >= 1 (the context extension), got factor=0.0"),
        ({"factor": -1.0}, "llama3 scaling needs factor >= 1 (the context extension), got factor=-1.0"),
        ({"original_max_position_embeddings": 0}, "original_max_position_embeddings must be a positive whole number"),
        ({"low_freq_factor": 8.0},
         "llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor=8.0, high_freq_factor=4.0"),
        ({"rope_type": "longrope"}, "rope_type 'longrope' is not one maxckpt converts (default, linear, llama3, yarn)"),
    ],
)
def test_unusable_rope_scaling_in_config_json_is_refused(sources, tmp_path, capsys, scaling, problem):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, **scaling}
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    for target in TARGETS:
        code, _, err = run_cli(["convert", hf, dst, "--to", target], capsys)
        how = "fix the file, or pass --set rope_scaling=JSON"
        assert_clean_failure(tmp_path, dst, code, err, "config states rope_scaling=", problem, how)


@pytest.mark.parametrize(
    "value, problem",
    [
        ('{"rope_type":"yarn","factor":4.0,"beta_fast":1,"beta_slow":32}',
         "yarn scaling needs beta_fast >= beta_slow > 0, got beta_fast=1, beta_slow=32"),
        ('{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":-1}',
         "original_max_position_embeddings must be a positive whole number, got -1"),
        ('{"rope_type":"linear","factor":0}', "linear scaling needs factor >= 1 (the context extension), got factor=0"),
        ('{"rope_type":"su","factor":2}', "rope_type 'su' is not one maxckpt converts"),
    ],
)
def test_unusable_rope_scaling_from_set_is_refused(sources, tmp_path, capsys, value, problem):
    dst = tmp_path / "out"
    for target in TARGETS:
        argv = ["convert", sources / "run", dst, "--to", target, "--model", "llama2", "--set", f"rope_scaling={value}"]
        code, _, err = run_cli(argv, capsys)
        assert_clean_failure(tmp_path, dst, code, err, "error: --set rope_scaling=", problem)


# ----------------------------------------------------------- integer weights


def test_an_integer_weight_in_an_orbax_checkpoint_is_refused_for_every_target(tmp_path, capsys):
    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec)
    query = "decoder/layers/self_attention/query/kernel"
    params[query] = (params[query] * 100).astype(np.int32)
    run = save_maxtext_run(tmp_path / "run", params).parent
    dst = tmp_path / "out"
    for target in TARGETS:
        code, _, err = run_cli(["convert", run, dst, "--to", target, "--model", "llama2"], capsys)
        assert_clean_failure(
            tmp_path, dst, code, err,
            f"tensor model.layers.0.self_attn.q_proj.weight (read from params/params/{query}) has dtype int32, "
            "but a floating-point weight (bfloat16, float16 or float32) belongs there",
        )


@pytest.mark.parametrize("fmt, stored", [("titan", "layers.0.attention.qkv_linear.wq.weight"),
                                         ("mega", "decoder.layers.self_attention.linear_qkv.weight")])
def test_an_integer_weight_in_a_dcp_checkpoint_is_refused(sources, tmp_path, capsys, fmt, stored):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    src = Path(shutil.copytree(sources / fmt, tmp_path / fmt))
    step = next(p for p in src.iterdir() if p.is_dir())
    dcp_to_torch_save(sources / fmt / step.name, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    state[stored] = (state[stored] * 100).to(torch.int32)
    for f in [*step.glob("*.distcp"), step / ".metadata"]:
        f.unlink()
    torch.save(state, tmp_path / "state.pt")
    torch_save_to_dcp(tmp_path / "state.pt", step)
    dst = tmp_path / "out"
    for target in ("hf", "maxtext"):
        code, _, err = run_cli(["convert", src, dst, "--to", target], capsys)
        assert_clean_failure(tmp_path, dst, code, err, f"(read from {stored}) has dtype int32, but a floating-point")


def test_an_integer_weight_in_an_hf_checkpoint_is_refused(sources, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    hf = copy_hf(sources, tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight"
    shard = hf / json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = (tensors[name] * 100).astype(np.int32)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    dst = tmp_path / "out"
    for target in TARGETS:
        code, _, err = run_cli(["convert", hf, dst, "--to", target], capsys)
        # The quantized-source check (formats/hf/quantization.py) may speak first: either names the tensor and dtype.
        assert_clean_failure(tmp_path, dst, code, err, f"tensor {name}", "int32")
