"""The small pure functions every layout mapping is built from.

Each function works on numpy arrays (bfloat16 through ml_dtypes) and has an
exact inverse, so a mapping can be tested on tiny arrays without any file and
round trips are bit-exact wherever the arithmetic allows it:

- kernels: MaxText/JAX kernels are `[in..., out...]`, PyTorch weights `[out, in]`;
- layers: stacked `[.., L, ..]` tensors and per-layer ones;
- rotary: "half" (HF rotate-half) versus "interleaved" (pairs 2i, 2i+1) order
  of the query/key features inside each head;
- scaling: a factor folded into a kernel, applied in float32;
- lazy views (cast, rename, one layer, leading rows) that keep slice reads
  going to the source, shared by every layout.

>>> import numpy as np
>>> k = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # [E=2, H=3, D=4]
>>> w = kernel_to_torch(k, in_dims=1)                     # [H*D, E]
>>> w.shape, bool((torch_to_kernel(w, (2,), (3, 4)) == k).all())
((12, 2), True)
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from maxckpt.tensors import Index, LazyTensor


def transpose2d(a: np.ndarray, rows_per_block: int = 16) -> np.ndarray:
    """`a.T` as a new C-contiguous array, copied in blocks of input rows.

    numpy's plain transposed copy walks memory with a large stride and runs
    2-3x slower than this on big kernels; the copy moves the bits through a
    same-width unsigned view, so bfloat16 and float8 copy as fast as floats.
    """
    src = a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a
    out = np.empty((src.shape[1], src.shape[0]), src.dtype)
    for i in range(0, src.shape[0], rows_per_block):
        out[:, i : i + rows_per_block] = src[i : i + rows_per_block].T
    return out.view(a.dtype)


def kernel_to_torch(kernel: np.ndarray, in_dims: int) -> np.ndarray:
    """`[in..., out...]` (JAX DenseGeneral) -> 2-D `[out, in]` (torch Linear), C-contiguous."""
    n_in = math.prod(kernel.shape[:in_dims])
    return transpose2d(kernel.reshape(n_in, -1))  # a view where numpy can (a layer of a stacked kernel): no copy first


def torch_to_kernel(weight: np.ndarray, in_shape: Sequence[int], out_shape: Sequence[int]) -> np.ndarray:
    """2-D `[out, in]` -> `[in..., out...]`; the inverse of :func:`kernel_to_torch`."""
    n_in, n_out = math.prod(in_shape), math.prod(out_shape)
    if weight.shape != (n_out, n_in):
        raise ValueError(f"weight shape {weight.shape} is not [out={n_out}, in={n_in}]")
    return transpose2d(np.ascontiguousarray(weight)).reshape(*in_shape, *out_shape)


def half_from_interleaved(head_dim: int) -> np.ndarray:
    """Feature order that turns interleaved pairs into rotate-half: evens, then odds.

    `x[..., half_from_interleaved(D)]` reorders the last (head_dim) axis.
    """
    if head_dim % 2:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def interleaved_from_half(head_dim: int) -> np.ndarray:
    """The inverse permutation of :func:`half_from_interleaved`."""
    return np.argsort(half_from_interleaved(head_dim))


def permute_last(x: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Reorder the last axis (the per-head feature axis of q/k kernels and q/k norms)."""
    return np.ascontiguousarray(x[..., order])


def _in_float32(op: np.ufunc, x: np.ndarray, value: float) -> np.ndarray:
    """`op(x, value)` computed in float32 and returned in `x`'s dtype, in one new array for float32 input.

    Why not `(x.astype(float32) op value).astype(x.dtype)`: `astype` copies
    even when the dtype is already float32, so a float32 tensor went through
    three full-size arrays (on fresh pages) where one does, and scaling a
    query kernel took 2.5x longer. Narrower input is widened once and the
    operation runs in place on that copy. `x` itself (a view of a source file
    or of a cached layer group) is never written to; the bits are the same.
    """
    if x.dtype == np.float32:
        return op(x, np.float32(value))
    wide = x.astype(np.float32)
    op(wide, np.float32(value), out=wide)
    return wide.astype(x.dtype)


