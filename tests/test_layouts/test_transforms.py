"""The shared layout transforms: exact inverses, known answers on tiny arrays, streamed layer reads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxckpt.layouts import transforms as tf
from maxckpt.tensors import LazyTensor


def test_kernel_flatten_transpose_matches_torch_linear_and_inverts():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 2, 4)).astype(np.float32)  # [E=3] -> [H=2, D=4]
    w = tf.kernel_to_torch(k, in_dims=1)
    x = rng.standard_normal(3).astype(np.float32)
    # y = x @ kernel (JAX DenseGeneral) equals W @ x (torch Linear)
    np.testing.assert_allclose(w @ x, np.einsum("e,ehd->hd", x, k).reshape(-1), rtol=1e-6)
    assert w.flags.c_contiguous and w.shape == (8, 3)
    assert np.array_equal(tf.torch_to_kernel(w, (3,), (2, 4)), k)


def test_output_kernel_with_two_input_dims():
    k = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)  # out proj [H, D, E]
    w = tf.kernel_to_torch(k, in_dims=2)
    assert w.shape == (5, 6)
    assert np.array_equal(tf.torch_to_kernel(w, (2, 3), (5,)), k)
    with pytest.raises(ValueError, match="not \\[out=5, in=6\\]"):
        tf.torch_to_kernel(w.T, (2, 3), (5,))


def test_rotary_interleaved_to_half_takes_evens_then_odds():
    assert tf.half_from_interleaved(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    x = np.arange(2 * 8).reshape(2, 8)  # two heads' features
    half = tf.permute_last(x, tf.half_from_interleaved(8))
    assert half[0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert np.array_equal(tf.permute_last(half, tf.interleaved_from_half(8)), x)
    with pytest.raises(ValueError, match="even"):
        tf.half_from_interleaved(7)


def test_rotary_permutation_turns_interleaved_rope_into_rotate_half_rope():
    """Rotating pairs (2i, 2i+1) then permuting equals permuting then rotating halves."""
    d, pos, theta = 8, 5.0, 10_000.0
    freqs = pos / theta ** (np.arange(d // 2) * 2 / d)
    x = np.random.default_rng(1).standard_normal(d)
    pairs = x.reshape(-1, 2)
    inter = np.stack([pairs[:, 0] * np.cos(freqs) - pairs[:, 1] * np.sin(freqs),
                      pairs[:, 1] * np.cos(freqs) + pairs[:, 0] * np.sin(freqs)], axis=1).reshape(-1)
    h = tf.permute_last(x, tf.half_from_interleaved(d))
    a, b = h[: d // 2], h[d // 2:]
    rotate_half = np.concatenate([a * np.cos(freqs) - b * np.sin(freqs), b * np.cos(freqs) + a * np.sin(freqs)])
    np.testing.assert_allclose(tf.permute_last(inter, tf.half_from_interleaved(d)), rotate_half, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_query_scaling_by_power_of_two_round_trips_exactly(dtype):
    x = np.random.default_rng(2).standard_normal(1000).astype(dtype)
    up = tf.scale(x, 4.0)  # sqrt(head_dim=16)
    assert up.dtype == x.dtype
    assert np.array_equal(tf.unscale(up, 4.0), x)


def test_query_scaling_by_sqrt_128_is_exact_through_a_float32_hub():
    """bfloat16 MaxText kernels survive x sqrt(128) in float32 and back; float32 ones mostly do."""
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    f = float(np.sqrt(128))
    xb = x.astype(ml_dtypes.bfloat16)
    assert np.array_equal(tf.unscale(tf.scale(xb.astype(np.float32), f), f).astype(ml_dtypes.bfloat16), xb)
    back = tf.unscale(tf.scale(x, f), f)
    assert np.mean(back != x) < 0.2  # one float32 ulp off for the rest: rounding, not a bug
    assert np.all(np.abs(back - x) <= np.spacing(np.abs(x)))


def test_query_scaling_is_computed_in_float32_and_rounded_once():
    x = np.array([1.0, 3.0, 0.1], dtype=ml_dtypes.bfloat16)
    expected = (x.astype(np.float32) * np.float32(np.sqrt(128))).astype(ml_dtypes.bfloat16)
    assert np.array_equal(tf.scale(x, float(np.sqrt(128))), expected)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("fn, op", [(tf.scale, np.multiply), (tf.unscale, np.divide), (tf.shift, np.subtract), (tf.unshift, np.add)])
def test_float32_arithmetic_gives_the_bits_of_widen_operate_narrow_and_leaves_its_input_alone(dtype, fn, op):
    """scale/shift and their inverses, on a contiguous array and on a transposed view of a layer group."""
    group = np.random.default_rng(4).standard_normal((64, 3, 48)).astype(dtype)  # [E, L, D], as LayerGroups holds it
    for x in (group[:, 1, :].copy(), group[:, 1, :].T):
        before = group.copy()
        value = float(np.sqrt(128)) if fn in (tf.scale, tf.unscale) else 1.0
        got = fn(x, value)
        want = op(x.astype(np.float32), np.float32(value)).astype(dtype)
        assert got.dtype == np.dtype(dtype) and got.shape == x.shape
        assert got.tobytes() == want.tobytes()
        assert not np.shares_memory(got, group) and not np.shares_memory(got, x)
        assert group.tobytes() == before.tobytes()  # never written into the source


def test_a_layer_of_a_stacked_kernel_is_transposed_from_the_view():
    """kernel_to_torch on a layer slice (not contiguous) equals the same on a contiguous copy."""
    stacked = np.random.default_rng(5).standard_normal((6, 4, 2, 3)).astype(np.float32)  # [E, L, H, D]
    layer = stacked[:, 2]
    assert not layer.flags.c_contiguous
    w = tf.kernel_to_torch(layer, in_dims=1)
    assert w.flags.c_contiguous and np.array_equal(w, tf.kernel_to_torch(layer.copy(), in_dims=1))
    assert np.array_equal(w, layer.reshape(6, 6).T)


def test_lazy_cast_keeps_slices_and_pieces():
    parts = [LazyTensor.from_array(f"p{i}", np.full((2, 3), i, np.float32)) for i in range(3)]
    stacked = LazyTensor.stacked("s", parts, axis=1)
    cast = tf.lazy_cast(stacked, ml_dtypes.bfloat16)
    assert cast.dtype == np.dtype(ml_dtypes.bfloat16) and cast.pieces is not None
    assert cast.read((slice(None), 2)).dtype == np.dtype(ml_dtypes.bfloat16)
    assert [fn().dtype for _, fn in cast.pieces] == [np.dtype(ml_dtypes.bfloat16)] * 3
    ints = LazyTensor.from_array("i", np.arange(3))
    assert tf.lazy_cast(ints, np.float32) is ints  # integer tensors keep their dtype


def test_lazy_layer_and_rows_pass_slices_down_to_the_source():
    array = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)  # [L=4, rows=5, 3]
    source = CountingTensor(array)
    layer = tf.lazy_layer(source.tensor, 2, "w[2]")
    assert layer.shape == (5, 3)
    assert np.array_equal(layer.read((slice(1, 3),)), array[2, 1:3])
    assert source.reads == [(2, slice(1, 3))]  # only that layer's rows were asked for
    with pytest.raises(IndexError, match="layer 4 out of range for 4 layers"):
        tf.lazy_layer(source.tensor, 4, "w[4]")

    padded = LazyTensor.from_array("vocab", np.arange(8 * 2).reshape(8, 2))  # 6 real rows, 2 padding
    rows = tf.lazy_rows(padded, 6, "unpadded")
    assert rows.shape == (6, 2)
    assert np.array_equal(rows.read(), np.arange(12).reshape(6, 2))
    assert np.array_equal(rows.read((-1,)), [10, 11])  # counted from the real end, not the padded one
    assert np.array_equal(rows.read((slice(4, None),)), [[8, 9], [10, 11]])
    with pytest.raises(IndexError, match="row 6 out of range for 6 rows"):
        rows.read((6,))


class CountingTensor:
    """A stacked source that counts storage reads."""

    def __init__(self, array):
        self.array = array
        self.reads = []
        self.tensor = LazyTensor("w", array.shape, array.dtype, self._read)

    def _read(self, index):
        self.reads.append(index)
        return self.array if index is None else self.array[index]


def test_layer_groups_decode_a_stacked_tensor_once_when_it_fits_the_budget():
    src = CountingTensor(np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5))  # L=6 on axis 1
    groups = tf.LayerGroups(budget=10 * src.array.nbytes)
    for i in range(6):
        assert np.array_equal(groups.layer(src.tensor, axis=1, i=i), src.array[:, i])
    assert len(src.reads) == 1


def test_a_delayed_stream_is_not_read_twice_while_the_budget_holds_its_group():
    """A reading thread that stalls (a loaded machine) asks for its last layer after many other tensors:
    the group still waiting for that layer is kept, so no layer is read twice (multi-process byte counts)."""
    srcs = [CountingTensor(np.arange(2 * 3, dtype=np.float32).reshape(2, 3) + k) for k in range(12)]
    for k, src in enumerate(srcs):
        src.tensor = LazyTensor(f"w{k}", src.array.shape, src.array.dtype, src._read)
    groups = tf.LayerGroups(budget=100 * srcs[0].array.nbytes)
    assert np.array_equal(groups.layer(srcs[0].tensor, axis=0, i=0), srcs[0].array[0])
    for src in srcs[1:]:  # more tensors than the streams kept side by side
        for i in range(2):
            groups.layer(src.tensor, axis=0, i=i)
    assert np.array_equal(groups.layer(srcs[0].tensor, axis=0, i=1), srcs[0].array[1])
    assert [len(src.reads) for src in srcs] == [1] * 12
    assert not groups._groups


def test_layer_groups_bound_memory_with_a_small_budget():
    src = CountingTensor(np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5))
    layer_bytes = src.array.nbytes // 6
    groups = tf.LayerGroups(budget=3 * 2 * layer_bytes)  # two layers per group
    for i in range(6):
        assert np.array_equal(groups.layer(src.tensor, axis=1, i=i), src.array[:, i])
    assert src.reads == [(slice(None), slice(0, 2)), (slice(None), slice(2, 4)), (slice(None), slice(4, 6))]
    assert sum(b.nbytes for b in groups._groups.values()) <= groups.budget


def test_layer_groups_follow_stored_chunks_along_the_layer_axis():
    array = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    layer_bytes = array.nbytes // 6
    src = CountingTensor(array)
    chunked = LazyTensor("w", array.shape, array.dtype, src._read, chunk_shape=(4, 2, 5))
    groups = tf.LayerGroups(budget=3 * 3 * layer_bytes)  # 3 layers fit; chunks hold 2
    assert groups.group_size(chunked, axis=1) == 2
    for i in range(6):
        assert np.array_equal(groups.layer(chunked, axis=1, i=i), array[:, i])
    assert src.reads == [(slice(None), slice(0, 2)), (slice(None), slice(2, 4)), (slice(None), slice(4, 6))]
    assert not groups._groups  # every layer handed out: nothing kept
