"""TorchTitan layout: HF -> TorchTitan -> HF bit-exact, both key generations, rotary, train_state."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch_reference import (
    hf_arrays,
    hf_logits,
    lazy,
    lazy_from_reader,
    spec_of,
    tiny_hf_model,
    torchtitan_forward,
    torchtitan_shapes,
    write_all,
)

from maxckpt.containers.dcp import DcpReader
from maxckpt.errors import CheckpointNotFoundError, ShapeMismatchError
from maxckpt.formats.torchtitan.files import find_step_dir, open_torchtitan_writer, read_train_step, step_dir_name
from maxckpt.formats.torchtitan.layout import TorchTitanLayout, strip_model_prefix
from maxckpt.layouts.torch_transforms import rotary_rows

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (family, heads, kv heads, head_dim, hidden, tied)
CONFIGS = {
    "llama-gqa-untied": ("llama", 4, 2, 16, 64, False),
    "llama-mha-tied": ("llama", 4, 4, 16, 64, True),
    "llama-gqa4": ("llama", 8, 2, 8, 64, False),
    "qwen3": ("qwen3", 4, 2, 32, 64, True),
}


@functools.lru_cache(maxsize=None)
def _model(key: str, dtype: torch.dtype = torch.float32):
    fam, h, g, d, e, tied = CONFIGS[key]
    return tiny_hf_model(fam, heads=h, kv_heads=g, head_dim=d, hidden=e, tied=tied, dtype=dtype)


def _convert(model, layout, folder, step=10, train_state=False):
    spec = spec_of(model)
    with open_torchtitan_writer(folder, step, train_state=train_state) as w:
        write_all(w, layout.from_hf(lazy(hf_arrays(model)), spec))
    return folder / step_dir_name(step), spec


@pytest.mark.parametrize("keys", ["2026", "classic"])
@pytest.mark.parametrize("key", list(CONFIGS))
def test_stock_dcp_load_hf_tensors_and_logits(tmp_path, key, keys):
    model = _model(key)
    layout = TorchTitanLayout(keys=keys)
    step_dir, spec = _convert(model, layout, tmp_path / "ckpt")

    # What TorchTitan's model-only load does: dcp.load into the model's flat state dict.
    sd = {k: torch.empty(s) for k, s in torchtitan_shapes(spec, keys).items()}
    dcp.load(sd, checkpoint_id=str(step_dir), no_dist=True)

    back = layout.to_hf(lazy({k: v.numpy() for k, v in sd.items()}), spec)
    original = hf_arrays(model)
    assert set(back) == set(original)
    for name, arr in original.items():
        assert np.array_equal(back[name].read(), arr), name

    rotary = "half" if spec.family == "qwen3" else "interleaved"
    diff = (torchtitan_forward(sd, spec, rotary=rotary) - hf_logits(model)).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("key", ["llama-gqa-untied", "qwen3"])
def test_round_trip_through_the_dcp_reader_is_bit_exact_in_bfloat16(tmp_path, key):
    model = _model(key, torch.bfloat16)
    layout = TorchTitanLayout()
    step_dir, spec = _convert(model, layout, tmp_path / "ckpt")
    reader = DcpReader(step_dir)
    assert layout.detect(reader.tensors())
    back = TorchTitanLayout(keys="classic").to_hf(lazy_from_reader(reader), spec)  # generation detected on read
    for name, arr in hf_arrays(model).items():
        got = back[name].read()
        assert got.dtype == np.dtype(ml_dtypes.bfloat16)
        assert np.array_equal(got.view(np.uint16), arr.view(np.uint16)), name


def test_older_full_checkpoints_with_model_prefix_read_back():
    model = _model("llama-gqa-untied")
    spec = spec_of(model)
    flat = TorchTitanLayout(keys="classic").from_hf(lazy(hf_arrays(model)), spec)
    prefixed = {f"model.{k}": v for k, v in flat.items()}
    prefixed["optimizer.state.x"] = flat["norm.weight"]  # non-model keys are ignored
    assert TorchTitanLayout().detect({k: v.info for k, v in prefixed.items()})
    assert set(strip_model_prefix(prefixed)) == set(flat)
    back = TorchTitanLayout().to_hf(prefixed, spec)
    for name, arr in hf_arrays(model).items():
        assert np.array_equal(back[name].read(), arr), name


def test_rotary_permutation_is_torchtitans_adapter_permutation():
    h, d, e = 3, 8, 5
    w = torch.randn(h * d, e)
    # torchtitan Llama3StateDictAdapter._permute (TorchTitan -> HF)
    titan_to_hf = w.view(h, d // 2, 2, e).transpose(1, 2).reshape(h * d, e)
    assert np.array_equal(rotary_rows(w.numpy(), h, d, "half"), titan_to_hf.numpy())
    assert np.array_equal(rotary_rows(titan_to_hf.numpy(), h, d, "interleaved"), w.numpy())


def test_train_state_step_is_carried_over(tmp_path):
    model = _model("llama-gqa-untied")
    step_dir, _ = _convert(model, TorchTitanLayout(), tmp_path / "ckpt", step=42, train_state=True)
    assert read_train_step(DcpReader(step_dir)) == 42
    # As TorchTitan loads it: the Trainer's {"step", "ntokens_seen"} under "train_state".
    sd = {"train_state": {"step": 0, "ntokens_seen": -1}}
    dcp.load(sd, checkpoint_id=str(step_dir), no_dist=True)
    assert sd["train_state"] == {"step": 42, "ntokens_seen": 0}


def test_a_train_state_step_that_is_not_a_number_is_a_clear_error(tmp_path):
    from maxckpt.containers.dcp import DcpWriter
    from maxckpt.errors import CorruptCheckpointError

    with DcpWriter(tmp_path / "step-3") as w:
        w.write_object("train_state.step", "three", path=("train_state", "step"))
    with pytest.raises(CorruptCheckpointError, match="train_state.step holds 'three', not a step number"):
        read_train_step(DcpReader(tmp_path / "step-3"))


def test_model_only_by_default(tmp_path):
    model = _model("llama-gqa-untied")
    step_dir, _ = _convert(model, TorchTitanLayout(), tmp_path / "ckpt")
    r = DcpReader(step_dir)
    assert r.objects() == [] and read_train_step(r) is None
    assert not any(k.startswith(("optimizer", "lr_scheduler", "dataloader", "train_state")) for k in r.tensors())


def test_find_step_dir_picks_the_newest_committed_step(tmp_path):
    model = _model("llama-gqa-untied")
    for step in (5, 20):
        _convert(model, TorchTitanLayout(), tmp_path / "ckpt", step=step)
    (tmp_path / "ckpt" / "step-30").mkdir()  # no .metadata: an unfinished save
    assert find_step_dir(tmp_path / "ckpt") == (tmp_path / "ckpt" / "step-20", 20)
    assert find_step_dir(tmp_path / "ckpt", step=5) == (tmp_path / "ckpt" / "step-5", 5)
    assert find_step_dir(tmp_path / "ckpt" / "step-5") == (tmp_path / "ckpt" / "step-5", 5)
    with pytest.raises(CheckpointNotFoundError, match="no committed step-30"):
        find_step_dir(tmp_path / "ckpt", step=30)
    with pytest.raises(CheckpointNotFoundError, match="no TorchTitan checkpoint"):
        find_step_dir(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    model = _model("llama-gqa-untied")
    spec = spec_of(model)
    tt = TorchTitanLayout().from_hf(lazy(hf_arrays(model)), spec)
    tt.pop("layers.1.feed_forward.w3.weight")
    with pytest.raises(ShapeMismatchError, match=r"layers\.1\.feed_forward\.w3\.weight"):
        TorchTitanLayout().to_hf(tt, spec)
