"""Restores land in 64-byte-aligned host buffers, which a CPU device takes without a copy (see maxckpt.compat.orbax_aligned_reads)."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

from maxckpt import CheckpointManager
from maxckpt.compat.orbax_aligned_reads import ALIGNMENT, aligned_host_buffers, aligned_zeros


@pytest.mark.parametrize("shape, dtype", [((3, 5), np.float32), ((1000,), ml_dtypes.bfloat16), ((2, 0, 4), np.int8), ((), np.float64)])
def test_aligned_zeros_are_zeros_at_an_aligned_address(shape, dtype):
    a = aligned_zeros(shape, dtype)
    assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % ALIGNMENT == 0 or a.size == 0
    assert not a.any()


def test_a_cpu_device_takes_an_aligned_buffer_without_copying_it():
    host = aligned_zeros((256, 256), np.float32)
    on_device = jax.device_put(host, jax.devices("cpu")[0])
    assert on_device.unsafe_buffer_pointer() == host.ctypes.data  # aliased: the copy Orbax's restore paid is gone
    raw = np.zeros(256 * 256 * 4 + 2 * ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT + 16  # 16 bytes past an aligned address, as numpy's large buffers are
    plain = raw[start:start + 256 * 256 * 4].view(np.float32).reshape(256, 256)
    assert plain.ctypes.data % ALIGNMENT == 16
    assert jax.device_put(plain, jax.devices("cpu")[0]).unsafe_buffer_pointer() != plain.ctypes.data


def test_restores_read_through_the_aligned_reader_and_orbax_is_left_as_it_was(tmp_path):
    from orbax.checkpoint._src.serialization import serialization

    original = serialization._read_shard
    seen = []

    rng = np.random.default_rng(0)
    state = {"w": jax.numpy.asarray(rng.standard_normal((64, 48), dtype=np.float32)),
             "b": jax.numpy.asarray(rng.standard_normal((48,), dtype=np.float32)).astype(jax.numpy.bfloat16)}
    with CheckpointManager(tmp_path / "run", async_save=False) as mgr:
        mgr.save(0, state)
        mgr.wait()
        with aligned_host_buffers() as patched:
            assert patched  # this Orbax has the reader the patch expects
            inner = serialization._read_shard

            async def spy(*args, **kwargs):
                out = await inner(*args, **kwargs)
                seen.append(out.ctypes.data % ALIGNMENT)
                return out

            serialization._read_shard = spy
            try:
                restored = mgr.restore()
            finally:
                serialization._read_shard = inner
    assert serialization._read_shard is original
    assert sorted(seen) == [0, 0]  # both arrays were read into aligned buffers
    for key, value in state.items():
        assert restored[key].dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(restored[key]), np.asarray(value))
