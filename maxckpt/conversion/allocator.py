"""glibc allocator settings for a conversion: reuse large buffers, and hand freed memory back in bulk.

Why: a conversion allocates a fresh buffer for every tensor it reads,
decodes or transposes (hundreds of MB each, a few GB per checkpoint). glibc
serves blocks above its mmap threshold (32 MiB at most, by default) with a
fresh `mmap` and unmaps them on free, so every byte is page-faulted and
zeroed by the kernel again - on the 2-core VM that was half the
conversion's CPU time. With the threshold raised (:func:`keep_large_buffers`),
freed blocks stay in the heap and are reused. TensorStore decodes on its own
threads, whose arenas glibc keeps as well, so what is free is returned to the
system with `malloc_trim` every :data:`TRIM_EVERY` bytes written
(:class:`Trimmer`), which keeps peak RSS near the working set (the pieces in
flight) instead of everything ever read.

Who raises the threshold: only a process that does nothing but convert - the
`maxckpt convert` command (and the benchmark's conversion processes) call
:func:`keep_large_buffers` before converting; `maxckpt.convert()` itself never
does. The setting is process-wide and cannot be undone:

- glibc has no getter for `M_MMAP_THRESHOLD`, so what the process had before
  (its own `mallopt`, `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`) cannot be
  read back;
- by default glibc adapts the threshold (it starts at 128 KiB and rises to the
  size of each mmapped block freed, up to 32 MiB); any `mallopt` of it turns
  that off for good (glibc manual, "Malloc Tunable Parameters"), and nothing
  turns it back on. "Restoring" 128 KiB would leave a static 128 KiB
  threshold: every block of 128 KiB-32 MiB mmapped and unmapped again, a
  different allocator from the one the process started with;
- while it is raised it applies to every thread, so a training loop calling
  `convert()` would keep its own freed activations in the heap too.

So a context manager around the API call could not give a training process
its allocator back; leaving the API alone does. API users in a process that
only converts can opt in with `maxckpt.conversion.allocator.keep_large_buffers()`.
`malloc_trim` is a one-off hand-back with no lasting setting, so the
:class:`Trimmer` runs for every conversion.

Older glibc (malloc.c as of 2021) refuses a threshold above 32 MiB
(`HEAP_MAX_SIZE / 2`; glibc 2.36 accepts 1 GiB); there :func:`keep_large_buffers`
falls back to 32 MiB, which still covers most per-layer pieces. Elsewhere (macOS, musl) all of this is a no-op.
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
