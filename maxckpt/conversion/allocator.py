"""glibc allocator settings for a conversion: reuse large buffers, and hand freed memory back in bulk.

Why: a conversion allocates a fresh buffer for every tensor it reads, decodes or transposes, and glibc mmaps and
unmaps blocks that large, so the kernel faults in and zeroes every byte again. :func:`keep_large_buffers` raises
the mmap threshold so freed blocks are reused; the setting is process-wide and cannot be undone, so only the
`maxckpt convert` command calls it, never `maxckpt.convert()`. :class:`Trimmer` hands free memory back with
`malloc_trim` every :data:`TRIM_EVERY` bytes written, in every conversion. Off glibc all of this is a no-op.
See docs/design/glibc-allocator.md.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

from maxckpt import libc

TRIM_EVERY = 256 << 20  # bytes written between two malloc_trim calls
MMAP_THRESHOLD = 1 << 30  # blocks below this come from (and return to) the heap
MMAP_THRESHOLD_OLD_GLIBC = 32 << 20  # the most older glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


_MALLOPT = libc.function("mallopt", [ctypes.c_int, ctypes.c_int])
_threshold: int | None = None  # what keep_large_buffers set, once it has
_lock = threading.Lock()


def keep_large_buffers() -> int | None:
    """Raise glibc's mmap threshold for the rest of this process; returns the threshold set (None: not glibc).

    For a process that only converts (the `maxckpt convert` command calls it
    first): it cannot be undone, see the module docstring.

    >>> from maxckpt.conversion import allocator
    >>> allocator.keep_large_buffers()  # doctest: +SKIP
    1073741824
    """
    global _threshold
    with _lock:
        if _threshold is not None or _MALLOPT is None:
            return _threshold
        for value in (MMAP_THRESHOLD, MMAP_THRESHOLD_OLD_GLIBC):
            if _MALLOPT(_M_MMAP_THRESHOLD, value) == 1:
                _threshold = value
                break
        return _threshold


def _malloc_trim() -> Callable[[], None]:
    trim = libc.function("malloc_trim", [ctypes.c_size_t])
    if trim is None:
        return lambda: None
    return lambda: trim(0)


trim = _malloc_trim()


class Trimmer:
    """Calls :func:`trim` after every `every` bytes reported with :meth:`wrote`."""

    def __init__(self, every: int = TRIM_EVERY):
        self.every = every
        self._since = 0

    def wrote(self, nbytes: int) -> None:
        self._since += nbytes
        if self._since >= self.every:
            self._since = 0
            trim()
