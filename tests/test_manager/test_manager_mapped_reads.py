"""Restores read local files through mmap (see maxckpt.compat.orbax_mapped_reads), and get the same arrays."""

from __future__ import annotations

import os
import threading

import jax
import numpy as np
import pytest
import tensorstore as ts

from maxckpt import CheckpointConfig, CheckpointManager
from maxckpt.compat.shared_patch import SharedPatch
from maxckpt.manager.mapped_reads import mapped_file_reads


def mapped_bytes() -> int:
    """Bytes TensorStore has mapped from files in this process so far (its own counter)."""
    for metric in ts.experimental_collect_matching_metrics("/tensorstore/file/mmap_bytes"):
        return sum(v.get("value", 0) for v in metric["values"])
    return 0


@pytest.mark.parametrize("compression", ["false", "true"])
def test_a_restore_maps_the_files_and_returns_the_saved_arrays(tmp_path, compression, monkeypatch):
    from orbax.checkpoint._src.serialization import tensorstore_utils

    from maxckpt.compat import orbax_mapped_reads
    from maxckpt.manager import mapped_reads

    specs, make_context = [], orbax_mapped_reads.context_with_mapped_reads
    monkeypatch.setattr(orbax_mapped_reads, "context_with_mapped_reads", lambda spec: specs.append(spec) or make_context(spec))

    original = tensorstore_utils.get_ts_context
    rng = np.random.default_rng(0)
    state = {
        "w": jax.numpy.asarray(rng.standard_normal((256, 512), dtype=np.float32)),
        "b": jax.numpy.asarray(rng.standard_normal((4096,), dtype=np.float32)).astype(jax.numpy.bfloat16),
    }
    config = CheckpointConfig().with_overrides(maxckpt_storage_compression=compression)
    with CheckpointManager(tmp_path / "run", async_save=False, config=config) as mgr:
        mgr.save(0, state)
        mgr.wait()
        before = mapped_bytes()
        restored = mgr.restore()
        after = mapped_bytes()
    assert tensorstore_utils.get_ts_context is original  # Orbax is left as it was
    # The large array's chunk was read through a mapping, not into a fresh buffer (TensorStore maps reads
    # of large values only: the 8 KiB array is read as before). zstd keeps random floats at >= 90% of their size.
    assert after - before >= state["w"].nbytes * (0.9 if compression == "true" else 1.0)
    for key, value in state.items():
        assert restored[key].dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(restored[key]), np.asarray(value))
    # Uncompressed chunks are copied many at once (no decode buffer each); compressed ones a thread per core.
    limits = {str(spec.get("data_copy_concurrency")) for spec in specs}
    expected = {"limit": max(mapped_reads.UNCOMPRESSED_COPIES_IN_FLIGHT, os.cpu_count())} if compression == "false" else None
    assert specs and limits == {str(expected)}


def test_a_restore_in_another_thread_keeps_its_own_copy_limit(tmp_path):
    """Two restores at once (the two tiers, a user's threads) each see the limit of their own checkpoint.

    The second one in finds the first one's factory in place and joins it, so it keeps mapped reads after
    the first one leaves.
    """
    from orbax.checkpoint._src.serialization import tensorstore_utils

    original = tensorstore_utils.get_ts_context

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for folder, compression in ((plain, "false"), (packed, "true")):
        config = CheckpointConfig().with_overrides(maxckpt_storage_compression=compression)
        with CheckpointManager(folder, async_save=False, config=config) as mgr:
            mgr.save(0, {"w": jax.numpy.ones((64, 64), jax.numpy.float32)})
            mgr.wait()
    inside, may_leave, seen = threading.Event(), threading.Event(), {}

    def packed_restore():
        with mapped_file_reads(packed / "0" / "items"):
            inside.set()
            may_leave.wait(5)
            seen["packed"] = tensorstore_utils.get_ts_context(use_ocdbt=True).spec.to_json().get("data_copy_concurrency")

    thread = threading.Thread(target=packed_restore)
    thread.start()
    inside.wait(5)
    with mapped_file_reads(plain / "0" / "items") as joined:
        may_leave.set()
        thread.join(5)
        spec = tensorstore_utils.get_ts_context(use_ocdbt=True).spec.to_json()
        seen["plain"] = spec.get("data_copy_concurrency")
    assert joined and spec["file_io_mode"] == {"mode": "memmap"}
    assert tensorstore_utils.get_ts_context is original
    assert seen == {"packed": None, "plain": {"limit": max(16, os.cpu_count())}}


