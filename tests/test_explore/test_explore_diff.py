"""`maxckpt diff` / `diff_checkpoints`: what changed between two checkpoints of any formats."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import cli_runner
from explore_builders import FAMILY, shared_formats
from manager_states import make_state
from maxckpt import CheckpointManager
from maxckpt.conversion.verify import max_abs_diff
from maxckpt.errors import MaxckptError
from maxckpt.explore import diff_checkpoints
from maxckpt.explore.diff import ADDED, CHANGED, REMOVED, RESHAPED, UNCHANGED, compare_pair
from maxckpt.tensors import TensorInfo


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    return shared_formats(tmp_path_factory)


def edited_hf(src, dst, edit) -> dict[str, np.ndarray]:
    """A copy of the HF dir `src` at `dst` whose tensors went through `edit(dict)`."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return tensors


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    return cli_runner.run_cli(args, capsys)


@pytest.mark.parametrize("fmt", ["hf", "megatron", "torchtitan", "torch"])
def test_exports_are_identical_to_the_maxtext_source(formats, fmt):
    report = diff_checkpoints(formats["maxtext"], formats[fmt], model=FAMILY)
    assert report.names == "hf" and (report.format_a, report.format_b) == ("maxtext", fmt)
    assert report.identical and report.max_abs_diff == 0.0
    assert len(report.rows) == 21 and report.counts()[UNCHANGED] == 21
    assert all(r.rel_diff == 0.0 for r in report.rows)


