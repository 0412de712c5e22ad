"""Orbax container: lazy listing and reads of real MaxText checkpoints, every storage variant, and a writer Orbax restores."""

from __future__ import annotations

import json
import shutil

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conversion_models import nest
from maxckpt.containers.orbax import OrbaxReader, OrbaxWriter, committed_steps, find_items_dir
from maxckpt.errors import CheckpointNotFoundError, ConversionError, CorruptCheckpointError


def test_lists_a_training_checkpoint_without_reading_data(maxtext_fixtures):
    r = OrbaxReader(maxtext_fixtures / "llama2_scan" / "checkpoints" / "5")
    infos = r.tensors()
    q = infos["params/params/decoder/layers/self_attention/query/kernel"]
    assert (q.shape, q.dtype, q.chunk_shape) == ((64, 2, 4, 16), np.dtype(np.float32), (64, 2, 4, 16))
    assert infos["params/params/decoder/layers/post_self_attention_layer_norm/scale"].shape == (64, 2)
    assert "opt_state/0/mu/params/decoder/layers/mlp/wi_0/kernel" in infos
    assert any(n.startswith("nnx_aux/") for n in infos) and infos["step"].shape == ()
    assert r.step == 5 and r.custom_metadata == {"scan_layers": True}


def test_params_only_leaves_are_unwrapped_but_the_value_projection_is_kept(maxtext_fixtures):
    infos = OrbaxReader(maxtext_fixtures / "llama2_scan_params" / "checkpoints" / "0" / "items").tensors()
    assert "decoder/layers/self_attention/value/kernel" in infos  # stored as .../value/kernel/value
    assert "decoder/layers/self_attention/query/kernel" in infos
    assert not any(n.endswith("/value") for n in infos)
    assert infos["token_embedder/embedding"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_reads_a_layer_slice(maxtext_fixtures):
    r = OrbaxReader(maxtext_fixtures / "llama2_scan")
    name = "params/params/decoder/layers/mlp/wi_0/kernel"
    whole = r.read(name)
    assert np.array_equal(r.read(name, (slice(None), 1)), whole[:, 1])
    assert np.array_equal(r.read(name, (slice(0, 8), 0, slice(3, 5))), whole[:8, 0, 3:5])


def test_run_dir_resolves_to_the_newest_committed_step_or_the_one_asked(maxtext_fixtures, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(maxtext_fixtures / "llama2_scan", run)
    assert sorted(committed_steps(run / "checkpoints")) == [0, 2, 4, 5]
    # an interrupted save never counts
    (run / "checkpoints" / "7.orbax-checkpoint-tmp-123").mkdir()
    # nor does a step dir without commit_success.txt (a save still in flight on an object store)
    shutil.copytree(run / "checkpoints" / "5", run / "checkpoints" / "8")
    (run / "checkpoints" / "8" / "commit_success.txt").unlink()
    assert sorted(committed_steps(run / "checkpoints")) == [0, 2, 4, 5]
    assert find_items_dir(run)[1] == 5
    assert find_items_dir(run / "checkpoints", step=2) == (run / "checkpoints" / "2" / "items", 2)
    assert find_items_dir(run / "checkpoints" / "4")[1] == 4
    with pytest.raises(CheckpointNotFoundError, match="no committed step 3; committed steps: 0, 2, 4, 5"):
        find_items_dir(run, step=3)


def test_a_directory_without_a_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointNotFoundError, match="not an Orbax checkpoint"):
        OrbaxReader(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        OrbaxReader(tmp_path / "missing")
    (tmp_path / "items").mkdir()
    (tmp_path / "items" / "_METADATA").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="not a valid Orbax metadata file"):
        OrbaxReader(tmp_path / "items")


@pytest.mark.parametrize(
    "tree",
    [[1, 2], {"(((": {"value_metadata": {"value_type": "jax.Array"}}}, {"('a',)": {"key_metadata": [1], "value_metadata": {"value_type": "jax.Array"}}}, {"('a',)": {"value_metadata": "s"}}],
    ids=["tree-not-an-object", "key-not-a-tuple", "key-metadata-not-objects", "value-metadata-not-an-object"],
)
def test_malformed_tree_metadata_is_a_clear_error(tmp_path, tree):
    (tmp_path / "items").mkdir()
    (tmp_path / "items" / "_METADATA").write_text(json.dumps({"tree_metadata": tree}))
    with pytest.raises(CorruptCheckpointError, match="_METADATA: not a valid Orbax metadata file"):
        OrbaxReader(tmp_path / "items")


@pytest.mark.parametrize("use_ocdbt", [True, False], ids=["ocdbt", "files"])
@pytest.mark.parametrize("use_zarr3", [True, False], ids=["zarr3", "zarr2"])
def test_reads_every_orbax_storage_variant(tmp_path, use_ocdbt, use_zarr3):
    rng = np.random.default_rng(0)
    tree = {
        "params": {"w": rng.standard_normal((6, 3, 5)).astype(np.float32), "b": rng.standard_normal(4).astype(ml_dtypes.bfloat16)},
        "step": np.int32(7),
    }
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)).save(tmp_path / "items", tree)
    r = OrbaxReader(tmp_path / "items")
    infos = r.tensors()
    assert set(infos) == {"params/w", "params/b", "step"}
    assert np.array_equal(r.read("params/w"), tree["params"]["w"])
    assert np.array_equal(r.read("params/w", (slice(None), 2)), tree["params"]["w"][:, 2])
    assert r.read("params/b").dtype == np.dtype(ml_dtypes.bfloat16)
    assert int(r.read("step")) == 7


