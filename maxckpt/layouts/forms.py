"""How a framework holds an HF tensor's array (its *form*), and how its values differ from HF's (:class:`Values`).

A mapping entry (:mod:`maxckpt.layouts.mapping`) says which framework tensor is which HF tensor; its form says
how the one array is the other, in dimension symbols (:mod:`maxckpt.layouts.dims`) so the entry serves every
size of a family. Megatron and TorchTitan hold HF's arrays as they are (no form); MaxText's arrays have one:

- :class:`Vector`: the same array;
- :class:`Flat`: HF holds it flattened (a per-head bias `[H, D]` as `[H*D]`);
- :class:`Kernel`: a JAX DenseGeneral kernel `[in..., out...]`, HF's torch Linear `[out, in]`;
- :class:`Conv`: a depthwise conv kernel `[kernel, 1, channels]`, HF's Conv1d `[channels, 1, kernel]`;
- :class:`Swapped`: HF's `[..., a, b]` held `[..., b, a]` (gemma4's packed experts).

:class:`Values` are a framework's conventions for the entries flagged `query`, `norm` and `embedding`:
MaxText folds the query scale into the query kernel, stores Gemma's norms as `1 + w` and scales Gemma's
embedding table by sqrt(emb_dim); HF does none of these. Such a factor is applied in float32, and a
narrow tensor it would round is widened to float32 (:func:`widens`).

>>> import numpy as np
>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("llama2", 2, 8, 2, 1, 4, 16, 32)
>>> k = Kernel(("E",), ("Hq", "D"))
>>> k.shape(spec), k.hf_shape(spec)
((8, 2, 4), (8, 8))
>>> x = np.arange(64, dtype=np.float32).reshape(8, 2, 4)
>>> bool((k.from_hf(k.to_hf(x, spec), spec) == x).all())
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.dims import shape_of

__all__ = ["Conv", "Flat", "Form", "Kernel", "Swapped", "Values", "Vector", "is_narrow", "power_of_two", "widens"]


@dataclass(frozen=True)
class Form:
    """The framework array of one HF tensor: its dims (symbols) and both directions."""

    out_dims: tuple[str, ...]
    in_dims: tuple[str, ...] = ()  # a kernel's input dims (empty: not a kernel)

    def shape(self, spec: ModelSpec) -> tuple[int, ...]:
        """The framework array's shape."""
        return shape_of(self.in_dims + self.out_dims, spec)

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return shape_of(self.out_dims, spec)

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return x

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return w


@dataclass(frozen=True)
class Vector(Form):
    """The same array in both (a norm scale, a bias, a table)."""


@dataclass(frozen=True)
class Flat(Form):
    """HF holds the array flattened."""

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return (math.prod(shape_of(self.out_dims, spec)),)

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(-1)

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return w.reshape(shape_of(self.out_dims, spec))


@dataclass(frozen=True)
class Kernel(Form):
    """A DenseGeneral kernel `[in..., out...]`; HF's Linear weight `[prod(out), prod(in)]`."""

    def __init__(self, in_dims: tuple[str, ...], out_dims: tuple[str, ...]):
        object.__setattr__(self, "out_dims", out_dims)
        object.__setattr__(self, "in_dims", in_dims)

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return (math.prod(shape_of(self.out_dims, spec)), math.prod(shape_of(self.in_dims, spec)))

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return tf.kernel_to_torch(x, len(self.in_dims))

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return tf.torch_to_kernel(w, shape_of(self.in_dims, spec), shape_of(self.out_dims, spec))


@dataclass(frozen=True)
class Conv(Form):
    """A depthwise conv kernel `[kernel, 1, channels]`; HF's Conv1d weight `[channels, 1, kernel]`."""

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return shape_of(self.out_dims, spec)[::-1]

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(2, 1, 0))

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return np.ascontiguousarray(w.transpose(2, 1, 0))


@dataclass(frozen=True)
class Swapped(Form):
    """HF's `[..., a, b]` held as `[..., b, a]`."""

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        shape = shape_of(self.out_dims, spec)
        return (*shape[:-2], shape[-1], shape[-2])

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(x, -1, -2))

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(w, -1, -2))


@dataclass(frozen=True)
class Values:
    """How a framework's stored values differ from HF's, for the entries flagged `query`, `norm`, `embedding`.

    The defaults are HF's own (Megatron and TorchTitan store HF's values); MaxText's are
    :func:`maxckpt.formats.maxtext.params.maxtext_values`.
    """

    query_factor: float = 1.0  # HF query = framework query * this (a scale the framework folded in)
    norm_offset: float = 0.0  # HF norm weight = framework scale - this (Gemma's `1 + w`)
    embedding_scale: float | None = None  # framework table = HF table * this (None: the same table)
    model_dtype: np.dtype | None = None  # the model's main floating dtype: what a widened tensor came from


def power_of_two(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5


def is_narrow(dtype: np.dtype | None) -> bool:
    return dtype is not None and tf.is_float(dtype) and np.dtype(dtype).itemsize < 4


def widens(values: Values, dtype: np.dtype, *, query: bool, norm: bool, embedding: bool) -> bool:
    """A tensor so flagged is transformed by a factor or offset that `dtype`, narrower than float32, would
    round: Gemma's norm offset, an embedding or query scale that is not a power of two (sqrt(128)), or in
    float16 any scale. Such a tensor is converted in float32 and kept in float32."""
    if not is_narrow(dtype):
        return False
    # A power of two is exact in bfloat16 (float32's exponent range), not in float16, whose small
    # exponent range turns a division by 16 into subnormals that drop bits.
    rounds = (lambda f: f != 1.0) if np.dtype(dtype) == np.float16 else (lambda f: not power_of_two(f))
    offset = norm and bool(values.norm_offset)
    table = embedding and values.embedding_scale is not None and rounds(values.embedding_scale)
    scaled = query and rounds(values.query_factor)
    return offset or table or scaled