def test_without_the_patch_orbax_reads_into_buffers(tmp_path):
    """The counter above is what tells the two apart: Orbax's own context maps nothing."""
    with CheckpointManager(tmp_path / "run", async_save=False) as mgr:
        mgr.save(0, {"w": jax.numpy.ones((256, 512), jax.numpy.float32)})
        mgr.wait()
        import orbax.checkpoint as ocp

        before = mapped_bytes()

        restored = ocp.PyTreeCheckpointer().restore(tmp_path / "run" / "0" / "items")
        assert mapped_bytes() == before
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.ones((256, 512), np.float32))


def test_mapped_file_reads_nest_and_undo(tmp_path):
    from orbax.checkpoint._src.serialization import tensorstore_utils

    original = tensorstore_utils.get_ts_context
    (tmp_path / "_METADATA").write_text("{}")
    with mapped_file_reads(tmp_path) as outer:
        assert outer and tensorstore_utils.get_ts_context is not original
        with mapped_file_reads(tmp_path):
            spec = tensorstore_utils.get_ts_context(use_ocdbt=True, file_io_concurrency_limit=7).spec.to_json()
            asked = tensorstore_utils.get_ts_context(use_ocdbt=False, data_copy_concurrency_limit=3).spec.to_json()
        assert tensorstore_utils.get_ts_context is not original  # the outer user still needs it
    assert tensorstore_utils.get_ts_context is original
    assert spec["file_io_mode"] == {"mode": "memmap"}
    assert spec["file_io_concurrency"] == {"limit": 7}  # Orbax's own settings are kept
    assert "cache_pool#ocdbt" in spec
    assert "data_copy_concurrency" not in spec  # TensorStore's default (a thread per core): see mapped_reads
    assert asked["data_copy_concurrency"] == {"limit": 3} and asked["file_io_mode"] == {"mode": "memmap"}


def test_a_shared_patch_is_undone_by_the_last_user_out_whatever_the_order():
    class Module:
        fn = "original"

    patch = SharedPatch("fn", "replacement")
    first_in, second_in, first_may_leave = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with patch.applied(Module):
            first_in.set()
            first_may_leave.wait(5)
            seen.append(("first leaves", Module.fn))

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with patch.applied(Module):
        second_in.set()
        first_may_leave.set()
        thread.join(5)
        seen.append(("second inside after first left", Module.fn))
    seen.append(("all out", Module.fn))
    assert seen == [
        ("first leaves", "replacement"),
        ("second inside after first left", "replacement"),
        ("all out", "original"),
    ]
    assert patch.original == "original"
    with patch.applied(None) as applied:  # an Orbax without the attribute: nothing patched, the caller told so
        assert applied is False and Module.fn == "original"


def test_a_folder_whose_files_cannot_be_mapped_is_read_as_before(tmp_path):
    """A FUSE mount with direct I/O refuses mmap (ENODEV), as a FIFO does: no mapped reads there."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    from maxckpt.compat.orbax_mapped_reads import can_map

    original = tensorstore_utils.get_ts_context
    mappable, refusing, empty = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (mappable, refusing, empty):
        folder.mkdir()
    (mappable / "_METADATA").write_text("{}")
    os.mkfifo(refusing / "_METADATA")
    (empty / "_METADATA").write_bytes(b"")
    assert can_map(mappable)
    assert not can_map(refusing) and not can_map(empty) and not can_map(tmp_path / "missing")
    assert not can_map("gs://bucket/run/0/items") and not can_map("s3://bucket/run/0/items")
    with mapped_file_reads(refusing) as applied:
        assert applied is False and tensorstore_utils.get_ts_context is original
