"""Files on a disk or objects in a bucket: list, read, write, delete, one call each.

Each function picks the store of its path once (:func:`maxckpt.storage.store.store_for`)
and hands the call over: the same file operations for local paths (os) and URLs
(gcsfs and s3fs, with transient errors retried). Buckets are flat and cannot
rename (see :mod:`maxckpt.storage.bucket_store`); callers that need more than
one call on one path may take the store itself.

>>> write_bytes("gs://bucket/run/export/model.safetensors.index.json", b"{}")   # doctest: +SKIP
>>> list_names("gs://bucket/run/export")                                        # doctest: +SKIP
['model.safetensors.index.json']
"""

from __future__ import annotations

import os
from typing import IO, Iterable

from maxckpt.storage.bucket_store import DELETE_BATCH, DELETE_WORKERS
from maxckpt.storage.store import store_for

# Range-read block for streaming reads: large enough to amortise a request, small enough to stay flat in RSS.
READ_BLOCK = 16 * 1024 * 1024
# Parallel ranged GETs: each part is one request (bucket_store.READ_FANOUT of them are in flight at once).
RANGE_PART = 8 * 1024 * 1024


def exists(path: str | os.PathLike) -> bool:
    """Whether an object (or a non-empty prefix, or a local file/folder) exists at `path`."""
    return store_for(path).exists(path)


def is_file(path: str | os.PathLike) -> bool:
    """Whether an object (not a prefix) exists at `path`; for a local path, a regular file or other non-folder."""
    return store_for(path).is_file(path)


def is_dir(path: str | os.PathLike) -> bool:
    """A local folder, or a bucket prefix with at least one object below it."""
    return store_for(path).isdir(path)


def fingerprint(path: str | os.PathLike) -> dict[str, str] | None:
    """What identifies this very version of an object (or local file): size plus the store's version fields
    (GCS generation, S3 ETag and time); None when absent. Another write of the same name changes it."""
    return store_for(path).fingerprint(path)


def list_names(path: str | os.PathLike) -> list[str]:
    """Names of the entries one level below `path` (objects and prefixes), sorted; [] when absent."""
    return store_for(path).listdir(path)


def find_files(path: str | os.PathLike) -> list[str]:
    """Every object (file) below `path`, recursively, as URLs or local paths; [] when absent."""
    return store_for(path).find(path)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The whole content of a (small) object or file."""
    return store_for(path).read(path)


def size(path: str | os.PathLike) -> int:
    """Bytes of one object or file."""
    return store_for(path).size(path)


def mtime(path: str | os.PathLike) -> float:
    """Last-modified time of a file or object (seconds since the epoch); OSError when it is absent.

    A bucket "folder" has no time of its own: OSError, so callers fall back to a file inside.
    """
    return store_for(path).mtime(path)


def read_into(path: str | os.PathLike, offset: int, out: memoryview, *, part: int = RANGE_PART) -> int:
    """Fill `out` with the bytes of `path` from `offset`; returns how many arrived.

    On a bucket a large read becomes parallel ranged GETs of `part` bytes
    (fsspec's cat_ranges runs them concurrently), so one tensor streams at the
    store's aggregate bandwidth, with memory bounded by `out` itself.
    """
    if not len(out):
        return 0
    return store_for(path).read_into(path, offset, out, part)


def require_bucket(path: str | os.PathLike) -> None:
    """Raise StorageError unless the bucket of URL `path` exists (a clear message before any write)."""
    store_for(path).require_bucket(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write a (small) object or file in one request: markers, indexes, trackers."""
    store_for(path).write(path, data)


def write_whole(path: str | os.PathLike, data: bytes) -> None:
    """Write a small file whole or not at all (locally a temporary, fsynced and renamed; an object is always whole)."""
    store_for(path).write_whole(path, data)


def open_read(path: str | os.PathLike, block_size: int = READ_BLOCK) -> IO[bytes]:
    """A seekable binary reader; on a bucket each buffer refill is one ranged GET."""
    return store_for(path).open_read(path, block_size)


def open_write(path: str | os.PathLike) -> IO[bytes]:
    """A binary writer; on a bucket it streams as a multipart upload, visible only once closed."""
    return store_for(path).open_write(path)


def delete_files(paths: Iterable[str], *, batch: int = DELETE_BATCH, workers: int = DELETE_WORKERS) -> int:
    """Delete objects in parallel batches (already-missing ones are fine); returns how many were asked.

    All `paths` must be on one store. Local paths are removed one by one.
    """
    paths = list(paths)
    if paths:
        store_for(paths[0]).remove(paths, batch=batch, workers=workers)
    return len(paths)


def rmtree(path: str | os.PathLike) -> None:
    """Remove a folder and everything below it (a prefix's objects, in parallel batches)."""
    store_for(path).rmtree(path)


def total_bytes(path: str | os.PathLike) -> int:
    """Bytes of every object (file) below `path`; 0 when absent. One listing on a bucket."""
    return store_for(path).total_bytes(path)
