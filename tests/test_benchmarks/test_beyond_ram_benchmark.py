"""benchmarks/beyond_ram.py: its streamed HF writer, its byte-for-byte check, and one whole run at tiny widths
(no timing is asserted: the full run is larger than RAM and takes an hour; these check what its verdicts rest on)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import beyond_ram  # noqa: E402


@pytest.fixture(scope="module")
def values() -> beyond_ram.Values:
    return beyond_ram.Values(1 << 16)


def test_written_checkpoint_reads_back_as_the_values_and_a_flipped_byte_is_found(tmp_path, values):
    from maxckpt.containers.safetensors import SafetensorsReader  # maxckpt's own reader sees what the writer wrote

    spec = beyond_ram.spec_for("deepseek", "tiny", 0)
    root = tmp_path / "hf"
    built = beyond_ram.build_hf(root, spec, values)
    tensors = beyond_ram.tensors_of(spec)
    assert built["tensors"] == len(tensors) and built["bytes"] == beyond_ram.model_bytes(spec)
    assert json.loads((root / "config.json").read_text())["first_k_dense_replace"] == 1
    with SafetensorsReader(root) as reader:
        for index, (name, (shape, dtype)) in enumerate(tensors.items()):
            got = reader.read(name)
            want = np.concatenate(list(values.pieces(index, dtype, 0, math.prod(shape)))).view(dtype).reshape(shape)
            assert got.dtype == dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
    assert beyond_ram.compare_hf(root, spec, values)["bit_exact"]

    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    file, base, entry = beyond_ram._headers(root)[name]
    with open(file, "r+b") as f:
        at = base + entry["data_offsets"][0] + 10
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    check = beyond_ram.compare_hf(root, spec, values)
    assert not check["bit_exact"] and check["problems"] == [f"{name}: elements 0..{math.prod(entry['shape'])} differ from the source's"]


def test_each_layout_exceeds_the_size_it_is_given_by_less_than_a_layer():
    for layout in ("dense", "mixtral", "deepseek"):
        spec = beyond_ram.spec_for(layout, "full", 26e9)
        fewer = beyond_ram.model_bytes(beyond_ram.replace(spec, num_layers=spec.num_layers - 1))
        assert fewer <= 26e9 < beyond_ram.model_bytes(spec), layout
    deepseek = beyond_ram.spec_for("deepseek", "full", 26e9)
    assert (deepseek.q_lora_rank, deepseek.num_shared_experts, deepseek.first_dense_layers) == (1536, 2, 1)


def test_deepseek_layout_round_trips_through_maxckpt_bit_exact(tmp_path, values):
    """What the benchmark does to each layout, in this process: HF -> MaxText -> HF, compared with the written values."""
    from maxckpt.conversion import SourceOptions, convert

    spec = beyond_ram.spec_for("deepseek", "tiny", 0)
    beyond_ram.build_hf(tmp_path / "hf", spec, values)
    top_k = SourceOptions(overrides={"num_experts_per_tok": spec.num_experts_per_tok})
    convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", model="deepseek3", source=top_k)
    convert(tmp_path / "mt", tmp_path / "back", to="hf", model="deepseek3", source=top_k)
    check = beyond_ram.compare_hf(tmp_path / "back", spec, values)
    assert check == {**check, "bit_exact": True, "problems": [], "tensors_checked": len(beyond_ram.tensors_of(spec))}
