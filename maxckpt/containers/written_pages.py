"""Drop the page-cache pages of files TensorStore has finished writing, so the next writes reuse them.

Why: TensorStore writes an OCDBT database through the page cache (it has no
direct-I/O writes), and every page it fills stays cached after the fsync. A
conversion to MaxText thus grows the page cache by the size of its output,
and a page the kernel must newly allocate costs far more than one it gets
back: on the 2-core VM, writing 4 GiB through the page cache took 12.6-16.9 s
(11-16 s of it system time) when every page stayed cached, and 3.4-3.5 s
when each 256 MiB was dropped once it was on disk. Our own writers avoid the
page cache with O_DIRECT (:mod:`maxckpt.containers.direct_io`); this is the
same for files we do not write ourselves. It also keeps a large conversion
from pushing the source (and everything else) out of memory.

Only clean pages are dropped (`posix_fadvise(DONTNEED)` never discards data
that is not on disk yet): TensorStore fsyncs every data file before the
write that produced it completes, so a folder scanned after writes complete
has clean files. Pages of a file still being written stay; a later scan
takes them. Reading the output back afterwards comes from the disk. It is a
hint: on a file system or platform without it nothing happens.
"""

from __future__ import annotations

import os
from pathlib import Path

DROP_EVERY = 64 << 20  # bytes of completed writes between two scans


class WrittenPages:
    """Drops the cached pages of the files under `folder` after every :data:`DROP_EVERY` bytes written."""

    def __init__(self, folder: str | os.PathLike, every: int = DROP_EVERY) -> None:
        self.folder = Path(folder)
        self.every = every
        self._since = 0
        self._dropped: dict[str, int] = {}  # file name -> size when its pages were last dropped
        self.enabled = hasattr(os, "posix_fadvise")

    def wrote(self, nbytes: int) -> None:
        """`nbytes` more of completed (durable) writes; scan once enough have accumulated."""
        self._since += nbytes
        if self._since >= self.every:
            self.drop()

    def drop(self) -> int:
        """Drop the pages of every file that grew since the last scan; returns the bytes asked to drop."""
        self._since = 0
        if not self.enabled:
            return 0
        asked = 0
        try:
            entries = list(os.scandir(self.folder))
        except OSError:  # not created yet, or gone (an aborted conversion): nothing to drop
            return 0
        for entry in entries:
            try:
                size = entry.stat(follow_symlinks=False).st_size
                if not entry.is_file(follow_symlinks=False) or size <= self._dropped.get(entry.name, 0):
                    continue
                fd = os.open(entry.path, os.O_RDONLY)
            except OSError:  # removed between the listing and now
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self._dropped[entry.name] = size
                asked += size
            except OSError:
                pass  # a file system without the hint: the pages stay, nothing else changes
            finally:
                os.close(fd)
        return asked