def scale(x: np.ndarray, factor: float) -> np.ndarray:
    """Multiply by `factor` in float32 and return the input dtype.

    MaxText folds 1/sqrt(head_dim) into the query kernel; HF does not. A factor
    that is a power of two (head_dim 4, 16, 64, 256) is exact in every float
    dtype; otherwise the result is rounded once, from float32.
    """
    if factor == 1.0:
        return x
    return _in_float32(np.multiply, x, factor)


def unscale(x: np.ndarray, factor: float) -> np.ndarray:
    """Divide by `factor` in float32 and return the input dtype: the inverse of :func:`scale`.

    Dividing (not multiplying by 1/factor) makes `unscale(scale(x, f), f) == x`
    whenever the rounding allows it: for f = sqrt(128), 85% of float32 values
    come back bit-exact (62% with a reciprocal), and bfloat16 values stored
    as float32 in between always do.
    """
    if factor == 1.0:
        return x
    return _in_float32(np.divide, x, factor)


def shift(x: np.ndarray, offset: float) -> np.ndarray:
    """`x - offset` in float32, returned in the input dtype (Gemma norms: HF weight = scale - 1).

    For a scale in [0.5, 2] the difference is exact (Sterbenz), so MaxText -> HF -> MaxText
    gives back the same bits; :func:`unshift` is the inverse.
    """
    if not offset:
        return x
    return _in_float32(np.subtract, x, offset)


def unshift(x: np.ndarray, offset: float) -> np.ndarray:
    """`x + offset` in float32, in the input dtype: the inverse of :func:`shift`."""
    if not offset:
        return x
    return _in_float32(np.add, x, offset)


