"""Objects in a bucket (or files on a disk): list, read, write, delete, with retries.

Buckets are flat: a "folder" is a key prefix, a listing is one level of
prefixes, nothing can be renamed atomically, and deleting a checkpoint means
deleting each of its objects. These functions hide that behind the file
operations maxckpt needs, the same for local paths (os) and URLs (the fsspec
clients gcsfs and s3fs, which use the credentials users already configured),
with transient errors retried (:mod:`maxckpt.storage.retry`).

>>> write_bytes("gs://bucket/run/export/model.safetensors.index.json", b"{}")   # doctest: +SKIP
>>> list_names("gs://bucket/run/export")                                        # doctest: +SKIP
['model.safetensors.index.json']
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Iterable

from maxckpt.errors import StorageError
from maxckpt.storage.retry import configure_fsspec, with_retries
from maxckpt.storage.urls import as_path, is_url, split_url

# Objects deleted per request (S3's DeleteObjects takes 1000; gcsfs batches 100 per HTTP batch).
DELETE_BATCH = 100
DELETE_WORKERS = 8
# Range-read block for streaming reads: large enough to amortise a request, small enough to stay flat in RSS.
READ_BLOCK = 16 * 1024 * 1024
# Parallel ranged GETs: each part is one request; READ_FANOUT of them are in flight at once.
RANGE_PART = 8 * 1024 * 1024
READ_FANOUT = 16


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


def exists(path: str | os.PathLike) -> bool:
    """Whether an object (or a non-empty prefix, or a local file/folder) exists at `path`."""
    if not is_url(path):
        return os.path.exists(path)
    fs = filesystem(path)
    return with_retries(lambda: fs.exists(_key(path)), what="stat", path=os.fspath(path))


def is_file(path: str | os.PathLike) -> bool:
    """Whether an object (not a prefix) exists at `path`; for a local path, a regular file or other non-folder."""
    if not is_url(path):
        return os.path.lexists(path) and not os.path.isdir(path)
    fs = filesystem(path)
    key = _key(path)

    def check() -> bool:
        fs.invalidate_cache(key)
        return bool(fs.isfile(key))

    return with_retries(check, what="stat", path=os.fspath(path))


_FINGERPRINT_KEYS = ("size", "generation", "md5Hash", "updated", "ETag", "LastModified", "VersionId")


def fingerprint(path: str | os.PathLike) -> dict[str, str] | None:
    """What identifies this very version of an object (or local file): size plus the store's version fields
    (GCS generation, S3 ETag and time); None when absent. Another write of the same name changes it."""
    if not is_url(path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return {"size": str(st.st_size), "mtime_ns": str(st.st_mtime_ns), "ino": str(st.st_ino)}
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


def list_names(path: str | os.PathLike) -> list[str]:
    """Names of the entries one level below `path` (objects and prefixes), sorted; [] when absent."""
    if not is_url(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs = filesystem(path)
    key = _key(path)

    def ls() -> list[str]:
        try:
            entries = fs.ls(key, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != key})

    return with_retries(ls, what="list", path=os.fspath(path))


def find_files(path: str | os.PathLike) -> list[str]:
    """Every object (file) below `path`, recursively, as URLs or local paths; [] when absent."""
    if not is_url(path):
        return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)
    fs = filesystem(path)
    key = _key(path)

    def find() -> list[str]:
        try:
            return sorted(fs.find(key + "/", refresh=True))
        except FileNotFoundError:
            return []

    return [_url(path, k) for k in with_retries(find, what="list", path=os.fspath(path))]


def read_bytes(path: str | os.PathLike) -> bytes:
    """The whole content of a (small) object or file."""
    if not is_url(path):
        from maxckpt.bounded import open_regular

        with open_regular(path) as f:  # a FIFO or device is an OSError, not a hang
            return f.read()
    fs = filesystem(path)
    return with_retries(lambda: fs.cat_file(_key(path)), what="read", path=os.fspath(path))


def size(path: str | os.PathLike) -> int:
    """Bytes of one object or file."""
    if not is_url(path):
        return os.stat(path).st_size
    fs = filesystem(path)
    return int(with_retries(lambda: fs.size(_key(path)), what="stat", path=os.fspath(path)))


def mtime(path: str | os.PathLike) -> float:
    """Last-modified time of a file or object (seconds since the epoch); OSError when it is absent.

    A bucket "folder" has no time of its own: OSError, so callers fall back to a file inside.
    """
    if not is_url(path):
        return os.stat(path).st_mtime
    fs = filesystem(path)
    if not with_retries(lambda: fs.isfile(_key(path)), what="stat", path=os.fspath(path)):
        raise FileNotFoundError(os.fspath(path))
    return with_retries(lambda: fs.modified(_key(path)), what="stat", path=os.fspath(path)).timestamp()


def read_into(path: str | os.PathLike, offset: int, out: memoryview, *, part: int = RANGE_PART) -> int:
    """Fill `out` with the bytes of `path` from `offset`; returns how many arrived.

    On a bucket a large read becomes parallel ranged GETs of `part` bytes
    (fsspec's cat_ranges runs them concurrently), so one tensor streams at the
    store's aggregate bandwidth, with memory bounded by `out` itself.
    """
    length = len(out)
    if not length:
        return 0
    if not is_url(path):
        from maxckpt.bounded import open_regular

        with open_regular(path) as f:  # a FIFO or device is an OSError, not a hang
            got = 0
            while got < length:  # one preadv stops near 2 GiB on Linux: loop on short reads
                n = os.preadv(f.fileno(), [out[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got
    fs = filesystem(path)
    key = _key(path)
    starts = list(range(offset, offset + length, part))
    ends = [min(s + part, offset + length) for s in starts]
    got = 0
    for i in range(0, len(starts), READ_FANOUT):  # bounded fan-out: at most READ_FANOUT parts in memory
        s, e = starts[i:i + READ_FANOUT], ends[i:i + READ_FANOUT]
        blobs = with_retries(lambda: fs.cat_ranges([key] * len(s), s, e, on_error="raise"), what="read", path=os.fspath(path))
        for start, blob in zip(s, blobs):
            if isinstance(blob, BaseException):
                raise blob
            out[start - offset:start - offset + len(blob)] = blob
            got += len(blob)
    return got


def require_bucket(path: str | os.PathLike) -> None:
    """Raise StorageError unless the bucket of URL `path` exists (a clear message before any write)."""
    if not is_url(path):
        return
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


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write a (small) object or file in one request: markers, indexes, trackers."""
    if not is_url(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return
    fs = filesystem(path)
    with_retries(lambda: fs.pipe_file(_key(path), data), what="write", path=os.fspath(path))
    fs.invalidate_cache(_key(path).rsplit("/", 1)[0])


def open_read(path: str | os.PathLike, block_size: int = READ_BLOCK) -> IO[bytes]:
    """A seekable binary reader; on a bucket each buffer refill is one ranged GET."""
    if not is_url(path):
        from maxckpt.bounded import open_regular

        return open_regular(path)  # a FIFO or device is an OSError, not a hang
    fs = filesystem(path)
    return with_retries(
        lambda: fs.open(_key(path), "rb", block_size=block_size, cache_type="readahead"),
        what="open", path=os.fspath(path),
    )


def open_write(path: str | os.PathLike) -> IO[bytes]:
    """A binary writer; on a bucket it streams as a multipart upload, visible only once closed."""
    if not is_url(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        return open(path, "wb")
    fs = filesystem(path)
    return with_retries(lambda: fs.open(_key(path), "wb"), what="open", path=os.fspath(path))


def delete_files(paths: Iterable[str], *, batch: int = DELETE_BATCH, workers: int = DELETE_WORKERS) -> int:
    """Delete objects in parallel batches (already-missing ones are fine); returns how many were asked.

    All `paths` must be on one store. Local paths are removed one by one.
    """
    paths = list(paths)
    if not paths:
        return 0
    if not is_url(paths[0]):
        for p in paths:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
        return len(paths)
    fs = filesystem(paths[0])
    keys = [_key(p) for p in paths]
    chunks = [keys[i:i + batch] for i in range(0, len(keys), batch)]

    def rm(chunk: list[str]) -> None:
        def once() -> None:
            try:
                fs.rm(chunk)
            except FileNotFoundError:
                pass  # someone else removed (some of) them: the goal is reached
        with_retries(once, what="delete", path=_url(paths[0], chunk[0]) + (f" (+{len(chunk) - 1})" if len(chunk) > 1 else ""))

    try:
        with ThreadPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
            list(pool.map(rm, chunks))
    finally:
        fs.invalidate_cache()  # listings cached by fsspec (shared with epath) must not show them any more
    return len(paths)


def rmtree(path: str | os.PathLike) -> None:
    """Remove a folder and everything below it (a prefix's objects, in parallel batches)."""
    if not is_url(path):
        shutil.rmtree(path)
        return
    delete_files(find_files(path))


def total_bytes(path: str | os.PathLike) -> int:
    """Bytes of every object (file) below `path`; 0 when absent. One listing on a bucket."""
    if not is_url(path):
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass  # removed while we walked (a retention pass running)
        return total
    fs = filesystem(path)

    def du() -> int:
        try:
            return int(fs.du(_key(path) + "/", total=True))
        except FileNotFoundError:
            return 0

    return with_retries(du, what="list", path=os.fspath(path))


def is_dir(path: str | os.PathLike) -> bool:
    """A local folder, or a bucket prefix with at least one object below it."""
    return as_path(path).is_dir()
