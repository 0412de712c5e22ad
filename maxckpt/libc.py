"""The C library, opened once, for the few libc calls maxckpt makes (`mallopt`, `malloc_trim`, `madvise`, \
`sync_file_range`).

None where there is no loadable C library; each caller checks that the
function it needs exists (musl and macOS lack `malloc_trim`, for instance),
so on such systems those calls are skipped rather than failing.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _open() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


LIBC = _open()


def function(name: str, argtypes: list, restype=ctypes.c_int):
    """`name` from the C library with its signature set, or None where it is missing."""
    fn = getattr(LIBC, name, None) if LIBC is not None else None
    if fn is None:
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_SYNC_FILE_RANGE = function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages, do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Have the kernel start writing `nbytes` at `offset` of `fd` to disk now, without waiting for it.

    Why: a writer that fsyncs at the end otherwise waits then for every byte
    it wrote (the kernel starts on its own only once a tenth of memory is
    dirty); started early, the disk works while the conversion computes, and
    the final fsync waits only for the tail. Linux only; elsewhere, and on
    any error, nothing happens (the fsync reports real write errors).
    Returns whether the kernel took the request.
    """
    if _SYNC_FILE_RANGE is None or nbytes <= 0:
        return False
    return _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0
