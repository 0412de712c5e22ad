"""Restores read local checkpoint files through mmap, not into a fresh buffer per chunk.

Why: Orbax opens every array with a TensorStore context of its own making
(`tensorstore_utils.get_ts_context`), which reads each stored chunk with
`pread` into a newly allocated buffer and then copies it into the restored
array: every byte is copied twice, and the first copy lands in memory the
kernel must fault in and zero first. With `file_io_mode: memmap` TensorStore
decodes straight from the page cache's mapped pages, so the one copy left is
the one into the restored array, as in a plain `read()`. On the 2-core VM a
1 GiB bf16 restore took 0.24-0.30 s instead of 0.54-0.63 s from the page cache
(a raw read of the same bytes: 0.31 s) and half the CPU time from the disk,
with a seventh of the page faults (docs/manager.md).
The conversion reader has read this way since issue 13 (`shared_context`).

Reading through a mapping moves the wait for the disk from TensorStore's file
I/O threads (Orbax allows 128) to its copy threads (one per core by
default): each copy stalls on page faults until its pages arrive, so on 2
cores a cold restore had 2 reads in flight, and a cold 1 GiB restore ran at
half the speed of a parallel raw read. A checkpoint whose chunks are all
stored uncompressed (maxckpt's default) is therefore restored with
:data:`UNCOMPRESSED_COPIES_IN_FLIGHT` copies at once (or a thread per core,
if more): those copies go from the mapped pages straight into the restored
arrays and hold no buffer of their own. Compressed checkpoints (MaxText's
zstd) keep TensorStore's default: there the copy threads also decompress,
each into a decoded chunk of its own, and 8 at once took a 2 GiB float32
restore in 512 MiB zstd chunks from 3.1-3.2 GB to a 4.2 GB peak (MaxText's
chunks go up to 2 GiB).

While :func:`mapped_file_reads` is active, Orbax's context factory returns
the same context with mapped reads (:func:`context_with_mapped_reads`).
Buckets are not files: their reads are unchanged. A file system that
cannot map files (a FUSE mount with direct I/O, say) would fail every mapped
read, so the checkpoint's own `_METADATA` is mapped first (:func:`can_map`)
and such a folder is read as before; every process of a job sees the same
mount, so all of them restore the same way. An Orbax without the factory, or
with a different one, is left alone and restores as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import mmap
import os
from collections.abc import Iterator
from typing import Any

import tensorstore as ts

from maxckpt.containers.orbax import context_with_mapped_reads
from maxckpt.containers.orbax_codecs import stores_compressed_chunks
from maxckpt.manager.shared_patch import SharedPatch
from maxckpt.storage.urls import split_url

_EXPECTED = ["use_ocdbt", "file_io_concurrency_limit", "data_copy_concurrency_limit"]
# Copies in flight for an uncompressed checkpoint. On the 2-core VM, 1 GiB bf16 in 8 arrays (benchmarks/save.py,
# 3 rounds): cold restore 1.43 s with 2 (0.50x of a parallel raw read), 0.98 s with 8, 0.88 s with 16 (0.74-0.81x).
UNCOMPRESSED_COPIES_IN_FLIGHT = 16
# The copy limit of the restore running in this thread (None: TensorStore's default); each restore sets its own.
_copy_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("maxckpt_copy_limit", default=None)


def _tensorstore_utils() -> Any:
    try:
        from orbax.checkpoint._src.serialization import tensorstore_utils
    except ImportError:
        return None
    fn = getattr(tensorstore_utils, "get_ts_context", None)
    if fn is None or list(inspect.signature(fn).parameters) != _EXPECTED:
        return None
    return tensorstore_utils


def _get_ts_context(
    *,
    use_ocdbt: bool = True,
    file_io_concurrency_limit: int | None = None,
    data_copy_concurrency_limit: int | None = None,
) -> ts.Context:
    """Orbax's context, reading local files through mmap, with this restore's copy limit unless Orbax set one.

    Its signature is Orbax's own, so a restore that starts while another has
    it in place finds the factory it expects and joins the patch.
    """
    spec = _patch.original(
        use_ocdbt=use_ocdbt,
        file_io_concurrency_limit=file_io_concurrency_limit,
        data_copy_concurrency_limit=data_copy_concurrency_limit,
    ).spec.to_json()
    limit = _copy_limit.get()
    if limit is not None and "data_copy_concurrency" not in spec:
        spec["data_copy_concurrency"] = {"limit": limit}
    return context_with_mapped_reads(spec)


_patch = SharedPatch("get_ts_context", _get_ts_context)


def can_map(items_dir: str | os.PathLike) -> bool:
    """Whether the file system of a local checkpoint folder lets files be mapped (False for buckets)."""
    if split_url(items_dir).scheme:
        return False
    probe = os.path.join(os.fspath(items_dir), "_METADATA")  # written by every Orbax save, never empty
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        mmap.mmap(fd, 0, access=mmap.ACCESS_READ).close()
        return True
    except (OSError, ValueError):  # ENODEV from a FUSE mount with direct I/O; ValueError: an empty file
        return False
    finally:
        os.close(fd)


def copies_in_flight(items_dir: str | os.PathLike) -> int | None:
    """How many chunk copies a mapped restore of `items_dir` may run at once; None: TensorStore's default (a thread per core)."""
    if stores_compressed_chunks(items_dir) is not False:
        return None
    return max(UNCOMPRESSED_COPIES_IN_FLIGHT, os.cpu_count() or 1)


@contextlib.contextmanager
def mapped_file_reads(items_dir: str | os.PathLike) -> Iterator[bool]:
    """Within this block Orbax restores read local files through mmap; yields whether they do.

    Nothing changes for a bucket, a folder whose files cannot be mapped, or an Orbax without the expected factory.
    """
    module = _tensorstore_utils() if can_map(items_dir) else None
    token = _copy_limit.set(copies_in_flight(items_dir) if module is not None else None)
    try:
        with _patch.applied(module) as applied:
            yield applied
    finally:
        _copy_limit.reset(token)
