"""What the manager writes: OCDBT + zarr3 arrays that plain Orbax restores, zstd only when asked.

`maxckpt_storage_compression` decides the codec chain of every saved array
(off by default: saves run at the disk's speed; on: zstd level 3 as MaxText
writes). Either way the checkpoint must be one that plain Orbax, without
maxckpt, restores bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from maxckpt import CheckpointManager, load_config
from maxckpt.config import bundled_configs_dir
from maxckpt.errors import ConfigError
from orbax_checks import chunk_shape, codecs, plain_orbax_restore


def _state() -> dict:
    rng = np.random.default_rng(7)
    return {
        "params": {
            "dense": {"kernel": jax.numpy.asarray(rng.standard_normal((64, 32), dtype=np.float32))},
            "embed": jax.numpy.asarray(rng.standard_normal((128, 16), dtype=np.float32)).astype(jax.numpy.bfloat16),
        },
        "step": jax.numpy.asarray(3, dtype=jax.numpy.int32),
    }


@pytest.mark.parametrize("compression", [False, True])
def test_saved_arrays_use_the_configured_codecs_and_plain_orbax_restores_them(tmp_path: Path, compression: bool) -> None:
    cfg = load_config(
        bundled_configs_dir() / "base.yml",
        f"base_output_directory={tmp_path}", "run_name=fmt", f"maxckpt_storage_compression={compression}",
    )
    state = _state()
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.save(0, state, force=True)
        mgr.wait()
    items = tmp_path / "fmt" / "checkpoints" / "0" / "items"
    assert (items / "manifest.ocdbt").is_file()  # OCDBT, as MaxText writes
    want = ["bytes", "zstd"] if compression else ["bytes"]
    assert codecs(items, "params.dense.kernel") == want
    assert codecs(items, "params.embed") == want

    restored = plain_orbax_restore(items)
    expected = jax.tree_util.tree_map(np.asarray, state)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(expected)
    for got, exp in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(expected)):
        assert np.asarray(got).dtype == exp.dtype
        np.testing.assert_array_equal(np.asarray(got), exp)


def test_compression_is_off_by_default_and_must_be_a_boolean(tmp_path: Path) -> None:
    assert load_config(bundled_configs_dir() / "base.yml").maxckpt_storage_compression is False
    with pytest.raises(ConfigError, match="maxckpt_storage_compression"):
        load_config(bundled_configs_dir() / "base.yml", "maxckpt_storage_compression=maybe")


def _data_files(items: Path) -> list[int]:
    """Sizes of the OCDBT data files Orbax wrote for process 0."""
    return sorted(p.stat().st_size for p in (items / "ocdbt.process_0" / "d").iterdir())


@pytest.mark.parametrize("target", [1024**2, 2 * 1024**3])
def test_target_data_file_size_bounds_data_files_and_chunks(tmp_path: Path, target: int) -> None:
    """Four 1.5 MiB arrays: a 1 MiB target keeps them in separate data files, with 1 MiB chunks; 2 GiB packs them."""
    cfg = load_config(
        bundled_configs_dir() / "base.yml",
        f"base_output_directory={tmp_path}", "run_name=files",
        f"checkpoint_storage_target_data_file_size_bytes={target}",
    )
    rng = np.random.default_rng(1)
    state = {"params": {f"w{i}": jax.numpy.asarray(rng.standard_normal((384, 1024), dtype=np.float32)) for i in range(4)}}
    with CheckpointManager.from_config(cfg) as mgr:
        mgr.save(0, state, force=True)
    items = tmp_path / "files" / "checkpoints" / "0" / "items"
    sizes = _data_files(items)
    big = [size for size in sizes if size > 1024**2]
    if target == 1024**2:
        # No data file holds more than one array (1.5 MiB): a file is closed once past the target, so the
        # 6 MiB of arrays lie in 4 or more files (TensorStore may also split one array's two chunks).
        array_bytes = 384 * 1024 * 4
        assert max(sizes) < array_bytes + 4096 and sum(s for s in sizes if s > 4096) >= 4 * array_bytes, sizes
        assert chunk_shape(items, "params.w0") != [384, 1024]  # chunks of at most 1 MiB
    else:
        assert len(big) < 4 and max(big) > 3 * 1024**2  # arrays packed together (TensorStore batches writes)
        assert chunk_shape(items, "params.w0") == [384, 1024]
    restored = plain_orbax_restore(items)
    for key, value in state["params"].items():
        np.testing.assert_array_equal(restored["params"][key], np.asarray(value))


def test_default_data_file_size_is_64_mib() -> None:
    cfg = load_config(bundled_configs_dir() / "base.yml")
    assert cfg.checkpoint_storage_target_data_file_size_bytes == 64 * 1024**2
