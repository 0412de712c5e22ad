"""`maxckpt inspect` / `inspect_checkpoint`: the stored tensor tree of every format, from metadata only."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import cli_runner
from conversion_models import tiny_spec
from explore_builders import FAMILY, expected_parameters, shared_formats
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.errors import CheckpointNotFoundError
from maxckpt.explore import inspect_checkpoint
from maxckpt.explore.stats import array_stats, row_blocks
from maxckpt.explore.tree import OPTIMIZER, OTHER, PARAMS, tensor_group
from maxckpt.tensors import TensorInfo

# The llama2 fixture's dimensions: emb 64, 4 heads of 16, 2 KV heads, mlp 128, 2 layers, vocab 256, untied.
FIXTURE_PARAMS = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 2 * 256 * 64 + 64


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    return shared_formats(tmp_path_factory)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    return cli_runner.run_cli(args, capsys)


# ------------------------------------------------------------------ Orbax training states


def test_training_state_shows_params_optimizer_step_and_rng_state(maxtext_fixtures):
    tree = inspect_checkpoint(maxtext_fixtures / "llama2_scan" / "checkpoints")
    assert tree.format == "maxtext" and tree.step == 5  # the newest committed step
    names = [e.name for e in tree.entries]
    assert "step" in names
    assert "params/params/decoder/layers/self_attention/query/kernel" in names
    assert "opt_state/0/mu/params/decoder/layers/self_attention/query/kernel" in names
    assert any(n.startswith("nnx_aux/") for n in names)
    totals = tree.totals()
    assert totals.parameters == FIXTURE_PARAMS == 106_816
    assert totals.groups[PARAMS].tensors == 12
    # Adam's mu and nu mirror the params; plus two `count` scalars.
    assert totals.groups[OPTIMIZER].size == 2 * FIXTURE_PARAMS + 2
    assert totals.groups[OPTIMIZER].tensors == 26
    assert totals.groups[OTHER].tensors == 13  # step + 12 nnx_aux RNG arrays
    assert totals.bytes_by_dtype == {"float32": 4 * 3 * FIXTURE_PARAMS, "int32": 12, "uint32": 180}
    assert totals.bytes == sum(e.nbytes for e in tree.entries)


def test_entries_match_what_the_container_lists(maxtext_fixtures):
    path = maxtext_fixtures / "llama2_scan" / "checkpoints" / "2"
    tree = inspect_checkpoint(path)
    infos = OrbaxReader(path).tensors()
    assert tree.step == 2
    assert {e.name: (e.shape, e.dtype) for e in tree.entries} == {n: (i.shape, str(i.dtype)) for n, i in infos.items()}
    q = next(e for e in tree.entries if e.name == "params/params/decoder/layers/self_attention/query/kernel")
    assert (q.shape, q.dtype, q.nbytes, q.group) == ((64, 2, 4, 16), "float32", 64 * 2 * 4 * 16 * 4, PARAMS)


def test_params_only_checkpoint(maxtext_fixtures):
    tree = inspect_checkpoint(maxtext_fixtures / "llama2_scan_params" / "checkpoints" / "0" / "items")
    assert tree.totals().parameters == FIXTURE_PARAMS
    assert tree.totals().bytes_by_dtype == {"bfloat16": 2 * FIXTURE_PARAMS}
    assert {e.group for e in tree.entries} == {PARAMS}
    assert "decoder/layers/self_attention/value/kernel" in [e.name for e in tree.entries]  # {"value": arr} unwrapped


def test_depth_collapses_with_per_subtree_totals(maxtext_fixtures):
    tree = inspect_checkpoint(maxtext_fixtures / "llama2_scan" / "checkpoints")
    top = {s.path: s for s in tree.collapse(1)}
    assert list(top) == ["nnx_aux", "opt_state", "params", "step"]
    assert [top[k].tensors for k in top] == [12, 26, 12, 1]
    assert top["params"].size == FIXTURE_PARAMS
    assert top["step"].shape == () and top["params"].shape is None
    assert sum(s.nbytes for s in top.values()) == tree.totals().bytes
    three = [s.path for s in tree.collapse(3)]
    assert "params/params/decoder" in three and "opt_state/0/mu" in three and "opt_state/0/count" in three


def test_filter_is_a_glob_on_full_names(maxtext_fixtures):
    tree = inspect_checkpoint(maxtext_fixtures / "llama2_scan" / "checkpoints", filter="*self_attention/query/kernel")
    assert [e.name for e in tree.entries] == [
        "opt_state/0/mu/params/decoder/layers/self_attention/query/kernel",
        "opt_state/0/nu/params/decoder/layers/self_attention/query/kernel",
        "params/params/decoder/layers/self_attention/query/kernel",
    ]
    none = inspect_checkpoint(maxtext_fixtures / "llama2_scan" / "checkpoints", filter="nothing*")
    assert none.entries == [] and "no tensor name matches 'nothing*'" in none.notes[0]


# ------------------------------------------------------------------ statistics


def test_stats_stream_in_blocks_and_match_numpy(maxtext_fixtures):
    path = maxtext_fixtures / "llama2_scan" / "checkpoints"
    name = "params/params/decoder/layers/mlp/wi_0/kernel"
    tree = inspect_checkpoint(path, filter=name, stats=True, budget=4096)  # 64 KiB tensor -> 16+ blocks
    (entry,) = tree.entries
    x = OrbaxReader(path).read(name).astype(np.float64)
    s = entry.stats
    assert s.count == x.size and s.nan_count == 0 and s.inf_count == 0
    assert s.mean == pytest.approx(x.mean(), rel=1e-9, abs=1e-12)
    assert s.std == pytest.approx(x.std(), rel=1e-9)
    assert s.absmax == np.abs(x).max()


def test_stats_count_nans_and_infs(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    x[1, 1], x[2, 0], x[3, 2] = np.nan, np.nan, np.inf
    save_file({"w": x}, str(tmp_path / "model.safetensors"))
    (entry,) = inspect_checkpoint(tmp_path, stats=True).entries
    finite = x[np.isfinite(x)].astype(np.float64)
    assert (entry.stats.nan_count, entry.stats.inf_count, entry.stats.count) == (2, 1, 12)
    assert entry.stats.mean == pytest.approx(finite.mean())
    assert entry.stats.absmax == finite.max()


def test_row_blocks_tile_the_tensor_on_chunk_boundaries():
    info = TensorInfo("w", (100, 10), np.dtype("float32"), (8, 10))
    blocks = list(row_blocks(info, budget=1000))
    assert blocks[0] == (slice(0, 24),)  # 25 rows fit, rounded down to whole 8-row chunks
    covered = [i for (s,) in blocks for i in range(s.start, s.stop)]
    assert covered == list(range(100))
    assert list(row_blocks(TensorInfo("s", (), np.dtype("int32")))) == [None]
    assert array_stats(np.array([1e8 + 1, 1e8 + 3])).std == 1.0  # no catastrophic cancellation


# ------------------------------------------------------------------ other formats


@pytest.mark.parametrize("fmt", ["maxtext", "hf", "megatron", "torchtitan", "torch"])
def test_every_format_lists_its_stored_tensors(formats, fmt):
    tree = inspect_checkpoint(formats[fmt])
    assert tree.format == fmt
    assert tree.totals().parameters == expected_parameters(tiny_spec(FAMILY))
    assert tree.totals().groups[OPTIMIZER].tensors == 0
    names = {e.name for e in tree.entries}
    if fmt == "maxtext":
        assert tree.step == 4 and "params/params/decoder/layers/mlp/wo/kernel" in names
    if fmt == "hf":
        assert {e.name: e.shape for e in tree.entries} == {n: i.shape for n, i in SafetensorsReader(formats[fmt]).tensors().items()}
    if fmt == "megatron":  # stacked layers, fused QKV, TE's _extra_state as non-tensor items
        assert "decoder.layers.self_attention.linear_qkv.weight" in names
        assert tree.objects and all("_extra_state" in o for o in tree.objects)
    if fmt == "torchtitan":
        assert "layers.0.attention.wq.weight" in names or "layers.0.attention.qkv_linear.wq.weight" in names
        assert "train_state.step" in tree.objects
    if fmt == "torch":
        assert "model.layers.0.mlp.up_proj.weight" in names


def test_hf_depth_uses_dotted_names(formats):
    tree = inspect_checkpoint(formats["hf"])
    rows = {s.path: s for s in tree.collapse(3)}
    assert list(rows) == ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0", "model.layers.1", "model.norm.weight"]
    assert rows["model.layers.0"].tensors == 9


def test_tensor_group_names_across_frameworks():
    assert tensor_group("optimizer.state.exp_avg.layers.0.w", ".") == OPTIMIZER
    assert tensor_group("train_state.step", ".") == OTHER
    assert tensor_group("decoder.layers.self_attention.linear_qkv._extra_state", ".") == OTHER
    assert tensor_group("decoder.layers.mlp.linear_fc1.weight", ".") == PARAMS


# ------------------------------------------------------------------ CLI


def test_cli_table_depth_and_totals(capsys, maxtext_fixtures):
    code, out, _ = run_cli(capsys, "inspect", str(maxtext_fixtures / "llama2_scan" / "checkpoints"), "--depth", "2")
    assert code == 0
    assert "(maxtext, step 5)" in out
    for row in ("params/params", "opt_state/0", "nnx_aux/model", "model parameters", "optimizer state", "dtype float32"):
        assert row in out
    assert "106,816 model parameters" in out


def test_cli_stats_columns(capsys, formats):
    code, out, _ = run_cli(capsys, "inspect", str(formats["hf"]), "--filter", "model.norm.weight", "--stats")
    assert code == 0
    assert "model.norm.weight" in out and "absmax" in out and "nan" in out
    assert "model.layers" not in out


def test_cli_json(capsys, maxtext_fixtures):
    code, out, _ = run_cli(capsys, "inspect", str(maxtext_fixtures / "qwen3_scan" / "checkpoints"), "--json", "--depth", "1", "--filter", "params/*")
    assert code == 0
    data = json.loads(out)
    assert data["format"] == "maxtext" and data["step"] == 5 and data["filter"] == "params/*"
    assert [s["path"] for s in data["subtrees"]] == ["params"]
    assert data["totals"]["parameters"] == sum(t["size"] for t in data["tensors"])
    assert all(t["group"] == "params" for t in data["tensors"])
    assert {"name", "shape", "dtype", "bytes", "chunk_shape"} <= set(data["tensors"][0])


@pytest.mark.parametrize("make", ["missing", "empty_dir", "junk_dir", "text_file"])
def test_cli_non_checkpoint_is_one_line_error(capsys, tmp_path, make):
    path = tmp_path / "x"
    if make == "empty_dir":
        path.mkdir()
    elif make == "junk_dir":
        path.mkdir()
        (path / "notes.txt").write_text("hello")
    elif make == "text_file":
        path.write_text("hello")
    code, out, err = run_cli(capsys, "inspect", str(path))
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0]


def test_cli_error_in_a_fresh_process_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "maxckpt", "inspect", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "not a checkpoint maxckpt can read" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_library_raises_checkpoint_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        inspect_checkpoint(tmp_path / "missing")


EMBEDDING = {
    "maxtext": "params/params/token_embedder/embedding",
    "hf": "model.embed_tokens.weight",
    "megatron": "embedding.word_embeddings.weight",
    "torchtitan": "tok_embeddings.weight",
    "torch": "model.embed_tokens.weight",
}


@pytest.mark.parametrize("fmt", list(EMBEDDING))
def test_stats_read_in_blocks_from_every_container(formats, fmt):
    """The embedding is the same array in every format: block-wise statistics must agree with numpy exactly."""
    (entry,) = inspect_checkpoint(formats[fmt], filter=EMBEDDING[fmt], stats=True, budget=512).entries
    x = SafetensorsReader(formats["hf"]).read("model.embed_tokens.weight").astype(np.float64)
    s = entry.stats
    assert (s.count, s.nan_count, s.absmax) == (x.size, 0, np.abs(x).max())
    assert s.mean == pytest.approx(x.mean(), rel=1e-12, abs=1e-15)
    assert s.std == pytest.approx(x.std(), rel=1e-12)


@pytest.mark.parametrize("fmt", list(EMBEDDING))
def test_inspect_reads_no_tensor_data_without_stats(formats, fmt, monkeypatch):
    """Metadata only: no container read happens unless --stats asks for values (spies around the real reads)."""
    from maxckpt.containers.dcp import DcpReader
    from maxckpt.containers.torch_file import TorchFileReader

    calls: list[str] = []
    for cls, method in ((OrbaxReader, "read"), (SafetensorsReader, "read"), (DcpReader, "read"), (DcpReader, "read_bytes"), (TorchFileReader, "read")):
        real = getattr(cls, method)

        def spy(self, name, *args, _real=real, **kwargs):
            calls.append(name)
            return _real(self, name, *args, **kwargs)

        monkeypatch.setattr(cls, method, spy)
    tree = inspect_checkpoint(formats[fmt])
    assert tree.totals().parameters == expected_parameters(tiny_spec(FAMILY)) and calls == []
    inspect_checkpoint(formats[fmt], filter=EMBEDDING[fmt], stats=True)
    assert calls and set(calls) == {EMBEDDING[fmt]}