def interleave_last(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Fuse same-shaped arrays along the last axis, alternating: `out[..., k::n] = parts[k]` (gpt-oss gate_up)."""
    n = len(parts)
    out = np.empty((*parts[0].shape[:-1], parts[0].shape[-1] * n), parts[0].dtype)
    for k, part in enumerate(parts):
        out[..., k::n] = part
    return out


def lazy_grid(name: str, parts: Sequence[Sequence[LazyTensor]], outer_axis: int = 1, inner_axis: int = 0) -> LazyTensor:
    """Stack `parts[i][j]` into one tensor with i on `outer_axis` and j on `inner_axis`, one piece per part.

    Why: a scanned MaxText expert tensor is `[experts, layers, ...]`; built from per-expert HF
    tensors, it is written one (expert, layer) piece at a time, so memory holds one expert.

    >>> parts = [[LazyTensor.from_array(f"{i}{j}", np.full((2,), 10 * i + j)) for j in range(3)] for i in range(2)]
    >>> t = lazy_grid("w", parts)
    >>> t.shape, t.read()[:, :, 0].tolist()
    ((3, 2, 2), [[0, 10], [1, 11], [2, 12]])
    """
    if not parts or not parts[0]:
        raise ValueError(f"{name}: nothing to stack")
    first = parts[0][0]
    shape = list(first.shape)
    for axis, size in sorted(((inner_axis, len(parts[0])), (outer_axis, len(parts)))):
        shape.insert(axis, size)

    def index_of(i: int, j: int) -> Index:
        idx: list[int | slice] = [slice(None)] * (max(inner_axis, outer_axis) + 1)
        idx[outer_axis], idx[inner_axis] = i, j
        return tuple(idx)

    pieces = tuple((index_of(i, j), (lambda p=p: p.read())) for i, row in enumerate(parts) for j, p in enumerate(row))

    def fn(index: Index | None) -> np.ndarray:
        inner = np.stack([np.stack([p.read() for p in row], axis=0) for row in parts], axis=0)  # [outer, inner, ...]
        order = sorted(((outer_axis, 0), (inner_axis, 1)))
        whole = np.moveaxis(inner, [src for _, src in order], [dst for dst, _ in order])
        return whole if index is None else whole[index]

    return LazyTensor(name, tuple(shape), np.dtype(first.dtype), fn, pieces)


def cast(x: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """`x` in `dtype` (floating tensors only; integer tensors keep their dtype)."""
    if dtype is None or x.dtype == np.dtype(dtype) or not is_float(x.dtype):
        return x
    return x.astype(dtype)


# ----------------------------------------------------------------- lazy forms


def lazy_map(
    name: str,
    src: LazyTensor,
    fn: Callable[[np.ndarray], np.ndarray],
    shape: Sequence[int] | None = None,
    dtype: np.dtype | None = None,
) -> LazyTensor:
    """A LazyTensor computing `fn(src.read())`; pieces of `src` are not preserved."""
    out_shape = tuple(src.shape if shape is None else shape)
    return LazyTensor.computed(name, out_shape, np.dtype(src.dtype if dtype is None else dtype), lambda: fn(src.read()))


def lazy_cast(t: LazyTensor, dtype: np.dtype | None) -> LazyTensor:
    """`t` read in `dtype`, keeping slice reads and pieces (so streaming survives the cast)."""
    if dtype is None or np.dtype(t.dtype) == np.dtype(dtype) or not is_float(t.dtype):
        return t
    dtype = np.dtype(dtype)
    pieces = None
    if t.pieces is not None:
        pieces = tuple((idx, (lambda f=f: f().astype(dtype))) for idx, f in t.pieces)
    return LazyTensor(t.name, t.shape, dtype, lambda index: t.read(index).astype(dtype), pieces, t.chunk_shape)


def lazy_rename(t: LazyTensor, name: str) -> LazyTensor:
    """The same tensor under another name (slices and pieces kept)."""
    return LazyTensor(name, t.shape, t.dtype, t.fn, t.pieces, t.chunk_shape)


def lazy_layer(t: LazyTensor, i: int, name: str) -> LazyTensor:
    """Layer `i` of a stacked `[L, ...]` tensor, read without touching other layers.

    Slices pass down to the source, so a DCP stacked tensor stored one chunk per
    layer reads exactly that layer's chunk.
    """
    if not 0 <= i < t.shape[0]:
        raise IndexError(f"{t.name}: layer {i} out of range for {t.shape[0]} layers")

    def fn(index: Index | None) -> np.ndarray:
        return t.read((i,) + tuple(index or ()))

    return LazyTensor(name, tuple(t.shape[1:]), t.dtype, fn)


def lazy_rows(t: LazyTensor, rows: int, name: str) -> LazyTensor:
    """The first `rows` rows of `t` (unpadding a vocabulary), read lazily."""
    if rows > t.shape[0]:
        raise ValueError(f"{t.name}: has {t.shape[0]} rows, fewer than the {rows} asked for")

    def fn(index: Index | None) -> np.ndarray:
        index = tuple(index or ())
        first = index[0] if index else slice(None)
        if isinstance(first, slice):
            start, stop, step = first.indices(rows)
            first = slice(start, stop, step)
        elif not -rows <= int(first) < rows:
            raise IndexError(f"row {first} out of range for {rows} rows")
        else:
            first = int(first) % rows
        return t.read((first,) + index[1:])

    return LazyTensor(name, (rows, *t.shape[1:]), t.dtype, fn)


def is_float(dtype: np.dtype | type) -> bool:
    """True for numpy floats and the ml_dtypes ones (bfloat16, float8_*)."""
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16" or dtype.name.startswith("float8")


def on_axis(axis: int, item: int | slice) -> Index:
    """The index applying `item` to dimension `axis` and taking every other dimension whole.

    >>> np.arange(12).reshape(2, 3, 2)[on_axis(1, 2)].tolist()
    [[4, 5], [10, 11]]
    """
    return (slice(None),) * axis + (item,)


def insert_axis(shape: Sequence[int], axis: int, size: int) -> tuple[int, ...]:
    """`shape` with a new dimension of `size` at `axis`."""
    out = list(shape)
    out.insert(axis, size)
    return tuple(out)


def remove_axis(shape: Sequence[int], axis: int) -> tuple[int, ...]:
    """`shape` without dimension `axis`."""
    return tuple(d for k, d in enumerate(shape) if k != axis)


# ------------------------------------------------- stacked tensors, streamed

def default_read_budget() -> int:
    """A quarter of physical memory, at least 1 GiB: big enough that stacked tensors are usually read once."""
    try:
        import psutil

        return max(1 << 30, psutil.virtual_memory().total // 4)
    except Exception:  # psutil missing or unsupported platform: a safe constant
        return 1 << 30


DEFAULT_READ_BUDGET = default_read_budget()


class LayerGroups:
    """Per-layer reads of stacked `[.., L, ..]` tensors, fetched a group of layers at a time.

    Why: a scanned MaxText tensor is usually stored in chunks that span every
    layer, so reading layer i alone would decode the same chunks L times.
    A *group* of consecutive layers is read per storage read instead: as many
    layers as fit in a third of `budget` (a mapping may stream q, k and v side
    by side), rounded to whole chunks when the chunks split the layer axis.
    Memory stays within `budget` (plus the chunk being decoded); each chunk is
    decoded ceil(L / group) times, once when the stacked tensor fits. The
    default budget is a quarter of physical memory (at least 1 GiB).

    >>> import numpy as np
    >>> t = LazyTensor.from_array("w", np.arange(12).reshape(2, 3, 2))  # L=3 on axis 1
    >>> LayerGroups(budget=1 << 20).layer(t, axis=1, i=2).tolist()
    [[4, 5], [10, 11]]
    """

    STREAMS = 3  # tensors read side by side (q, k, v of one layer); older ones are done

    def __init__(self, budget: int | None = None):
        self.budget = max(1, int(DEFAULT_READ_BUDGET if budget is None else budget))
        self._groups: dict[tuple[str, int, int], np.ndarray] = {}  # (name, axis, start) -> group, oldest first
        self._unread: dict[tuple[str, int, int], dict[int, int]] = {}  # layer -> hand-outs still due, per group
        self._recent: list[str] = []  # tensor names, most recently used last
        self._loading: dict[tuple[str, int, int], threading.Event] = {}  # groups being read by some thread
        self._lock = threading.Lock()
        # Tensors kept side by side. Parallel read-ahead (see conversion.scheduling) reaches a few
        # tensors past the one being written, so groups of those are kept too.
        self.streams = 2 * self.STREAMS
        # A process of a multi-process conversion converts only HF layers [lo, hi) (`window`); `positions`
        # maps each stacked tensor's name to the HF layer at each of its stack positions, so that a group
        # read stays within the window and no process reads another's layers.
        self.window: tuple[int, int] | None = None
        self.positions: dict[str, tuple[int, ...]] = {}

    def group_size(self, t: LazyTensor, axis: int) -> int:
        """Layers per read for `t`: within budget/3, in whole chunks along the layer axis."""
        n = t.shape[axis]
        layer_bytes = max(1, t.nbytes // max(1, n))
        group = max(1, (self.budget // 3) // layer_bytes)
        per_chunk = t.chunk_shape[axis] if t.chunk_shape and len(t.chunk_shape) > axis else n
        if per_chunk < n:
            group = max(per_chunk, group // per_chunk * per_chunk)
        return max(1, min(n, group))

    def fits(self, t: LazyTensor, axis: int) -> bool:
        """One layer of `t` fits the per-stream budget (else read smaller slices, e.g. one expert)."""
        return t.nbytes // max(1, t.shape[axis]) <= max(1, self.budget // self.STREAMS)

    def layer(self, t: LazyTensor, axis: int, i: int, uses: int = 1) -> np.ndarray:
        """Layer `i` (on `axis`) of `t`, from the cached group that holds it.

        `uses` is how many times each layer will be asked for (the experts of
        an `[E, L, ...]` tensor: E), so the group stays until the last use.
        Safe to call from several threads (the conversion reads ahead in
        parallel): one thread reads a missing group, outside the lock, while
        others asking for a layer of it wait; other groups read meanwhile.
        """
        n = t.shape[axis]
        group = self.group_size(t, axis)
        start = (i // group) * group
        lo, hi = self._window_of(t.name, i, n)
        start = max(start, lo)
        key = (t.name, axis, start)
        while True:
            with self._lock:
                if t.name in self._recent:
                    self._recent.remove(t.name)
                self._recent.append(t.name)
                block = self._groups.get(key)
                if block is not None:
                    return self._hand_out(key, block, axis, i - start, i)
                loading = self._loading.get(key)
                if loading is None:
                    # Streams move forward: an older group of the same tensor, or one of a tensor no longer
                    # among the last few streams, is likely finished. Such a group still has layers to hand
                    # out when a reading thread was delayed (a loaded machine), so it is dropped only when
                    # the cache needs the room: dropping it early would read the same layers twice.
                    live = set(self._recent[-self.streams:])
                    incoming = (min(hi, start + group) - start) * (t.nbytes // max(1, n))
                    held = sum(b.nbytes for b in self._groups.values())
                    for old in [k for k in self._groups if k[:2] == key[:2] or k[0] not in live]:
                        if held + incoming <= self.budget:
                            break
                        held -= self._groups[old].nbytes
                        self._drop(old)
                    del self._recent[: -self.streams]
                    loading = self._loading[key] = threading.Event()
                    break
            loading.wait()  # another thread reads this group; then take the layer from it (or read it again)
        try:
            stop = min(hi, (start // group) * group + group)
            block = t.read(on_axis(axis, slice(start, stop)))
        except BaseException:
            with self._lock:
                self._loading.pop(key).set()
            raise
        with self._lock:
            self._groups[key] = block
            self._unread[key] = {layer: uses for layer in range(start, stop)}
            self._evict(keep=key)
            self._loading.pop(key).set()
            return self._hand_out(key, block, axis, i - start, i)

    def _window_of(self, name: str, i: int, n: int) -> tuple[int, int]:
        """The stack positions [lo, hi) a group holding position `i` of `name` may span: all, or the window's."""
        layers = self.positions.get(name)
        if self.window is None or layers is None or len(layers) != n:
            return 0, n
        inside = [k for k, layer in enumerate(layers) if self.window[0] <= layer < self.window[1]]
        if not inside or not inside[0] <= i <= inside[-1]:
            return 0, n
        return inside[0], inside[-1] + 1

    def _hand_out(self, key, block: np.ndarray, axis: int, offset: int, i: int) -> np.ndarray:
        layer = block[on_axis(axis, offset)]  # a view: no copy
        unread = self._unread[key]
        if i in unread:
            unread[i] -= 1
            if unread[i] <= 0:
                del unread[i]
        if not unread:  # every layer handed out: the group is done (a re-read reloads it)
            self._drop(key)
        return layer

    def _drop(self, key) -> None:
        self._groups.pop(key, None)
        self._unread.pop(key, None)

    def _evict(self, keep) -> None:
        total = sum(b.nbytes for b in self._groups.values())
        for key in list(self._groups):
            if total <= self.budget:
                break
            if key != keep:
                total -= self._groups[key].nbytes
                self._drop(key)

    def clear(self) -> None:
        self._groups.clear()
        self._unread.clear()


def shared_result(keep: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Memoize a function of hashable args for the last `keep` keys, computing each key once across threads.

    Why: a fused source tensor (Megatron's QKV, fc1) feeds several output
    tensors; the conversion computes those in parallel, and a plain
    `functools.lru_cache` would let every thread that misses compute (and
    hold) the same fused read. Here the first caller computes, the others
    wait for its result (or its exception); older keys are dropped.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        lock = threading.Lock()
        done: dict[Any, Any] = {}  # key -> result, oldest first
        running: dict[Any, threading.Event] = {}

        def wrapper(*args: Any) -> Any:
            while True:
                with lock:
                    if args in done:
                        return done[args]
                    event = running.get(args)
                    if event is None:
                        event = running[args] = threading.Event()
                        break
                event.wait()
                with lock:
                    if args in done:
                        return done[args]
                # the computing thread failed (or the result was dropped already): compute here
            try:
                result = fn(*args)
            except BaseException:
                with lock:
                    running.pop(args).set()
                raise
            with lock:
                done[args] = result
                while len(done) > keep:
                    done.pop(next(iter(done)))
                running.pop(args).set()
            return result

        return wrapper

    return decorate
