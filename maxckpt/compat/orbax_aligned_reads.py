"""Restores read each array into a 64-byte-aligned host buffer, so a CPU device takes it without a copy.

Why: Orbax reads every shard into a fresh `np.zeros` buffer, whose data sits 16 bytes past a page boundary,
and JAX's CPU client aliases a host buffer only at a 64-byte-aligned address: every restore paid one more full
copy of the state. While :func:`aligned_host_buffers` is active, Orbax's shard reader
(`serialization._read_shard`, signature checked first) allocates the same zero-filled buffer aligned; on GPU and
TPU it costs nothing. Measurements in docs/design/aligned-reads.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from maxckpt.compat.shared_patch import SharedPatch, orbax_module_with

ALIGNMENT = 64  # what XLA's CPU client needs to alias a host buffer (tsl::Allocator::kAllocatorAlignment)
_EXPECTED = ["t", "new_shard_shape", "dtype", "requested_domain", "restricted_domain"]


def aligned_zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """`np.zeros(shape, dtype)` whose data starts at a multiple of ALIGNMENT (calloc'd: zero pages are free)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(tuple(shape))


def _serialization() -> Any:
    """Orbax's serialization module if its `_read_shard` is the one this was written for, else None."""
    module = "orbax.checkpoint._src.serialization.serialization"
    return orbax_module_with(module, "_read_shard", _EXPECTED, coroutine=True)


async def _read_shard(t, *, new_shard_shape, dtype, requested_domain, restricted_domain) -> np.ndarray:
    """Orbax's `_read_shard` (orbax-checkpoint 0.11 and 0.12), with the buffer allocated aligned."""
    import asyncio

    import tensorstore as ts

    out = aligned_zeros(new_shard_shape, t.dtype.numpy_dtype)
    await ts.array(out)[ts.d[:].translate_to[requested_domain.origin]][restricted_domain].write(t[restricted_domain])
    if dtype is not None:
        out = await asyncio.to_thread(lambda: out.astype(dtype, copy=False))
    return out


_patch = SharedPatch("_read_shard", _read_shard)


def aligned_host_buffers() -> contextlib.AbstractContextManager[bool]:
    """Within this block Orbax restores read into aligned buffers; yields whether the patch applies here.

    Nothing is patched for an Orbax without the expected `_read_shard`, or another release than 0.12.
    """
    return _patch.applied(_serialization())
