"""The mapping vocabulary the framework tables are written in: one framework tensor and the HF tensors it is.

HF's names are the hub every bridge passes through. A framework layer is a table of entries; each entry
names one tensor of that framework (its key suffix in a layer) and the HF suffixes of the same layer it is
made of, and carries both directions, so one table serves reading and writing:

- `build(get, name, at)`: the framework tensor from HF's, lazily (no I/O here);
- `split(t, at)`: HF suffix -> tensor, from the framework's;
- `shape(hf_shape, spec)`: its shape from HF's; `hf_infos(info, spec)`: HF's shapes from its (reading dims).

The kinds: :class:`Same` (a rename; q/k rows may change rotary order), :class:`GatedPair` (`[gate; up]` rows),
:class:`FusedQKV` (rows grouped per query group, Megatron's), :class:`Experts` (HF's per-expert tensors stacked
`[X, ...]`, a gated pair fused per expert), :class:`Transposed` (HF's `[X, a, b]` held as `[X, b, a]`),
:class:`Interleaved` (gpt-oss's gate/up columns interleaved, held as `[gate; up]` rows), :class:`Padded` (a
vocabulary table with zero rows up to `At.vocab_rows`, Megatron's), :class:`ZeroBias` (a routing bias the
framework has and HF does not: zeros when written, refused unless zero when read), :class:`Part` (one of the
tensors HF fuses into one: gpt-oss's and llama4's gate/up, gemma4's packed experts) and :class:`Regrouped`
(one kernel HF holds as several, regrouped per key-head group: qwen3.5's Gated DeltaNet projections).

An entry with a `form` (:mod:`maxckpt.layouts.forms`: `Kernel`, `Vector`, `Flat`, `Conv`, `Swapped`) holds the
framework tensor in that array shape, named by model dims, so its shapes come from the model alone
(`framework_shape`, `hf_shapes`); MaxText's tables are written this way. `Same`'s flags say where the
framework's values differ from HF's, by the amounts of `At.values`: `rotary` (q/k rotary order), `query` (a
folded query scale), `norm` (a norm-scale offset), `embedding` (a scaled token table); a flagged tensor whose
transform would round in a narrow dtype is converted in float32 and kept there.

A table is a function of the model, so which entries a layer has is plain code there.
:class:`Requirement` is a condition a table declares on the model, refused with its message when it does not
hold. The walkers are the formats' layouts (:mod:`maxckpt.formats.maxtext.layout`,
:mod:`maxckpt.formats.megatron.layout`, :mod:`maxckpt.formats.torchtitan.layout`); the tables are
:mod:`maxckpt.formats.maxtext.params`, :mod:`maxckpt.families.tables.megatron` and
:mod:`maxckpt.families.tables.torchtitan`.

>>> Same("attention.wo.weight", "self_attn.o_proj.weight").hf_suffixes(None)
['self_attn.o_proj.weight']
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

from maxckpt.errors import ShapeMismatchError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.dims import shape_of
from maxckpt.layouts.forms import Form, Values, Vector, is_narrow, widens
from maxckpt.layouts.gated_deltanet import join_split, split_grouped, split_symbols
from maxckpt.layouts.torch_transforms import fuse_gate_up, fuse_qkv, pad_rows, rotary_rows, split_gate_up, split_qkv
from maxckpt.layouts.transforms import (
    half_from_interleaved, interleave_last, interleaved_from_half, lazy_rename, lazy_rows, permute_last, scale,
    shared_result, shift, unscale, unshift,
)
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = [
    "At", "Entry", "Experts", "FusedQKV", "GatedPair", "Interleaved", "Memo", "Padded", "Part", "Regrouped",
    "Requirement", "Same", "Transposed", "ZeroBias", "check_requirements", "deinterleave_gate_up",
    "interleave_gate_up",
]

HfGetter = Callable[[str], LazyTensor]  # an HF suffix of the layer -> its tensor, shape-checked


class Memo:
    """One fused read shared by the tensors split from it, across threads (see `shared_result`), per key.

    A walker keeps one per entry, so at most `keep` fused results of that entry are held at a time.
    """

    def __init__(self, keep: int = 2):
        self._fns: dict[Any, Callable[[], Any]] = {}
        self._lock = threading.Lock()
        self._get = shared_result(keep=keep)(self._run)

    def _run(self, key: Any) -> Any:
        with self._lock:
            fn = self._fns[key]
        return fn()

    def __call__(self, key: Any, fn: Callable[[], Any]) -> Any:
        with self._lock:
            self._fns.setdefault(key, fn)
        return self._get(key)


@dataclass(frozen=True)
class At:
    """Where an entry is applied: the model, layer `i`, the framework's rotary row order and the memos."""

    spec: ModelSpec
    i: int
    hf_name: Callable[[str], str]  # an HF suffix of layer i -> the full HF name
    rotary: Literal["interleaved", "half"] = "half"  # the framework's q/k row order (HF's is "half")
    memos: dict[str, Memo] = field(default_factory=dict)
    vocab_rows: int | None = None  # the rows a padded vocabulary table has in the framework (None: unpadded)
    values: Values = Values()  # how the framework's values differ from HF's (flagged `Same` entries)

    def memo(self, entry: str, key: Any, fn: Callable[[], Any]) -> Any:
        memo = self.memos.get(entry)
        if memo is None:
            memo = self.memos.setdefault(entry, Memo())
        return memo((self.i, key), fn)


