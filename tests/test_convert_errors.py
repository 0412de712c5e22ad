"""Bad input to `maxckpt convert`: one clear message, a non-zero exit, and nothing half-written at DST."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.cli.main import main
from maxckpt.conversion import convert


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    spec = tiny_spec("llama2")
    run = save_maxtext_run(root / "run", random_maxtext_params(spec)).parent
    convert(run, root / "hf", to="hf", model="llama2", max_shard_size="30KB")
    return root


def run_cli(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    _, err = capsys.readouterr()
    return int(info.value.code or 0), err


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
    code, err = run_cli(["convert", sources / "run", dst, "--to", "hf", "--model", "llama9-7b"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "error: unknown model 'llama9-7b'", "Supported families:")


def test_wrong_family_for_the_checkpoint(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, err = run_cli(["convert", sources / "run", dst, "--to", "hf", "--model", "qwen3-0.6b"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "has no q/k norm tensors, which a qwen3 model needs")


def test_unknown_target_format(sources, tmp_path, capsys):
    dst = tmp_path / "out"
    code, err = run_cli(["convert", sources / "run", dst, "--to", "onnx"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "unknown format 'onnx'; known formats: maxtext, hf, megatron, torchtitan, torch")


def test_config_that_disagrees_with_the_tensors(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config["intermediate_size"] = 96
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "says mlp_dim=96 but the tensor shapes say 64")


def test_one_tensor_with_a_wrong_shape(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config["num_attention_heads"], config["head_dim"] = 8, 8  # q_proj rows still 4*16 = 8*8, but k_proj is 2*16 != 2*8
    (hf / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "out"
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "say num_heads=8, num_kv_heads=2, head_dim=8 (64 query and 16 key/value features) but the tensor shapes have 64 query and 32 key/value features")


def test_truncated_safetensors_file(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    shard = sorted(hf.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    dst = tmp_path / "out"
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, f"{shard.name}: tensor", "(truncated file?)")


def test_hostile_header_lengths_and_offsets(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    shard = sorted(hf.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 2**60) + data[8:])
    dst = tmp_path / "out"
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "header claims 1152921504606846976 bytes")

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    names = [k for k in header if k != "__metadata__"]
    header[names[1]]["data_offsets"] = [header[names[0]]["data_offsets"][0] + 4, header[names[0]]["data_offsets"][0] + 4 + (header[names[1]]["data_offsets"][1] - header[names[1]]["data_offsets"][0])]
    raw = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "overlap; the header is corrupt or hostile")


def test_missing_index_entry(sources, tmp_path, capsys):
    hf = copy_hf(sources, tmp_path)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    dst = tmp_path / "out"
    code, err = run_cli(["convert", hf, dst, "--to", "maxtext"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "tensor 'model.norm.weight' is stored but missing from the index")


def test_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text("nothing here")
    dst = tmp_path / "out"
    code, err = run_cli(["convert", tmp_path / "src", dst, "--to", "hf"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "not a checkpoint maxckpt can read; tried maxtext, hf, megatron, torchtitan, torch")


def test_damage_found_mid_conversion_leaves_nothing_behind(sources, tmp_path, capsys):
    run = Path(shutil.copytree(sources / "run", tmp_path / "run"))
    items = next(run.glob("checkpoints/*/items"))
    # Damage the stored data (the B-tree stays readable, so the conversion starts and fails while writing).
    for f in (items / "ocdbt.process_0" / "d").iterdir():
        if f.stat().st_size > 20_000:
            f.write_bytes(f.read_bytes()[:1000])
    dst = tmp_path / "out"
    code, err = run_cli(["convert", run, dst, "--to", "hf", "--model", "llama2"], capsys)
    assert_clean_failure(tmp_path, dst, code, err, "error:", "reading array")
