"""The two small protocols every container implements."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from maxckpt.tensors import Index, TensorInfo


@runtime_checkable
class TensorReader(Protocol):
    """Lazy access to the tensors of one checkpoint.

    `tensors()` reads metadata only. `read(name, index)` returns one tensor or
    a slice of it; implementations read no more than the stored chunks the
    slice touches, so memory stays bounded by the requested slice.
    """

    def tensors(self) -> Mapping[str, TensorInfo]: ...

    def read(self, name: str, index: Index | None = None) -> np.ndarray: ...

    def close(self) -> None: ...


@runtime_checkable
class TensorWriter(Protocol):
    """Streams tensors into one checkpoint; `close()` writes indexes and metadata.

    `write_pieces` accepts a tensor as disjoint pieces (index, array) that tile
    it - e.g. one layer of a stacked [L, ...] tensor at a time - so a stacked
    tensor is never built whole in memory.
    """

    def write(self, name: str, array: np.ndarray) -> None: ...

    def write_pieces(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype, pieces: Iterable[tuple[Index, np.ndarray]]
    ) -> None: ...

    def close(self) -> None: ...


class ClosesOrAborts:
    """`with writer:` commits on success (`close()`) and discards a half-written output on error (`abort()`)."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()  # type: ignore[attr-defined]
        else:
            self.abort()  # type: ignore[attr-defined]