def test_changed_tensor_has_exact_max_abs_and_relative_diff(formats, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight"
    original = load_file(str(formats["hf"] / "model.safetensors"))[name].astype(np.float64)
    delta = np.zeros_like(original)
    delta[3, 5], delta[0, 0] = 0.5, -0.25

    def edit(t):
        t[name] = (t[name] + delta).astype(np.float32)

    edited = edited_hf(formats["hf"], tmp_path / "edited", edit)
    report = diff_checkpoints(formats["hf"], tmp_path / "edited")
    (row,) = report.changed
    assert row.name == name and row.status == CHANGED
    actual = edited[name].astype(np.float64) - original
    assert row.max_abs_diff == np.abs(actual).max()
    assert row.rel_diff == pytest.approx(np.linalg.norm(actual) / np.linalg.norm(original), rel=1e-12)
    assert len(report.unchanged) == 20 and not report.identical
    assert diff_checkpoints(formats["hf"], tmp_path / "edited", atol=0.6).identical


def test_added_removed_and_reshaped_in_native_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_file({"keep": x, "gone": x, "shape": x}, str(a / "model.safetensors"))
    save_file({"keep": x, "new": x, "shape": x.reshape(3, 2)}, str(b / "model.safetensors"))
    report = diff_checkpoints(a, b, native=True)
    assert report.names == "native"
    assert {r.name: r.status for r in report.rows} == {"keep": UNCHANGED, "gone": REMOVED, "new": ADDED, "shape": RESHAPED}
    assert report.counts() == {CHANGED: 0, RESHAPED: 1, ADDED: 1, REMOVED: 1, UNCHANGED: 1}


def test_orbax_train_states_fall_back_to_stored_names(tmp_path):
    """Any Orbax train state (not a model maxckpt maps) is compared natively, optimizer state included."""
    with CheckpointManager(tmp_path / "ckpt", period=1, async_save=False) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    report = diff_checkpoints(tmp_path / "ckpt" / "1", tmp_path / "ckpt" / "2")
    assert report.names == "native" and "compared the stored tensors by name" in report.notes[0]
    statuses = {r.name: r.status for r in report.rows}
    assert statuses["step"] == CHANGED
    assert statuses["params/params/token_embedder/embedding"] == CHANGED
    assert any(n.startswith("opt_state/") for n in statuses)
    step = next(r for r in report.rows if r.name == "step")
    assert step.max_abs_diff == 1.0 and step.rel_diff == pytest.approx(0.5)  # 2 -> 3


def test_two_steps_of_a_model_through_the_layouts(maxtext_fixtures):
    ckpts = maxtext_fixtures / "llama2_scan" / "checkpoints"
    report = diff_checkpoints(ckpts / "4", ckpts / "5", model="llama2")
    assert report.names == "hf" and len(report.rows) == 21
    assert report.counts()[CHANGED] == 21  # one Adam step moves every weight
    native = diff_checkpoints(ckpts / "4", ckpts / "5", native=True, filter="opt_state/0/count")
    (count,) = native.rows
    assert (count.max_abs_diff, count.status) == (1.0, CHANGED)


def test_native_needs_one_format(formats):
    with pytest.raises(MaxckptError, match="--native compares stored names"):
        diff_checkpoints(formats["maxtext"], formats["hf"], native=True)


@pytest.mark.parametrize(
    "a, b, status, max_abs",
    [
        ([1.0, np.nan, 3.0], [1.0, np.nan, 3.0], UNCHANGED, 0.0),
        ([1.0, np.nan, 3.0], [1.0, 2.0, 3.0], CHANGED, math.inf),
        ([np.inf, 1.0], [np.inf, 1.5], CHANGED, 0.5),
        ([np.inf, 1.0], [1.0, 1.0], CHANGED, math.inf),  # not the largest float
        ([0.0, 0.0], [0.0, 0.0], UNCHANGED, 0.0),
    ],
)
def test_nan_and_inf_rules(a, b, status, max_abs):
    xa, xb = np.array(a, np.float32), np.array(b, np.float32)
    info = TensorInfo("t", xa.shape, xa.dtype)
    row = compare_pair("t", info, lambda i: xa, info, lambda i: xb)
    assert (row.status, row.max_abs_diff) == (status, max_abs)
    assert row.max_abs_diff == max_abs_diff(xa, xb)  # the same rule as `maxckpt verify`


def test_relative_diff_of_a_zero_tensor():
    za, ones = np.zeros(4, np.float32), np.ones(4, np.float32)
    info = TensorInfo("t", (4,), np.dtype("float32"))
    assert compare_pair("t", info, lambda i: za, info, lambda i: ones).rel_diff == math.inf
    assert compare_pair("t", info, lambda i: ones, info, lambda i: za).rel_diff == 1.0


# ------------------------------------------------------------------ CLI


def test_cli_table_and_exit_code(capsys, formats, tmp_path):
    edited_hf(formats["hf"], tmp_path / "e", lambda t: t.update({"lm_head.weight": t["lm_head.weight"] * 2}))
    code, out, _ = run_cli(capsys, "diff", str(formats["hf"]), str(tmp_path / "e"))
    assert code == 0
    assert "lm_head.weight" in out and "changed" in out and "model.norm.weight" not in out
    assert "21 tensors: 1 changed, 20 unchanged" in out
    code, out, _ = run_cli(capsys, "diff", str(formats["hf"]), str(tmp_path / "e"), "--exit-code", "--all")
    assert code == 1 and "model.norm.weight" in out
    code, _, _ = run_cli(capsys, "diff", str(formats["maxtext"]), str(formats["megatron"]), "--model", FAMILY, "--exit-code")
    assert code == 0


def test_cli_json(capsys, formats):
    code, out, _ = run_cli(capsys, "diff", str(formats["maxtext"]), str(formats["torchtitan"]), "--model", FAMILY, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["identical"] is True and data["names"] == "hf" and data["format_b"] == "torchtitan"
    assert data["counts"]["unchanged"] == 21 and data["max_abs_diff"] == 0.0
    assert {"name", "status", "shape_a", "shape_b", "max_abs_diff", "rel_diff"} <= set(data["tensors"][0])


def test_cli_missing_path_is_one_line(capsys, formats, tmp_path):
    code, out, err = run_cli(capsys, "diff", str(formats["hf"]), str(tmp_path / "missing"))
    assert code == 1 and out == ""
    assert err.strip().startswith("error: ") and "no such file or directory" in err and len(err.strip().splitlines()) == 1
