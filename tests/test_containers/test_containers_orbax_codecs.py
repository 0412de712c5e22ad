"""Telling compressed Orbax checkpoints from uncompressed ones (maxckpt.containers.orbax_codecs)."""

from __future__ import annotations

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from maxckpt import CheckpointConfig, CheckpointManager
from maxckpt.containers.orbax_codecs import is_compressed, stores_compressed_chunks

BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
ZSTD = {"name": "zstd", "configuration": {"level": 3}}


def sharded(*inner):
    return {"name": "sharding_indexed", "configuration": {"chunk_shape": [4], "codecs": [BYTES, *inner],
                                                           "index_codecs": [BYTES, {"name": "crc32c"}]}}


@pytest.mark.parametrize(
    ("metadata", "compressed"),
    [
        ({"zarr_format": 3, "codecs": [BYTES]}, False),
        ({"zarr_format": 3, "codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES]}, False),
        ({"zarr_format": 3, "codecs": [BYTES, ZSTD]}, True),
        ({"zarr_format": 3, "codecs": [BYTES, {"name": "gzip", "configuration": {"level": 5}}]}, True),
        ({"zarr_format": 3, "codecs": [sharded()]}, False),  # Orbax's layout: chunks inside a shard
        ({"zarr_format": 3, "codecs": [sharded(ZSTD)]}, True),  # ... compressed inside the shard
        ({"zarr_format": 2, "compressor": None, "filters": None}, False),
        ({"zarr_format": 2, "compressor": {"id": "zstd", "level": 1}, "filters": None}, True),
        ({"zarr_format": 2, "compressor": None, "filters": [{"id": "delta", "dtype": "<f4"}]}, True),
    ],
)
def test_codecs_that_only_arrange_bytes_are_not_compression(metadata, compressed):
    assert is_compressed(metadata) is compressed


@pytest.mark.parametrize("compression", ["false", "true"])
def test_a_maxckpt_save_is_told_by_its_compression_setting(tmp_path, compression):
    config = CheckpointConfig().with_overrides(maxckpt_storage_compression=compression)
    state = {"w": jax.numpy.ones((64, 128), jax.numpy.float32), "b": jax.numpy.zeros((16,), jax.numpy.bfloat16)}
    with CheckpointManager(tmp_path / "run", async_save=False, config=config) as mgr:
        mgr.save(0, state)
        mgr.wait()
    assert stores_compressed_chunks(tmp_path / "run" / "0" / "items") is (compression == "true")


@pytest.mark.parametrize("use_zarr3", [True, False])
def test_plain_orbax_without_ocdbt_is_read_from_its_array_folders(tmp_path, use_zarr3):
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=use_zarr3)
    ocp.Checkpointer(handler).save(tmp_path / "items", {"w": np.arange(64, dtype=np.float32)})
    assert not (tmp_path / "items" / "manifest.ocdbt").exists()
    # Orbax compresses these (zstd for zarr3, its zarr v2 default compressor otherwise).
    assert stores_compressed_chunks(tmp_path / "items") is True


def test_checkpoints_maxtext_wrote_are_compressed(maxtext_fixtures):
    items = sorted(maxtext_fixtures.glob("*/checkpoints/*/items"))
    assert items
    for folder in items:
        assert stores_compressed_chunks(folder) is True, folder


def test_a_folder_without_arrays_cannot_be_told(tmp_path):
    (tmp_path / "_METADATA").write_text("{}")
    assert stores_compressed_chunks(tmp_path) is None
    assert stores_compressed_chunks(tmp_path / "missing") is None
