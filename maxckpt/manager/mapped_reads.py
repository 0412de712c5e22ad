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
cores a cold restore has 2 reads in flight. Allowing 8 copies at once made
cold restores faster here (1.07-1.45 s against 1.16-1.79 s, 10 of 10 pairs)
but is not done: the copy threads also decompress, and with zstd chunks
(MaxText's) each one holds a decoded chunk, so a 2 GiB float32 restore in
512 MiB zstd chunks peaked at 4.2 GB instead of 3.1-3.2 GB, and MaxText's
chunks go up to 2 GiB. Machines with 8 or more cores have that many already.

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
import inspect
import mmap
import os
from typing import Any

import tensorstore as ts

from maxckpt.containers.orbax import context_with_mapped_reads
from maxckpt.manager.shared_patch import SharedPatch
from maxckpt.storage.urls import split_url

_EXPECTED = ["use_ocdbt", "file_io_concurrency_limit", "data_copy_concurrency_limit"]


def _tensorstore_utils() -> Any:
    try:
        from orbax.checkpoint._src.serialization import tensorstore_utils
    except ImportError:
        return None
    fn = getattr(tensorstore_utils, "get_ts_context", None)
    if fn is None or list(inspect.signature(fn).parameters) != _EXPECTED:
        return None
    return tensorstore_utils


def _get_ts_context(**kwargs: Any) -> ts.Context:
    """Orbax's context, reading local files through mmap."""
    return context_with_mapped_reads(_patch.original(**kwargs).spec.to_json())


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


def mapped_file_reads(items_dir: str | os.PathLike) -> contextlib.AbstractContextManager[bool]:
    """Within this block Orbax restores read local files through mmap; yields whether they do.

    Nothing changes for a bucket, a folder whose files cannot be mapped, or an Orbax without the expected factory.
    """
    return _patch.applied(_tensorstore_utils() if can_map(items_dir) else None)
