"""A reader that counts the bytes its callers ask for: what one process of a scale-out really reads.

Why here, in the reader layer: `/proc/self/io` misses the pages TensorStore and
the safetensors reader map rather than `read()`, and page-cache hits count
nothing there either. What a conversion asks its reader for is what decides how
the work splits between processes, whatever the kernel serves it from.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


class CountingReader:
    """`reader`, counting the bytes of every array (and raw object) it returns; everything else passes through."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        self.bytes_read = 0  # bytes of the arrays and objects returned so far
        self.reads = 0  # calls that returned them

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += int(nbytes)
            self.reads += 1

    def tensors(self):
        return self._reader.tensors()

    def read(self, name: str, index: Any = None) -> np.ndarray:
        array = self._reader.read(name, index)
        self._count(np.asarray(array).nbytes)
        return array

    def read_bytes(self, name: str) -> bytes:
        data = self._reader.read_bytes(name)
        self._count(len(data))
        return data

    def close(self) -> None:
        self._reader.close()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._reader, attr)
