"""The C library, opened once, for the few glibc calls maxckpt makes (`mallopt`, `malloc_trim`, `madvise`).

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
