"""Large writes to a local output file go straight to the disk (O_DIRECT); their edges go through the page cache.

Why: a buffered write copies every byte into freshly allocated page-cache
pages, which the kernel must then write back, and which stay cached after
the conversion whether anyone reads them or not. Tensor bytes written once
and not read back gain nothing from that. Written with O_DIRECT, the bytes go
from one reused buffer to the disk: no page allocation, no dirty-page
accounting, nothing left to evict. On the 2-core development VM the same
0.5 GB MaxText -> hf conversion spent 0.75-0.91 s of system time this way
against 1.25-2.38 s buffered, and took 1.07-1.20 s against 1.19-1.95 s
(4 interleaved pairs; docs/conversion.md has every target); 1 GiB written
and fsynced took 0.07 s of system time direct against 0.35-0.85 s buffered.

How: O_DIRECT needs the file offset, the length and the memory aligned to
the device's block (4 KiB covers every common device). A tensor's bytes sit
at any offset of a safetensors or torch file and at any address in memory,
so each large write is split:

- its interior, from the first 4 KiB boundary it covers to the last, is
  copied through an aligned buffer of :data:`BOUNCE` bytes and written with
  a second, O_DIRECT descriptor of the same file;
- the partial blocks at either end go through the ordinary descriptor.

A block is therefore written only one way by one write, and the kernel keeps
the two views of the file coherent (an O_DIRECT write flushes and drops any
cached copy of the blocks it covers). The final fsync is unchanged: it makes
the edges and the file's metadata durable, and the device's cache.

Where the file system refuses O_DIRECT (EINVAL: some FUSE and network
mounts, tmpfs before Linux 6.6), the platform has none (macOS), a device
needs a larger alignment (EINVAL on the first direct write), or the
interior is under :data:`MIN_DIRECT`, the write goes through the page cache
whole, as before. Set
``MAXCKPT_DIRECT_WRITES=0`` to write everything through the page cache (an
output that will be read back at once, say).
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
    """Write all of `view` at `offset` through `fd`; one pwrite moves at most ~2 GiB on Linux, so loop on short writes."""
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