@pytest.mark.parametrize("use_ocdbt", [True, False], ids=["ocdbt", "files"])
def test_local_files_are_read_mapped_and_a_truncated_one_is_one_clear_error(tmp_path, use_ocdbt):
    """Reads go through mmap (no fresh buffer per read); a data file cut short is an error, never a SIGBUS."""
    w = np.random.default_rng(2).standard_normal((8, 256, 64)).astype(np.float32)
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=True)).save(tmp_path / "items", {"w": w})
    r = OrbaxReader(tmp_path / "items")
    assert r.context["file_io_mode"].to_json() == {"mode": "memmap"}
    assert np.array_equal(r.read("w"), w) and np.array_equal(r.read("w", (3,)), w[3])
    data = max((p for p in (tmp_path / "items").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    assert data.stat().st_size > w.nbytes // 2
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match="reading array 'w' failed"):
        OrbaxReader(tmp_path / "items").read("w")


def test_a_file_system_that_cannot_map_files_is_read_plainly(tmp_path, monkeypatch):
    """Where mapped reads fail (some FUSE mounts), the reader goes back to plain reads: listing and values work."""
    w = np.arange(4 * 32, dtype=np.float32).reshape(4, 32)
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True)).save(tmp_path / "items", {"w": w})
    plain_open = OrbaxReader._open_all
    mapped_tries = []

    def unmappable(self):
        if self.context["file_io_mode"].to_json() == {"mode": "memmap"}:
            mapped_tries.append(1)
            raise CorruptCheckpointError("ENODEV: mmap not supported by this file system")
        return plain_open(self)

    monkeypatch.setattr(OrbaxReader, "_open_all", unmappable)
    r = OrbaxReader(tmp_path / "items")
    assert set(r.tensors()) == {"w"}
    assert np.array_equal(r.read("w"), w) and np.array_equal(r.read("w", (1,)), w[1])
    assert mapped_tries == [1]  # tried mapped once, plain from then on


def test_reads_are_bounded_by_the_stored_chunks(tmp_path):
    w = np.arange(64 * 4 * 32, dtype=np.float32).reshape(64, 4, 32)
    args = {"w": ocp.SaveArgs(chunk_byte_size=4096)}
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True)).save(tmp_path / "items", {"w": w}, save_args=args)
    r = OrbaxReader(tmp_path / "items")
    chunk = r.tensors()["w"].chunk_shape
    assert np.prod(chunk) * 4 <= 4096
    assert np.array_equal(r.read("w", (slice(None), 3)), w[:, 3])


def test_writer_output_restores_with_plain_orbax_into_the_maxtext_tree(tmp_path):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    stacked = rng.standard_normal((8, 3, 2, 4)).astype(np.float32)
    w = OrbaxWriter(tmp_path / "out", custom_metadata={"scan_layers": True})
    w.write("params/params/token_embedder/embedding", emb)
    w.write_pieces(
        "params/params/decoder/layers/self_attention/query/kernel",
        stacked.shape,
        stacked.dtype,
        (((slice(None), i), stacked[:, i]) for i in range(3)),
    )
    with pytest.raises(ConversionError, match="written twice"):
        w.write("params/params/token_embedder/embedding", emb)
    w.close()

    items = tmp_path / "out" / "0" / "items"
    restored = ocp.PyTreeCheckpointer().restore(items)
    expected = nest({"params/params/token_embedder/embedding": emb, "params/params/decoder/layers/self_attention/query/kernel": stacked})
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    assert np.array_equal(restored["params"]["params"]["token_embedder"]["embedding"], emb)
    assert np.array_equal(restored["params"]["params"]["decoder"]["layers"]["self_attention"]["query"]["kernel"], stacked)

    # The way MaxText's load_parameters_path restores: a target tree with shardings.
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), {"params": expected["params"]})
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=sharding), target)
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True))
    out = ckptr.restore(items, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))
    kernel = out["params"]["params"]["decoder"]["layers"]["self_attention"]["query"]["kernel"]
    assert isinstance(kernel, jax.Array) and np.array_equal(np.asarray(kernel), stacked)

    step_meta = json.loads((tmp_path / "out" / "0" / "_CHECKPOINT_METADATA").read_text())
    assert step_meta["custom_metadata"] == {"scan_layers": True}
    r = OrbaxReader(tmp_path / "out")  # maxckpt reads what it wrote, one chunk per layer piece
    assert r.tensors()["params/params/decoder/layers/self_attention/query/kernel"].chunk_shape == (8, 1, 2, 4)


def test_any_numpy_index_reads_the_same_as_numpy(tmp_path):
    w = np.arange(10 * 7 * 6, dtype=np.float32).reshape(10, 7, 6)
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True)).save(tmp_path / "items", {"w": w}, save_args={"w": ocp.SaveArgs(chunk_byte_size=256)})
    r = OrbaxReader(tmp_path / "items")
    assert r.tensors()["w"].chunk_shape != w.shape  # several chunks
    for index in [None, (3,), (-1, slice(None), 2), (slice(2, 9), slice(1, None)), (slice(None, None, 3),),
                  (slice(None), slice(None, None, -2)), (slice(5, 5),), (slice(0, 100), 6)]:
        expected = w if index is None else w[index]
        assert np.array_equal(r.read("w", index), expected), index
    with pytest.raises(IndexError):
        r.read("w", (10,))
