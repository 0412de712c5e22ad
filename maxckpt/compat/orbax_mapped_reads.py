"""While a restore is inside :func:`mapped_reads`, Orbax's TensorStore contexts read local files through mmap.

Why: Orbax builds every restore's context itself (`tensorstore_utils.get_ts_context`), and that context reads
each chunk with `pread` into a fresh buffer, copying every byte twice; mapped reads copy it once.
Which restores read this way, and with how many copies at once, is the manager's choice
(:mod:`maxckpt.manager.mapped_reads`); measurements in docs/design/mapped-reads.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os
from collections.abc import Iterator
from typing import Any

import tensorstore as ts

from maxckpt.compat.shared_patch import SharedPatch, orbax_module_with
from maxckpt.compat.tensorstore import context_with_mapped_reads
from maxckpt.storage.urls import split_url

_EXPECTED = ["use_ocdbt", "file_io_concurrency_limit", "data_copy_concurrency_limit"]
# The copy limit of the restore running in this thread (None: TensorStore's default); each restore sets its own.
_copy_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("maxckpt_copy_limit", default=None)


def _tensorstore_utils() -> Any:
    """Orbax's tensorstore_utils if its `get_ts_context` is the one this was written for, else None."""
    return orbax_module_with("orbax.checkpoint._src.serialization.tensorstore_utils", "get_ts_context", _EXPECTED)


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


@contextlib.contextmanager
def mapped_reads(copy_limit: int | None = None) -> Iterator[bool]:
    """Within this block Orbax restores read local files through mmap; yields whether they do.

    `copy_limit`: chunk copies at once for the restores of this thread (None: TensorStore's default).
    Nothing is patched for an Orbax without the expected factory, or another release than 0.12.
    """
    module = _tensorstore_utils()
    token = _copy_limit.set(copy_limit if module is not None else None)
    try:
        with _patch.applied(module) as applied:
            yield applied
    finally:
        _copy_limit.reset(token)
