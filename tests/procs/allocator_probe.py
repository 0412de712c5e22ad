"""Child program: does a conversion change this process's allocator? Prints one JSON line.

    python allocator_probe.py SRC OUT_DIR

Measures, with glibc's own counters (`mallinfo2().hblkhd`: bytes held in
mmapped blocks), whether a freshly allocated 64 MiB numpy array is served by
`mmap` (and unmapped again when freed) - glibc's default for any block over
32 MiB - at three points: before anything, after `maxckpt.convert()` through
the Python API, and after `maxckpt convert` run in this same process the way
the console script runs it (which raises the threshold on purpose; the probe
size there is below the threshold it set).
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
_LIBC = ctypes.CDLL("libc.so.6")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


class _Mallinfo(ctypes.Structure):  # glibc < 2.33: int fields, enough for a few hundred MiB
    _fields_ = [(name, ctypes.c_int) for name in _FIELDS]


if hasattr(_LIBC, "mallinfo2"):
    _LIBC.mallinfo2.restype = _Mallinfo2
    _mallinfo = _LIBC.mallinfo2
else:
    _LIBC.mallinfo.restype = _Mallinfo
    _mallinfo = _LIBC.mallinfo


def probe(nbytes: int) -> dict:
    """How much of an `nbytes` array glibc mmapped, and how much of that it unmapped on free."""
    before = _mallinfo().hblkhd
    array = np.ones(nbytes, dtype=np.uint8)  # touched: really resident
    held = _mallinfo().hblkhd
    del array
    after = _mallinfo().hblkhd
    return {"nbytes": nbytes, "mmapped": held - before, "unmapped_on_free": held - after}


def main(src: str, out: str) -> None:
    from maxckpt.cli.main import main as cli
    from maxckpt.conversion import allocator, convert

    result = {"fresh": probe(64 << 20)}
    convert(src, f"{out}/api-hf", to="hf", model="llama2")
    result["after_api"] = probe(64 << 20)
    try:
        cli(["convert", src, f"{out}/cli-hf", "--to", "hf", "--model", "llama2", "-q"])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    threshold = allocator._threshold  # what the command set (None: it set nothing)
    result["cli_threshold"] = threshold
    result["after_cli"] = probe(min(64 << 20, threshold // 2)) if threshold else None
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