@dataclass(frozen=True)
class Requirement:
    """A condition a table sets on the model; `message(spec)` says why a model that fails it is refused."""

    holds: Callable[[ModelSpec], bool]
    message: Callable[[ModelSpec], str]


def check_requirements(requirements: tuple[Requirement, ...], spec: ModelSpec) -> None:
    for r in requirements:
        if not r.holds(spec):
            raise UnsupportedModelError(r.message(spec))


@dataclass(frozen=True)
class Entry:
    """One framework tensor of a layer (`key`) and the HF suffixes it is made of (`hf`)."""

    key: str
    hf: Any

    def hf_suffixes(self, spec: ModelSpec) -> list[str]:
        return list(self.hf) if isinstance(self.hf, tuple) else [self.hf]

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        return hf_shape(self.hf_suffixes(spec)[0])

    def framework_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        """The framework tensor's shape from the entry's dims (entries with a form: MaxText's)."""
        raise TypeError(f"{self.key}: a {type(self).__name__} entry has no shape of its own (HF's is used)")

    def hf_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """HF suffix -> shape, from the entry's dims (entries with a form)."""
        raise TypeError(f"{self.key}: a {type(self).__name__} entry has no shape of its own (HF's is used)")

    def parts(self, get: HfGetter, at: At) -> list[LazyTensor] | None:
        """The pieces (one per expert) a writer may stream the built tensor in; None: one piece."""
        return None

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        raise NotImplementedError

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        raise NotImplementedError

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        return {}


