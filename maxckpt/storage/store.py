"""The one seam between maxckpt and where bytes live: a small store protocol, chosen once from the path.

Modelled on TorchTitan's ``CheckpointStorage``: the operations checkpoints
need (exists, isdir, listdir, read, write, remove, and a few more for
streaming, sizes and versions) behind one :class:`Store`, with a local
implementation (:class:`~maxckpt.storage.local_store.LocalStore`) and a
bucket one (:class:`~maxckpt.storage.bucket_store.BucketStore`, ``gs://`` and
``s3://``). :func:`store_for` is the only place that picks one, by
:func:`~maxckpt.storage.urls.is_url`; everything else calls the store it got
(or :mod:`maxckpt.storage.objects`, which does so for one call).

>>> store_for("/tmp/run").exists("/tmp")
True
"""

from __future__ import annotations

import os
from typing import IO, Iterable, Protocol

from maxckpt.storage.bucket_store import BucketStore
from maxckpt.storage.local_store import LocalStore
from maxckpt.storage.urls import is_url


class Store(Protocol):
    """Where the files of a checkpoint live. Paths are local paths or URLs of the store's own kind."""

    def exists(self, path: str | os.PathLike) -> bool:
        """Whether a file, object, folder or non-empty prefix is at `path`."""

    def isdir(self, path: str | os.PathLike) -> bool:
        """A folder, or a prefix with at least one object below it."""

    def is_file(self, path: str | os.PathLike) -> bool:
        """A file or object (not a folder or prefix)."""

    def listdir(self, path: str | os.PathLike) -> list[str]:
        """Names one level below `path`, sorted; [] when absent."""

    def find(self, path: str | os.PathLike) -> list[str]:
        """Every file below `path`, recursively, as full paths or URLs; [] when absent."""

    def read(self, path: str | os.PathLike) -> bytes:
        """The whole content of a (small) file."""

    def read_into(self, path: str | os.PathLike, offset: int, out: memoryview, part: int) -> int:
        """Fill `out` from `offset`; returns how many bytes arrived."""

    def write(self, path: str | os.PathLike, data: bytes) -> None:
        """Write a (small) file in one request."""

    def write_whole(self, path: str | os.PathLike, data: bytes) -> None:
        """Write a small file so that a crash leaves the old content or the new, never a truncated one."""

    def open_read(self, path: str | os.PathLike, block_size: int) -> IO[bytes]:
        """A seekable binary reader."""

    def open_write(self, path: str | os.PathLike) -> IO[bytes]:
        """A binary writer (on a bucket: visible only once closed)."""

    def remove(self, paths: Iterable[str], *, batch: int = ..., workers: int = ...) -> None:
        """Remove files (already-missing ones are fine)."""

    def rmtree(self, path: str | os.PathLike) -> None:
        """Remove a folder and everything below it."""

    def size(self, path: str | os.PathLike) -> int:
        """Bytes of one file."""

    def mtime(self, path: str | os.PathLike) -> float:
        """Last-modified time of a file (seconds since the epoch); OSError when absent."""

    def total_bytes(self, path: str | os.PathLike) -> int:
        """Bytes of every file below `path`; 0 when absent."""

    def fingerprint(self, path: str | os.PathLike) -> dict[str, str] | None:
        """What identifies this very version of a file (another write of the name changes it); None when absent."""

    def require_bucket(self, path: str | os.PathLike) -> None:
        """Raise StorageError when the bucket of `path` does not exist (nothing to check locally)."""


LOCAL: Store = LocalStore()
BUCKETS: Store = BucketStore()


def store_for(path: str | os.PathLike) -> Store:
    """The store `path` lives in: the bucket store for a ``scheme://`` URL, the local one otherwise.

    >>> type(store_for("gs://bucket/run")).__name__
    'BucketStore'
    """
    return BUCKETS if is_url(path) else LOCAL
