"""Large writes to a local output file go straight to the disk (O_DIRECT); their edges go through the page cache.

Why: a buffered write copies every byte into new page-cache pages the kernel must write back and that stay cached
though nobody reads them; tensor bytes written once gain nothing from that. Each large write's 4 KiB-aligned
interior goes through an aligned buffer of :data:`BOUNCE` bytes and a second, O_DIRECT descriptor; its partial
blocks at either end, and any write where O_DIRECT is refused or the interior is under :data:`MIN_DIRECT`, go
through the page cache. ``MAXCKPT_DIRECT_WRITES=0`` writes everything through the page cache.
See docs/design/direct-writes.md.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any

ALIGN = 4096  # offsets, lengths and memory of direct writes are multiples of this
BOUNCE = 8 << 20  # bytes copied and written per direct write
MIN_DIRECT = 1 << 20  # a write whose aligned interior is smaller goes through the page cache whole
ENV = "MAXCKPT_DIRECT_WRITES"


def enabled() -> bool:
    """Direct writes are possible here and not switched off (``MAXCKPT_DIRECT_WRITES=0``)."""
    return hasattr(os, "O_DIRECT") and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of `view` at `offset` through `fd`; one pwrite moves at most ~2 GiB on Linux, so loop on short \
writes."""
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at byte {offset}")
        view, offset = view[n:], offset + n


class DirectWrites:
    """Large writes into one local file, their aligned interior with O_DIRECT.

    `fd` is the file's ordinary descriptor (opened for writing by the
    owner, who also fsyncs and closes it); a second descriptor with O_DIRECT
    is opened on `path` at the first large write and closed by :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, fd: int):
        self.path = os.fspath(path)
        self.fd = fd
        self._direct: int | None = None
        self._bounce: mmap.mmap | None = None
        self._off = not enabled()  # once off (refused, or switched off), every write is an ordinary one

    def pwrite(self, data: Any, offset: int) -> None:
        """Write all of `data` (any C-contiguous buffer) at `offset` of the file."""
        view = memoryview(data).cast("B")
        start = -(-offset // ALIGN) * ALIGN
        stop = (offset + len(view)) // ALIGN * ALIGN
        if self._off or stop - start < MIN_DIRECT or not self._open():
            pwrite_all(self.fd, view, offset)
            return
        pwrite_all(self.fd, view[: start - offset], offset)  # the head's partial block
        done = self._write_direct(view[start - offset : stop - offset], start)
        # The tail's partial block; and, if the device refused direct writes midway, the rest of the interior.
        pwrite_all(self.fd, view[start - offset + done :], start + done)

    def _open(self) -> bool:
        if self._direct is None:
            try:
                self._direct = os.open(self.path, os.O_WRONLY | os.O_DIRECT)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
                self._off = True  # this file system does not do O_DIRECT
                return False
            self._bounce = mmap.mmap(-1, BOUNCE)  # page-aligned, reused for every write to this file
        return True

    def _write_direct(self, view: memoryview, offset: int) -> int:
        """Write the aligned `view` at the aligned `offset`; returns the bytes written (fewer only if refused)."""
        assert self._direct is not None and self._bounce is not None
        bounce = memoryview(self._bounce)
        done = 0
        try:
            while done < len(view):
                n = min(BOUNCE, len(view) - done)
                bounce[:n] = view[done : done + n]
                wrote = 0
                while wrote < n:
                    got = os.pwrite(self._direct, bounce[wrote:n], offset + done + wrote)
                    if got <= 0 or got % ALIGN:
                        raise OSError(errno.EIO, f"{self.path}: direct write of {n - wrote} bytes wrote {got}")
                    wrote += got
                done += n
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            self._off = True  # the device wants a larger alignment: the rest goes through the page cache
        finally:
            bounce.release()
        return done

    def close(self) -> None:
        """Close the O_DIRECT descriptor and free the buffer (the owner fsyncs and closes the file itself)."""
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        if self._bounce is not None:
            self._bounce.close()
            self._bounce = None