@dataclass(frozen=True)
class Same(Entry):
    """One HF tensor as one framework tensor, in its `form` (None: HF's array as is, a rename).

    The flags mark what a framework may store differently (:class:`~maxckpt.layouts.forms.Values`):
    `rotary` ("q" or "k"), q/k features whose rotary order is the framework's (`at.rotary`): rows of HF's
    array, or the last axis of a form's; `query`, the query scale a framework folds in; `norm`, a norm
    scale a framework stores with an offset; `embedding`, a token table a framework stores scaled.
    """

    hf: str
    rotary: Literal["q", "k"] | None = None
    form: Form | None = None
    query: bool = False
    norm: bool = False
    embedding: bool = False

    def framework_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return self._form().shape(spec)

    def hf_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        return {self.hf: self._form().hf_shape(spec)}

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        w = get(self.hf)
        if self.form is None:
            return self._rows(w, name, at, "interleaved")
        return LazyTensor.computed(name, self.form.shape(at.spec), self.converted_dtype(at, w.dtype),
                                   lambda: self.from_hf(w.read(), at))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        name = at.hf_name(self.hf)
        if self.form is None:
            return {self.hf: self._rows(t, name, at, "half")}
        return {self.hf: LazyTensor.computed(name, self.form.hf_shape(at.spec), self.converted_dtype(at, t.dtype),
                                             lambda: self.to_hf(t.read(), at))}

    def _rows(self, t: LazyTensor, name: str, at: At, to: str) -> LazyTensor:
        if self.rotary is None or at.rotary != "interleaved":
            return lazy_rename(t, name)
        heads = at.spec.num_heads if self.rotary == "q" else at.spec.num_kv_heads
        D = at.spec.head_dim
        return LazyTensor.computed(name, t.shape, t.dtype, lambda: rotary_rows(t.read(), heads, D, to))

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        return {self.hf: info}

    # ------------------------------------------------ a form's arrays, with the framework's values

    def _form(self) -> Form:
        if self.form is None:
            raise TypeError(f"{self.key}: an entry without a form has no shape of its own (HF's is used)")
        return self.form

    def widens(self, values: Values, dtype: np.dtype) -> bool:
        """Converting this tensor in `dtype` would round it (:func:`~maxckpt.layouts.forms.widens`)."""
        return widens(values, dtype, query=self.query, norm=self.norm, embedding=self.embedding)

    def converted_dtype(self, at: At, dtype: np.dtype) -> np.dtype:
        """The dtype this tensor, held in `dtype` on one side, gets on the other (the rule is the same both
        ways): one that :meth:`widens` goes to float32, so no bit of its value is lost; a float32 one that was
        so widened from the model's narrower dtype goes back to that dtype, exactly; anything else keeps it."""
        v, dtype = at.values, np.dtype(dtype)
        if self.widens(v, dtype):
            return np.dtype(np.float32)
        if dtype == np.float32 and is_narrow(v.model_dtype) and self.widens(v, v.model_dtype):
            return np.dtype(v.model_dtype)
        return dtype

    def to_hf(self, x: np.ndarray, at: At) -> np.ndarray:
        """One framework array -> HF's, in :meth:`converted_dtype` (in float32 where that is wider than `x`)."""
        v, out = at.values, self.converted_dtype(at, x.dtype)
        if self.widens(v, x.dtype):
            x = x.astype(np.float32)
        if self.rotary and at.rotary == "interleaved":
            x = permute_last(x, half_from_interleaved(at.spec.head_dim))
        if self.query:
            x = scale(x, v.query_factor)
        if self.norm:
            x = shift(x, v.norm_offset)
        if self.embedding and v.embedding_scale is not None:
            x = unscale(x, v.embedding_scale)
        y = self._form().to_hf(x, at.spec)
        return y if y.dtype == out else y.astype(out)

    def from_hf(self, w: np.ndarray, at: At) -> np.ndarray:
        """The inverse of :meth:`to_hf`."""
        v, out = at.values, self.converted_dtype(at, w.dtype)
        x = self._form().from_hf(w.astype(np.float32) if self.widens(v, w.dtype) else w, at.spec)
        if self.embedding and v.embedding_scale is not None:
            x = scale(x, v.embedding_scale)
        if self.norm:
            x = unshift(x, v.norm_offset)
        if self.query:
            x = unscale(x, v.query_factor)
        if self.rotary and at.rotary == "interleaved":
            x = permute_last(x, interleaved_from_half(at.spec.head_dim))
        return x if x.dtype == out else x.astype(out)


@dataclass(frozen=True)
class Padded(Entry):
    """A vocabulary table (embedding or output) the framework pads with zero rows to `at.vocab_rows`;
    reading drops the padding again (`spec.vocab_size` rows are kept)."""

    hf: str

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        t = get(self.hf)
        rows = at.vocab_rows or t.shape[0]
        if rows == t.shape[0]:
            return lazy_rename(t, name)
        return LazyTensor.computed(name, (rows, *t.shape[1:]), t.dtype, lambda: pad_rows(t.read(), rows))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        vocab, emb, name = at.spec.vocab_size, at.spec.emb_dim, at.hf_name(self.hf)
        if len(t.shape) != 2 or t.shape[1] != emb or t.shape[0] < vocab:
            raise ShapeMismatchError(
                f"{t.name}: shape {tuple(t.shape)}, expected [padded vocab >= {vocab}, {emb}]; "
                "check the vocabulary size passed for this model"
            )
        return {self.hf: lazy_rename(t, name) if t.shape[0] == vocab else lazy_rows(t, vocab, name)}

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        return {self.hf: info}  # the padded rows: the true vocabulary size is not in the shapes


