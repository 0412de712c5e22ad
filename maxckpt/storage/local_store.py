"""The local (or mounted) file system behind the :class:`~maxckpt.storage.store.Store` protocol.

Plain ``os`` calls. Reads go through :func:`maxckpt.storage.bounded.open_regular`, so a
FIFO or a device where a file was expected is an OSError, never a hang.
"""

from __future__ import annotations

import os
import shutil
from typing import IO, Iterable


def _open_regular(path: str | os.PathLike) -> IO[bytes]:
    from maxckpt.storage.bounded import open_regular

    return open_regular(path)


class LocalStore:
    """Files and folders of this machine's file systems."""

    def exists(self, path: str | os.PathLike) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str | os.PathLike) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str | os.PathLike) -> bool:
        return os.path.lexists(path) and not os.path.isdir(path)

    def listdir(self, path: str | os.PathLike) -> list[str]:
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def find(self, path: str | os.PathLike) -> list[str]:
        return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)

    def read(self, path: str | os.PathLike) -> bytes:
        with _open_regular(path) as f:
            return f.read()

    def read_into(self, path: str | os.PathLike, offset: int, out: memoryview, part: int) -> int:
        length = len(out)
        with _open_regular(path) as f:
            got = 0
            while got < length:  # one preadv stops near 2 GiB on Linux: loop on short reads
                n = os.preadv(f.fileno(), [out[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got

    def write(self, path: str | os.PathLike, data: bytes) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def write_whole(self, path: str | os.PathLike, data: bytes) -> None:
        """Whole or not at all, on disk: a hidden temporary beside `path`, fsynced, then renamed over it."""
        text = os.fspath(path)
        tmp = os.path.join(os.path.dirname(text), f".{os.path.basename(text)}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, text)

    def open_read(self, path: str | os.PathLike, block_size: int) -> IO[bytes]:
        return _open_regular(path)

    def open_write(self, path: str | os.PathLike) -> IO[bytes]:
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        return open(path, "wb")

    def remove(self, paths: Iterable[str], *, batch: int = 0, workers: int = 0) -> None:
        """Remove files one by one (`batch` and `workers` are for buckets); already-missing ones are fine."""
        for p in paths:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    def rmtree(self, path: str | os.PathLike) -> None:
        shutil.rmtree(path)

    def size(self, path: str | os.PathLike) -> int:
        return os.stat(path).st_size

    def mtime(self, path: str | os.PathLike) -> float:
        return os.stat(path).st_mtime

    def total_bytes(self, path: str | os.PathLike) -> int:
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass  # removed while we walked (a retention pass running)
        return total

    def fingerprint(self, path: str | os.PathLike) -> dict[str, str] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return {"size": str(st.st_size), "mtime_ns": str(st.st_mtime_ns), "ino": str(st.st_ino)}

    def require_bucket(self, path: str | os.PathLike) -> None:
        """A local path has no bucket to check."""
