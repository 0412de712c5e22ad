"""Tensor descriptions shared by containers, layouts and the conversion pipeline.

:class:`TensorInfo` is what a container knows without reading data.
:class:`LazyTensor` is a tensor that is only computed when a writer asks for
it, whole or one index (layer slice) at a time; chaining LazyTensors through
layouts is how a conversion streams with memory bounded by one tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import ml_dtypes  # noqa: F401  (registers bfloat16 & friends with numpy)
import numpy as np

from maxckpt.errors import ShapeMismatchError

# Basic numpy indexing: a tuple of ints and slices (no fancy indexing).
Index = tuple[int | slice, ...]


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one stored tensor, known without reading it.

    `chunk_shape` is the storage chunk (Orbax/zarr) or None when the container
    stores the tensor contiguously.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def index_shape(shape: Sequence[int], index: Index | None) -> tuple[int, ...]:
    """Shape of `array[index]` for an array of `shape`, without any array."""
    if index is None:
        return tuple(shape)
    out: list[int] = []
    for dim, item in enumerate(index):
        if isinstance(item, slice):
            out.append(len(range(*item.indices(shape[dim]))))
        elif not isinstance(item, (int, np.integer)):
            raise TypeError(f"index items must be ints or slices, got {item!r}")
    out.extend(shape[len(index):])
    return tuple(out)


@dataclass(frozen=True)
class LazyTensor:
    """A tensor computed on demand.

    `fn(index)` returns `tensor[index]` (index None means the whole tensor).
    Sources that can read a slice cheaply (Orbax through TensorStore) pass the
    index down; derived tensors compute and slice. `pieces`, when set, tiles
    the tensor into independently computable parts (index, fn) - typically one
    per layer of a stacked [L, ...] tensor - so writers can stream it.

    >>> t = LazyTensor.from_array("w", np.arange(6).reshape(2, 3))
    >>> t.read((1,)).tolist()
    [3, 4, 5]
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fn: Callable[[Index | None], np.ndarray] = field(repr=False)
    pieces: tuple[tuple[Index, Callable[[], np.ndarray]], ...] | None = field(default=None, repr=False)
    # The storage chunk of a tensor read straight from a container (None: contiguous or
    # derived); streaming readers use it to pick read sizes that decode each chunk once.
    chunk_shape: tuple[int, ...] | None = field(default=None, repr=False)

    def read(self, index: Index | None = None) -> np.ndarray:
        out = np.asarray(self.fn(index))
        expected = index_shape(self.shape, index)
        if out.shape != expected:
            raise ShapeMismatchError(f"tensor {self.name}: computed shape {out.shape}, expected {expected}")
        return out

    @property
    def nbytes(self) -> int:
        return self.info.nbytes

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.name, self.shape, np.dtype(self.dtype), self.chunk_shape)

    @classmethod
    def from_array(cls, name: str, array: np.ndarray) -> "LazyTensor":
        """Wrap an in-memory array (tests, small sidecar tensors)."""
        arr = np.asarray(array)
        return cls(name, arr.shape, arr.dtype, lambda index: arr if index is None else arr[index])

    @classmethod
    def computed(
        cls, name: str, shape: Sequence[int], dtype: np.dtype, compute: Callable[[], np.ndarray]
    ) -> "LazyTensor":
        """A tensor derived by a function of other tensors; slices compute the whole first."""

        def fn(index: Index | None) -> np.ndarray:
            whole = compute()
            return whole if index is None else whole[index]

        return cls(name, tuple(int(d) for d in shape), np.dtype(dtype), fn)

    @classmethod
    def stacked(
        cls,
        name: str,
        parts: Sequence["LazyTensor"],
        axis: int = 0,
    ) -> "LazyTensor":
        """Stack same-shaped tensors along a new `axis`, streamable one part at a time."""
        if not parts:
            raise ValueError(f"{name}: nothing to stack")
        first = parts[0]
        shape = list(first.shape)
        shape.insert(axis, len(parts))

        def piece_index(i: int) -> Index:
            return tuple([slice(None)] * axis + [i])

        pieces = tuple((piece_index(i), (lambda p=p: p.read())) for i, p in enumerate(parts))

        def fn(index: Index | None) -> np.ndarray:
            if index is not None and len(index) > axis and isinstance(index[axis], (int, np.integer)):
                i = int(index[axis])
                rest = tuple(index[:axis]) + tuple(index[axis + 1:])
                return parts[i].read(rest or None)
            whole = np.stack([p.read() for p in parts], axis=axis)
            return whole if index is None else whole[index]

        return cls(name, tuple(shape), np.dtype(first.dtype), fn, pieces)