def _half(info: TensorInfo, axis: int = 0) -> TensorInfo:
    shape = list(info.shape)
    shape[axis] //= 2
    return TensorInfo("", tuple(shape), info.dtype)


@dataclass(frozen=True)
class GatedPair(Entry):
    """`[gate; up]` rows of HF's gate and up projections (a SwiGLU MLP's fc1)."""

    hf: tuple[str, str]

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        first = hf_shape(self.hf[0])
        return (2 * first[0], *first[1:])

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        g, u = get(self.hf[0]), get(self.hf[1])
        shape = (2 * g.shape[0], *g.shape[1:])
        return LazyTensor.computed(name, shape, g.dtype, lambda: fuse_gate_up(g.read(), u.read()))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        half = (t.shape[0] // 2, *t.shape[1:])

        def part(j: int) -> Callable[[], np.ndarray]:
            return lambda: at.memo(self.key, None, lambda: split_gate_up(t.read()))[j]

        return {s: LazyTensor.computed(at.hf_name(s), half, t.dtype, part(j)) for j, s in enumerate(self.hf)}

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        return {s: _half(info) for s in self.hf}


@dataclass(frozen=True)
class FusedQKV(Entry):
    """Megatron's `linear_qkv`: per query group the group's q heads, then k_g, then v_g (weights or biases)."""

    hf: tuple[str, str, str]

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        first = hf_shape(self.hf[0])
        return ((spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim, *first[1:])

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        s = at.spec
        H, G, D = s.num_heads, s.num_kv_heads, s.head_dim
        q, k, v = (get(x) for x in self.hf)
        shape = self.shape(lambda x: tuple(q.shape), s)
        if len(q.shape) == 1:
            def fused_bias() -> np.ndarray:
                return fuse_qkv(q.read()[:, None], k.read()[:, None], v.read()[:, None], H, G, D)[:, 0]

            return LazyTensor.computed(name, shape, q.dtype, fused_bias)
        return LazyTensor.computed(name, shape, q.dtype, lambda: fuse_qkv(q.read(), k.read(), v.read(), H, G, D))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        s = at.spec
        H, G, D = s.num_heads, s.num_kv_heads, s.head_dim
        bias = len(t.shape) == 1

        def whole() -> tuple:
            if bias:
                return tuple(p[:, 0] for p in split_qkv(t.read()[:, None], H, G, D))
            return split_qkv(t.read(), H, G, D)

        def part(j: int) -> Callable[[], np.ndarray]:
            return lambda: at.memo(self.key, None, whole)[j]

        rows = (H * D, G * D, G * D)
        return {x: LazyTensor.computed(at.hf_name(x), (rows[j], *t.shape[1:]), t.dtype, part(j))
                for j, x in enumerate(self.hf)}


@dataclass(frozen=True)
class Experts(Entry):
    """HF's per-expert tensors (`{e}` in the suffix) stacked `[X, ...]`; two suffixes: a gated pair per expert.

    With a `form`, each expert's array is in that form (MaxText's expert kernels `[X, E, M]`).
    """

    hf: tuple[str, ...]
    form: Form | None = None

    def hf_suffixes(self, spec: ModelSpec) -> list[str]:
        return [s.format(e=e) for e in range(spec.num_experts) for s in self.hf]

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        first = hf_shape(self.hf[0].format(e=0))
        rows = first[0] * len(self.hf)
        return (spec.num_experts, rows, *first[1:])

    def framework_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return (spec.num_experts, *self._one().shape(spec))

    def hf_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        return dict.fromkeys(self.hf_suffixes(spec), self._one().hf_shape(spec))

    def _one(self) -> Form:
        if self.form is None or len(self.hf) != 1:
            raise TypeError(f"{self.key}: only one expert tensor in a form has a shape of its own")
        return self.form

    def parts(self, get: HfGetter, at: At) -> list[LazyTensor]:
        if self.form is not None:
            form, out = self._one(), []
            for e in range(at.spec.num_experts):
                w = get(self.hf[0].format(e=e))
                out.append(LazyTensor.computed(f"{self.key}[{e}]", form.shape(at.spec), w.dtype,
                                               lambda w=w: form.from_hf(w.read(), at.spec)))
            return out
        if len(self.hf) == 1:
            return [get(self.hf[0].format(e=e)) for e in range(at.spec.num_experts)]
        out = []
        for e in range(at.spec.num_experts):
            g, u = get(self.hf[0].format(e=e)), get(self.hf[1].format(e=e))
            out.append(LazyTensor.computed(f"{self.key}[{e}]", (2 * g.shape[0], *g.shape[1:]), g.dtype,
                                           lambda g=g, u=u: fuse_gate_up(g.read(), u.read())))
        return out

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        return LazyTensor.stacked(name, self.parts(get, at))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        out: dict[str, LazyTensor] = {}
        X = at.spec.num_experts
        if self.form is not None:
            form = self._one()
            shape = form.hf_shape(at.spec)
            for e in range(X):
                s = self.hf[0].format(e=e)
                out[s] = LazyTensor.computed(at.hf_name(s), shape, t.dtype,
                                             lambda e=e: form.to_hf(t.read((e,)), at.spec))
            return out
        if len(self.hf) == 1:
            for e in range(X):
                s = self.hf[0].format(e=e)
                out[s] = LazyTensor(at.hf_name(s), tuple(t.shape[1:]), t.dtype,
                                    lambda index, e=e: t.read((e,) + tuple(index or ())))
            return out
        half = (t.shape[1] // 2, *t.shape[2:])
        for e in range(X):
            for j, template in enumerate(self.hf):
                s = template.format(e=e)
                out[s] = LazyTensor.computed(
                    at.hf_name(s), half, t.dtype,
                    lambda e=e, j=j: at.memo(self.key, e, lambda: split_gate_up(t.read((e,))))[j])
        return out

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        one = TensorInfo("", (info.shape[1] // len(self.hf), *info.shape[2:]), info.dtype)
        return {s.format(e=e): one for e in range(info.shape[0]) for s in self.hf}


def _per_expert(name: str, shape: tuple[int, ...], dtype: Any, X: int, read: Callable[[int], np.ndarray]) -> LazyTensor:
    """`[X, *shape]` computed one expert per piece, so a writer holds one expert at a time."""
    return LazyTensor.stacked(name, [LazyTensor.computed(f"{name}[{e}]", shape, dtype, lambda e=e: read(e))
                                     for e in range(X)])


@dataclass(frozen=True)
class Transposed(Entry):
    """HF's fused `[X, a, b]` held `[X, b, a]` (each expert's matrix transposed), one expert per piece."""

    hf: str

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        X, a, b = hf_shape(self.hf)
        return (X, b, a)

    def parts(self, get: HfGetter, at: At) -> list[LazyTensor]:
        t = get(self.hf)
        X, a, b = t.shape
        return [LazyTensor.computed(f"{self.key}[{e}]", (b, a), t.dtype,
                                    lambda e=e: np.ascontiguousarray(t.read((e,)).T)) for e in range(X)]

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        return LazyTensor.stacked(name, self.parts(get, at))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        X, b, a = t.shape
        name = at.hf_name(self.hf)
        return {self.hf: _per_expert(name, (a, b), t.dtype, X, lambda e: np.ascontiguousarray(t.read((e,)).T))}

    def hf_infos(self, info: TensorInfo, spec: ModelSpec | None = None) -> dict[str, TensorInfo]:
        X, b, a = info.shape
        return {self.hf: TensorInfo("", (X, a, b), info.dtype)}


def deinterleave_gate_up(w: np.ndarray) -> np.ndarray:
    """gpt-oss `gate_up_proj` `[..., E, 2M]` (gate at even columns, up at odd) -> `[..., 2M, E]` = [gate; up] rows."""
    return np.ascontiguousarray(np.concatenate([w[..., 0::2], w[..., 1::2]], axis=-1).swapaxes(-1, -2))


def interleave_gate_up(fc1: np.ndarray) -> np.ndarray:
    """`[..., 2M, E]` = [gate; up] -> gpt-oss `[..., E, 2M]` interleaved; the inverse of the above."""
    m = fc1.shape[-2] // 2
    out = np.empty((*fc1.shape[:-2], fc1.shape[-1], 2 * m), dtype=fc1.dtype)
    out[..., 0::2] = fc1[..., :m, :].swapaxes(-1, -2)
    out[..., 1::2] = fc1[..., m:, :].swapaxes(-1, -2)
    return out


@dataclass(frozen=True)
class Interleaved(Entry):
    """gpt-oss's fused `gate_up_proj` `[X, E, 2M]` (gate and up interleaved column by column) held as
    `[X, 2M, E]` ([gate; up] rows), one expert per piece; its bias `[X, 2M]` likewise (`bias=True`)."""

    hf: str
    bias: bool = False

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        if self.bias:
            return hf_shape(self.hf)
        X, E, M2 = hf_shape(self.hf)
        return (X, M2, E)

    def parts(self, get: HfGetter, at: At) -> list[LazyTensor] | None:
        if self.bias:
            return None
        t = get(self.hf)
        X, E, M2 = t.shape
        return [LazyTensor.computed(f"{self.key}[{e}]", (M2, E), t.dtype,
                                    lambda e=e: deinterleave_gate_up(t.read((e,)))) for e in range(X)]

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        if self.bias:
            t = get(self.hf)
            return LazyTensor.computed(name, t.shape, t.dtype,
                                       lambda: deinterleave_gate_up(t.read()[:, None, :])[..., 0])
        return LazyTensor.stacked(name, self.parts(get, at))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        name = at.hf_name(self.hf)
        if self.bias:
            return {self.hf: LazyTensor.computed(name, t.shape, t.dtype,
                                                 lambda: interleave_gate_up(t.read()[:, :, None])[:, 0, :])}
        X, M2, E = t.shape
        return {self.hf: LazyTensor.computed(name, (X, E, M2), t.dtype, lambda: interleave_gate_up(t.read()))}


@dataclass(frozen=True)
class Part(Entry):
    """Framework tensor `slot` of `of` that HF fuses into one tensor `hf`: interleaved on the last axis
    ("interleave": gpt-oss's gate_up_proj), concatenated on it ("concat": llama4's), or concatenated on
    axis 1 of an `[X, a, b]` the framework holds `[X, b, a]` ("swapped": gemma4's packed experts).

    Reading is one-to-one (:meth:`build` takes the slot); writing needs every part, so the walker groups
    the parts of one `hf` and calls :meth:`join` on them.
    """

    hf: str
    form: Form = Vector(())
    slot: int = 0
    of: int = 2
    fused: Literal["interleave", "concat", "swapped"] = "interleave"

    def framework_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return self.form.shape(spec)

    def hf_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        shape = self.form.shape(spec)
        if self.fused == "swapped":
            return {self.hf: (shape[0], shape[-1] * self.of, *shape[1:-1])}
        return {self.hf: (*shape[:-1], shape[-1] * self.of)}

    def take(self, w: np.ndarray) -> np.ndarray:
        """This part of HF's fused array."""
        k, n = self.slot, self.of
        if self.fused == "swapped":
            width = w.shape[1] // n
            return np.ascontiguousarray(np.swapaxes(w[:, k * width : (k + 1) * width], -1, -2))
        if self.fused == "concat":
            width = w.shape[-1] // n
            return np.ascontiguousarray(w[..., k * width : (k + 1) * width])
        return np.ascontiguousarray(w[..., k::n])

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        w = get(self.hf)
        return LazyTensor.computed(name, self.form.shape(at.spec), w.dtype, lambda: self.take(w.read()))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        raise TypeError(f"{self.key} is one part of {self.hf}: write it with join(), all parts together")

    def join(self, tensors: list[LazyTensor], at: At) -> dict[str, LazyTensor]:
        """HF's fused tensor from every part's framework tensor (`tensors`, in slot order)."""
        def fused() -> np.ndarray:
            arrays = [t.read() for t in tensors]
            if self.fused == "swapped":
                return np.concatenate([np.ascontiguousarray(np.swapaxes(x, -1, -2)) for x in arrays], axis=1)
            if self.fused == "concat":
                return np.concatenate(arrays, axis=-1)
            return interleave_last(arrays)

        shape = self.hf_shapes(at.spec)[self.hf]
        return {self.hf: LazyTensor.computed(at.hf_name(self.hf), shape, tensors[0].dtype, fused)}


@dataclass(frozen=True)
class Regrouped(Entry):
    """One framework kernel, packed per key-head group, that HF holds as several head-major tensors
    (qwen3.5's Gated DeltaNet input projections; `grouping` "qkvz" or "ba": :mod:`maxckpt.layouts.gated_deltanet`)."""

    hf: tuple[str, ...]
    form: Form = Vector(())
    grouping: Literal["qkvz", "ba"] = "qkvz"

    def framework_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return self.form.shape(spec)

    def hf_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        return {s: shape_of(d, spec) for s, d in zip(self.hf, split_symbols(self.grouping))}

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        parts = [get(s) for s in self.hf]
        return LazyTensor.computed(
            name, self.form.shape(at.spec), parts[0].dtype,
            lambda: self.form.from_hf(join_split(self.grouping, [p.read() for p in parts], at.spec), at.spec))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        # each part splits the layer's kernel again (a stacked read is cached per layer by the walker)
        shapes = self.hf_shapes(at.spec)
        return {s: LazyTensor.computed(
            at.hf_name(s), shapes[s], t.dtype,
            lambda j=j: split_grouped(self.grouping, self.form.to_hf(t.read(), at.spec), at.spec)[j])
            for j, s in enumerate(self.hf)}


@dataclass(frozen=True)
class ZeroBias(Entry):
    """A load-balancing bias added to the routing scores that HF's model has no place for.

    Written as zeros (`[X]` float32); read, it must be zero, or the HF tensor `guards` (the router)
    refuses to be read: dropping it would change which experts are chosen. `hf` names HF's model in the message.
    """

    hf: str  # the HF model's name, for the message
    guards: str = ""

    def hf_suffixes(self, spec: ModelSpec) -> list[str]:
        return []

    def shape(self, hf_shape: Callable[[str], tuple[int, ...]], spec: ModelSpec) -> tuple[int, ...]:
        return (spec.num_experts,)

    def build(self, get: HfGetter, name: str, at: At) -> LazyTensor:
        return LazyTensor.from_array(name, np.zeros(at.spec.num_experts, np.float32))

    def split(self, t: LazyTensor, at: At) -> dict[str, LazyTensor]:
        return {}

    def guard(self, bias: LazyTensor, outputs: dict[str, LazyTensor], framework: str) -> None:
        """Make `outputs[self.guards]` refuse to be read while `bias` is non-zero."""
        target = outputs[self.guards]

        def read() -> np.ndarray:
            if np.any(bias.read() != 0):
                raise UnsupportedModelError(
                    f"{bias.name} is non-zero: {framework}'s load-balancing bias steers routing and {self.hf} has "
                    "no such tensor; converting would change which experts are chosen"
                )
            return target.read()

        outputs[self.guards] = LazyTensor.computed(target.name, target.shape, target.dtype, read)


def hf_infos_of(entries: Mapping[str, Entry], infos: Mapping[str, TensorInfo], spec: ModelSpec | None = None
                ) -> dict[str, TensorInfo]:
    """HF suffix -> shape the framework tensors of one layer (suffix -> info) stand for, through their entries."""
    out: dict[str, TensorInfo] = {}
    for key, info in infos.items():
        entry = entries.get(key)
        if entry is not None:
            out.update(entry.hf_infos(info, spec))
    return out
