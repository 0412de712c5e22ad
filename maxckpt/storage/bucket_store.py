"""``gs://`` and ``s3://`` buckets behind the :class:`~maxckpt.storage.store.Store` protocol.

Buckets are flat: a "folder" is a key prefix, a listing is one level of
prefixes, nothing can be renamed atomically, and deleting a checkpoint means
deleting each of its objects. The fsspec clients (gcsfs, s3fs) use the
credentials users already configured; every request is retried on transient
errors (:mod:`maxckpt.storage.retry`), and listings are never cached (other
hosts change the bucket under us).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Iterable

from maxckpt.errors import StorageError
from maxckpt.storage.retry import configure_fsspec, with_retries
from maxckpt.storage.urls import as_path, split_url

_FINGERPRINT_KEYS = ("size", "generation", "md5Hash", "updated", "ETag", "LastModified", "VersionId")
# Objects deleted per request (S3's DeleteObjects takes 1000; gcsfs batches 100 per HTTP batch).
DELETE_BATCH = 100
DELETE_WORKERS = 8
READ_FANOUT = 16  # parallel ranged GETs in flight at once, each one part


def filesystem(path: str | os.PathLike) -> Any:
    """The fsspec filesystem of a URL (gcsfs for gs://, s3fs for s3://); instances are cached by fsspec."""
    import fsspec

    scheme = split_url(path).scheme
    configure_fsspec(scheme)  # timeouts and retries from maxckpt.storage.retry, for epath's instances too
    if scheme == "gs":  # the arguments epath passes, so both share one instance and one listing cache
        return fsspec.filesystem("gcs", finalize_on_close=True)
    return fsspec.filesystem(scheme)


def _key(path: str | os.PathLike) -> str:
    loc = split_url(path)
    return f"{loc.bucket}/{loc.key}".rstrip("/")


def _url(path: str | os.PathLike, key: str) -> str:
    return f"{split_url(path).scheme}://{key}"


class BucketStore:
    """Objects in a ``gs://`` or ``s3://`` bucket, each request retried on transient errors."""

    def exists(self, path: str | os.PathLike) -> bool:
        fs = filesystem(path)
        return with_retries(lambda: fs.exists(_key(path)), what="stat", path=os.fspath(path))

    def isdir(self, path: str | os.PathLike) -> bool:
        return as_path(path).is_dir()  # a prefix with at least one object below it

    def is_file(self, path: str | os.PathLike) -> bool:
        fs = filesystem(path)
        key = _key(path)

        def check() -> bool:
            fs.invalidate_cache(key)
            return bool(fs.isfile(key))

        return with_retries(check, what="stat", path=os.fspath(path))

    def listdir(self, path: str | os.PathLike) -> list[str]:
        fs = filesystem(path)
        key = _key(path)

        def ls() -> list[str]:
            try:
                entries = fs.ls(key, detail=False, refresh=True)
            except FileNotFoundError:
                return []
            return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != key})

        return with_retries(ls, what="list", path=os.fspath(path))

    def find(self, path: str | os.PathLike) -> list[str]:
        fs = filesystem(path)
        key = _key(path)

        def find() -> list[str]:
            try:
                return sorted(fs.find(key + "/", refresh=True))
            except FileNotFoundError:
                return []

        return [_url(path, k) for k in with_retries(find, what="list", path=os.fspath(path))]

    def read(self, path: str | os.PathLike) -> bytes:
        fs = filesystem(path)
        return with_retries(lambda: fs.cat_file(_key(path)), what="read", path=os.fspath(path))

    def read_into(self, path: str | os.PathLike, offset: int, out: memoryview, part: int) -> int:
        """Parallel ranged GETs of `part` bytes (fsspec's cat_ranges), at most READ_FANOUT parts in memory."""
        length = len(out)
        fs = filesystem(path)
        key = _key(path)
        starts = list(range(offset, offset + length, part))
        ends = [min(s + part, offset + length) for s in starts]
        got = 0
        for i in range(0, len(starts), READ_FANOUT):
            s, e = starts[i:i + READ_FANOUT], ends[i:i + READ_FANOUT]
            blobs = with_retries(
                lambda: fs.cat_ranges([key] * len(s), s, e, on_error="raise"), what="read", path=os.fspath(path)
            )
            for start, blob in zip(s, blobs):
                if isinstance(blob, BaseException):
                    raise blob
                out[start - offset:start - offset + len(blob)] = blob
                got += len(blob)
        return got

    def write(self, path: str | os.PathLike, data: bytes) -> None:
        fs = filesystem(path)
        with_retries(lambda: fs.pipe_file(_key(path), data), what="write", path=os.fspath(path))
        fs.invalidate_cache(_key(path).rsplit("/", 1)[0])

    def write_whole(self, path: str | os.PathLike, data: bytes) -> None:
        """An object appears whole or not at all: one write."""
        self.write(path, data)

    def open_read(self, path: str | os.PathLike, block_size: int) -> IO[bytes]:
        fs = filesystem(path)
        return with_retries(
            lambda: fs.open(_key(path), "rb", block_size=block_size, cache_type="readahead"),
            what="open", path=os.fspath(path),
        )

    def open_write(self, path: str | os.PathLike) -> IO[bytes]:
        fs = filesystem(path)  # a multipart upload, visible only once closed
        return with_retries(lambda: fs.open(_key(path), "wb"), what="open", path=os.fspath(path))

    def remove(self, paths: Iterable[str], *, batch: int = DELETE_BATCH, workers: int = DELETE_WORKERS) -> None:
        """Delete objects (all of one bucket) in parallel batches; already-missing ones are fine."""
        paths = list(paths)
        if not paths:
            return
        fs = filesystem(paths[0])
        keys = [_key(p) for p in paths]
        chunks = [keys[i:i + batch] for i in range(0, len(keys), batch)]

        def rm(chunk: list[str]) -> None:
            def once() -> None:
                try:
                    fs.rm(chunk)
                except FileNotFoundError:
                    pass  # someone else removed (some of) them: the goal is reached
            more = f" (+{len(chunk) - 1})" if len(chunk) > 1 else ""
            with_retries(once, what="delete", path=_url(paths[0], chunk[0]) + more)

        try:
            with ThreadPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
                list(pool.map(rm, chunks))
        finally:
            fs.invalidate_cache()  # listings cached by fsspec (shared with epath) must not show them any more

    def rmtree(self, path: str | os.PathLike) -> None:
        self.remove(self.find(path))

    def size(self, path: str | os.PathLike) -> int:
        fs = filesystem(path)
        return int(with_retries(lambda: fs.size(_key(path)), what="stat", path=os.fspath(path)))

    def mtime(self, path: str | os.PathLike) -> float:
        """A bucket "folder" has no time of its own: OSError, so callers fall back to a file inside."""
        fs = filesystem(path)
        if not with_retries(lambda: fs.isfile(_key(path)), what="stat", path=os.fspath(path)):
            raise FileNotFoundError(os.fspath(path))
        return with_retries(lambda: fs.modified(_key(path)), what="stat", path=os.fspath(path)).timestamp()

    def total_bytes(self, path: str | os.PathLike) -> int:
        fs = filesystem(path)

        def du() -> int:
            try:
                return int(fs.du(_key(path) + "/", total=True))
            except FileNotFoundError:
                return 0

        return with_retries(du, what="list", path=os.fspath(path))

    def fingerprint(self, path: str | os.PathLike) -> dict[str, str] | None:
        fs = filesystem(path)
        key = _key(path)

        def info() -> dict | None:
            fs.invalidate_cache(key.rsplit("/", 1)[0])
            try:
                found = fs.info(key)
            except FileNotFoundError:
                return None
            return found if found.get("type") == "file" else None

        found = with_retries(info, what="stat", path=os.fspath(path))
        if found is None:
            return None
        return {k: str(found[k]) for k in _FINGERPRINT_KEYS if found.get(k) not in (None, "")}

    def require_bucket(self, path: str | os.PathLike) -> None:
        """Raise StorageError unless the bucket of `path` exists (a clear message before any write)."""
        loc = split_url(path)
        fs = filesystem(path)
        bucket_url = f"{loc.scheme}://{loc.bucket}"
        if not with_retries(lambda: fs.exists(loc.bucket), what="stat", path=bucket_url):
            # exists() says False for any error (no credentials, no network): a listing says which it was.
            try:
                with_retries(lambda: fs.ls(loc.bucket, detail=False, refresh=True), what="list", path=bucket_url)
            except (FileNotFoundError, PermissionError):
                pass
            raise StorageError(
                f"{os.fspath(path)}: the bucket {loc.scheme}://{loc.bucket} does not exist or these credentials "
                "cannot see it; create it, or check the URL and the credentials"
            )
