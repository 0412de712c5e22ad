"""glibc allocator settings for a conversion: reuse large buffers, and hand freed memory back in bulk.

Why: a conversion allocates a fresh buffer for every tensor it reads,
decodes or transposes (hundreds of MB each, a few GB per checkpoint). glibc
serves blocks above its mmap threshold (32 MiB at most, by default) with a
fresh `mmap` and unmaps them on free, so every byte is page-faulted and
zeroed by the kernel again - on the 2-core VM that was half the
conversion's CPU time. With the threshold raised, freed blocks stay in the
heap and are reused. TensorStore decodes on its own threads, whose arenas
glibc keeps as well, so what is free is returned to the system with
`malloc_trim` every :data:`TRIM_EVERY` bytes written, which keeps peak RSS
near the working set (the pieces in flight) instead of everything ever read.

Elsewhere (macOS, musl) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Callable

TRIM_EVERY = 256 << 20  # bytes written between two malloc_trim calls
MMAP_THRESHOLD = 1 << 30  # blocks below this come from (and return to) the heap
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_tuned = False
_lock = threading.Lock()


def keep_large_buffers() -> None:
    """Raise glibc's mmap threshold once per process (it cannot be set back to glibc's adaptive default)."""
    global _tuned
    with _lock:
        if _tuned or _LIBC is None or not hasattr(_LIBC, "mallopt"):
            return
        _LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _tuned = True


def _malloc_trim() -> Callable[[], None]:
    trim = getattr(_LIBC, "malloc_trim", None) if _LIBC is not None else None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
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
