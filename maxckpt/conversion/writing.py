"""Handing a conversion's tensors to a writer: what it is told up front, and closing or aborting it.

Shared by the one-process pipeline and each process of a scale-out (distributed.py), which import
this module rather than each other.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np

from maxckpt.containers.base import TensorWriter
from maxckpt.tensors import LazyTensor, TensorInfo


def write_and_close(writer: TensorWriter, write: Callable[[], int]) -> int:
    """`write()` into `writer`, then close it; on any failure (Ctrl-C included) abort it and re-raise.

    Aborting closes file handles and waits for background writes (TensorStore),
    so nothing writes into the temporary folder once staging has removed it.
    """
    try:
        written = write()
        writer.close()
    except BaseException:
        abort = getattr(writer, "abort", None)
        if abort is not None:
            with contextlib.suppress(Exception):
                abort()
        raise
    return written


def written_info(t: LazyTensor) -> TensorInfo:
    """What a writer is told up front about `t`: name, shape, dtype, and the chunk it arrives in.

    `chunk_shape` is one piece's shape (1 on the axes a piece indexes) for a
    tensor written piece by piece, else None; a chunked writer (Orbax) can
    then create every array before the first byte is written.
    """
    if not t.pieces:
        return TensorInfo(t.name, t.shape, np.dtype(t.dtype))
    index = t.pieces[0][0]
    chunk = tuple(
        max(1, 1 if isinstance(item, (int, np.integer)) else len(range(*item.indices(size))))
        for item, size in zip(tuple(index) + (slice(None),) * (len(t.shape) - len(index)), t.shape)
    )
    return TensorInfo(t.name, t.shape, np.dtype(t.dtype), chunk)
