"""Streaming tensor statistics: mean, std, absmax, NaN and Inf counts, one block at a time.

A tensor is read in blocks of whole rows (along axis 0, aligned to the
stored chunks when the container reports them) of at most `budget` bytes, so
`maxckpt inspect --stats` runs on checkpoints far larger than memory. Block
results are merged with Chan et al.'s parallel variance update, which stays
accurate when the mean is large compared with the spread (a plain sum of
squares does not).

>>> import numpy as np
>>> x = np.arange(10, dtype=np.float32)
>>> s = array_stats(x)
>>> (s.mean, round(s.std, 4), s.absmax, s.nan_count)
(4.5, 2.8723, 9.0, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from maxckpt.layouts.transforms import is_float
from maxckpt.tensors import Index, TensorInfo

DEFAULT_BUDGET = 64 * 2**20  # bytes per block read


@dataclass(frozen=True)
class TensorStats:
    """Statistics over the finite values of a tensor; NaN and Inf are counted, not averaged.

    `std` is the population standard deviation. A tensor with no finite value
    has mean, std and absmax NaN.
    """

    count: int
    mean: float
    std: float
    absmax: float
    nan_count: int
    inf_count: int

    def to_dict(self) -> dict[str, float | int | None]:
        def clean(v: float) -> float | None:
            return None if math.isnan(v) else v  # JSON has no NaN

        return {
            "count": self.count,
            "mean": clean(self.mean),
            "std": clean(self.std),
            "absmax": clean(self.absmax),
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
        }


class StatsAccumulator:
    """Merges blocks of one tensor into :class:`TensorStats`."""

    def __init__(self) -> None:
        self.n = 0  # finite values seen
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean
        self.absmax = 0.0
        self.nan = 0
        self.inf = 0
        self.total = 0

    def update(self, block: np.ndarray) -> None:
        x = np.asarray(block)
        self.total += x.size
        if not is_float(x.dtype):
            x = x.astype(np.float64)
        else:
            finite = np.isfinite(x)
            if not finite.all():
                self.nan += int(np.isnan(x).sum())
                self.inf += int(np.isinf(x).sum())
                x = x[finite]
            x = x.astype(np.float64)
        n = x.size
        if n == 0:
            return
        mean = float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        self.absmax = max(self.absmax, float(np.abs(x).max()))
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total

    def result(self) -> TensorStats:
        if self.n == 0:
            nan = float("nan")
            return TensorStats(self.total, nan, nan, nan, self.nan, self.inf)
        return TensorStats(self.total, self.mean, math.sqrt(self.m2 / self.n), self.absmax, self.nan, self.inf)


def array_stats(x: np.ndarray) -> TensorStats:
    """Statistics of an in-memory array."""
    acc = StatsAccumulator()
    acc.update(x)
    return acc.result()


def row_blocks(info: TensorInfo, budget: int = DEFAULT_BUDGET) -> Iterator[Index | None]:
    """Indexes that tile `info`'s tensor in whole-row blocks of at most ~`budget` bytes.

    Block boundaries fall on stored chunk boundaries along axis 0 when the
    chunk shape is known, so every stored chunk is decoded about once. A
    tensor that fits the budget (or a scalar) is one block, `None`.
    """
    shape = tuple(info.shape)
    if not shape or info.nbytes <= budget or shape[0] <= 1:
        yield None
        return
    row_bytes = max(1, info.nbytes // shape[0])
    rows = max(1, budget // row_bytes)
    chunk = info.chunk_shape[0] if info.chunk_shape else 1
    if chunk > 1:
        rows = max(chunk, rows // chunk * chunk)
    for start in range(0, shape[0], rows):
        yield (slice(start, min(start + rows, shape[0])),)


def tensor_stats(
    read: Callable[[Index | None], np.ndarray],
    info: TensorInfo,
    budget: int = DEFAULT_BUDGET,
    on_block: Callable[[int], None] | None = None,
) -> TensorStats:
    """Statistics of a stored tensor, read block by block through `read(index)`.

    `on_block(nbytes)` is called after each block (progress bars).

    >>> from maxckpt.tensors import TensorInfo
    >>> x = np.ones((4, 3), np.float32)
    >>> tensor_stats(lambda i: x if i is None else x[i], TensorInfo("x", (4, 3), x.dtype), budget=12).count
    12
    """
    acc = StatsAccumulator()
    for index in row_blocks(info, budget):
        block = read(index)
        acc.update(block)
        if on_block is not None:
            on_block(int(np.asarray(block).nbytes))
    return acc.result()
