"""Entries with a form (MaxText's tables): each form and kind goes framework -> HF -> framework bit for bit,
states its shapes from the model alone, applies the flagged value conventions by the right amounts, and keeps
a bfloat16 tensor whose transform would round in float32, so a round trip loses nothing."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.forms import Conv, Flat, Kernel, Swapped, Values, Vector, widens
from maxckpt.layouts.mapping import At, Experts, Part, Regrouped, Same
from maxckpt.tensors import LazyTensor

# head_dim 128 is the case where MaxText's query factor sqrt(128) rounds (not a power of two)
SPEC = ModelSpec("llama2", 2, 8, 4, 2, 128, 12, 32, num_experts=3, moe_mlp_dim=6)
RNG = np.random.default_rng(1)


def _at(values: Values = Values(), rotary: str = "half", spec: ModelSpec = SPEC) -> At:
    return At(spec, 0, lambda s: f"model.layers.0.{s}", rotary, values=values)  # type: ignore[arg-type]


def _array(shape, dtype=np.float32) -> np.ndarray:
    return (1 + 0.25 * RNG.standard_normal(shape)).astype(dtype)


FORMS = [
    (Vector(("E",)), (8,), (8,)),
    (Flat(("Hq", "D")), (4, 128), (512,)),
    (Kernel(("E",), ("Hq", "D")), (8, 4, 128), (512, 8)),
    (Kernel(("Hq", "D"), ("E",)), (4, 128, 8), (8, 512)),
    (Conv(("Hkv", "1", "E")), (2, 1, 8), (8, 1, 2)),
    (Swapped(("X", "M", "E")), (3, 6, 8), (3, 8, 6)),
]


@pytest.mark.parametrize("form, shape, hf_shape", FORMS, ids=[f"{type(f).__name__}-{len(s)}d" for f, s, _ in FORMS])
def test_every_form_states_both_shapes_and_goes_to_hf_and_back_bit_for_bit(form, shape, hf_shape):
    assert form.shape(SPEC) == shape and form.hf_shape(SPEC) == hf_shape
    x = _array(shape)
    w = form.to_hf(x, SPEC)
    assert w.shape == hf_shape
    np.testing.assert_array_equal(form.from_hf(w, SPEC), x)


def test_a_kernel_is_hfs_linear_weight_transposed():
    x = _array((8, 4, 128))
    w = Kernel(("E",), ("Hq", "D")).to_hf(x, SPEC)
    np.testing.assert_array_equal(w, x.reshape(8, 512).T)


def test_flagged_values_differ_from_hf_by_the_frameworks_amounts():
    values = Values(query_factor=math.sqrt(128), norm_offset=1.0, embedding_scale=4.0)
    at = _at(values)
    x = _array((8, 4, 128))
    query = Same("q", "q_proj.weight", form=Kernel(("E",), ("Hq", "D")), query=True)
    np.testing.assert_allclose(query.to_hf(x, at), (x * math.sqrt(128)).reshape(8, 512).T, rtol=1e-6)
    n = _array(8)
    norm = Same("n", "norm.weight", form=Vector(("E",)), norm=True)
    np.testing.assert_array_equal(norm.to_hf(n, at), n - np.float32(1))  # HF's Gemma weight is scale - 1
    table = _array((32, 8))
    emb = Same("t", "embed.weight", form=Vector(("V", "E")), embedding=True)
    np.testing.assert_array_equal(emb.to_hf(table, at), table / np.float32(4))
    for entry, arr in ((norm, n), (emb, table)):
        np.testing.assert_array_equal(entry.from_hf(entry.to_hf(arr, at), at), arr)
    # sqrt(128) rounds in float32 (float32_rounding_note): most values come back exactly, the rest 1 ulp off
    back = query.from_hf(query.to_hf(x, at), at)
    assert np.mean(back == x) > 0.8
    assert np.max(np.abs(back.view(np.int32) - x.view(np.int32))) <= 1
    # an unflagged entry ignores the amounts
    plain = Same("v", "v_proj.weight", form=Kernel(("E",), ("Hq", "D")))
    np.testing.assert_array_equal(plain.to_hf(x, at), x.reshape(8, 512).T)


def test_a_bfloat16_query_scaled_by_sqrt_128_is_widened_and_comes_back_exactly():
    bf16 = np.dtype(ml_dtypes.bfloat16)
    values = Values(query_factor=math.sqrt(128), model_dtype=bf16)
    at = _at(values)
    query = Same("q", "q_proj.weight", form=Kernel(("E",), ("Hq", "D")), rotary="q", query=True)
    assert query.widens(values, bf16) and not query.widens(values, np.dtype(np.float32))
    hf = _array((512, 8), bf16)
    t = query.build(lambda s: LazyTensor.from_array(s, hf), "q", at)
    assert t.dtype == np.float32 and t.shape == (8, 4, 128)  # kept wide: no bit of HF's value is lost
    back = query.split(t, at)["q_proj.weight"]
    assert back.dtype == bf16  # the model's dtype again, from the float32 the kernel was widened to
    np.testing.assert_array_equal(back.read().view(np.uint16), hf.view(np.uint16))
    # a power-of-two factor is exact in bfloat16: nothing is widened
    assert not widens(Values(query_factor=4.0), bf16, query=True, norm=False, embedding=False)
    # float16's small exponent range makes any scale round
    assert widens(Values(query_factor=4.0), np.dtype(np.float16), query=True, norm=False, embedding=False)


@pytest.mark.parametrize("rotary", ["q", "k"])
def test_rotary_features_of_a_form_are_reordered_on_its_last_axis(rotary):
    at = _at(rotary="interleaved")
    heads = "Hq" if rotary == "q" else "Hkv"
    entry = Same("w", "w.weight", form=Kernel(("E",), (heads, "D")), rotary=rotary)
    x = _array(entry.framework_shape(SPEC))
    w = entry.to_hf(x, at)
    # interleaved pairs (0, 1), (2, 3) ... become HF's halves: feature 2j -> j, 2j+1 -> j + D/2
    hf = w.T.reshape(8, -1, 128)
    np.testing.assert_array_equal(hf[..., :64], x[..., 0::2])
    np.testing.assert_array_equal(hf[..., 64:], x[..., 1::2])
    np.testing.assert_array_equal(entry.from_hf(w, at), x)


@pytest.mark.parametrize("fused, hf_shape", [("interleave", (3, 8, 12)), ("concat", (3, 8, 12)),
                                             ("swapped", (3, 12, 8))])
def test_parts_of_one_fused_hf_tensor_take_their_slot_and_join_back(fused, hf_shape):
    at = _at()
    parts = [Part(f"wi_{k}", "gate_up_proj", form=Vector(("X", "E", "M")), slot=k, fused=fused) for k in (0, 1)]
    assert parts[0].hf_shapes(SPEC) == {"gate_up_proj": hf_shape}
    w = _array(hf_shape)
    got = [p.build(lambda s: LazyTensor.from_array(s, w), p.key, at) for p in parts]
    assert all(t.shape == (3, 8, 6) for t in got)
    gate = got[0].read()
    if fused == "interleave":
        np.testing.assert_array_equal(gate, w[..., 0::2])
    elif fused == "concat":
        np.testing.assert_array_equal(gate, w[..., :6])
    else:
        np.testing.assert_array_equal(gate, np.swapaxes(w[:, :6], -1, -2))
    joined = parts[0].join(got, at)["gate_up_proj"]
    assert joined.name == "model.layers.0.gate_up_proj" and joined.shape == hf_shape
    np.testing.assert_array_equal(joined.read(), w)
    with pytest.raises(TypeError, match="join"):
        parts[0].split(got[0], at)


def test_experts_in_a_form_stream_one_expert_at_a_time_and_split_back():
    at = _at()
    entry = Experts("wo", ("experts.{e}.down.weight",), form=Kernel(("M",), ("E",)))
    assert entry.framework_shape(SPEC) == (3, 6, 8)
    assert entry.hf_shapes(SPEC) == {f"experts.{e}.down.weight": (8, 6) for e in range(3)}
    hf = {f"experts.{e}.down.weight": _array((8, 6)) for e in range(3)}
    pieces = entry.parts(lambda s: LazyTensor.from_array(s, hf[s]), at)
    assert [p.name for p in pieces] == ["wo[0]", "wo[1]", "wo[2]"]
    np.testing.assert_array_equal(pieces[1].read(), hf["experts.1.down.weight"].T)
    stacked = entry.build(lambda s: LazyTensor.from_array(s, hf[s]), "wo", at)
    back = entry.split(stacked, at)
    for name, w in hf.items():
        np.testing.assert_array_equal(back[name].read(), w)


def test_a_regrouped_kernel_joins_hfs_head_major_parts_and_splits_them_again():
    spec = ModelSpec("qwen3.5", 4, 32, 4, 2, 8, 16, 64, full_attention_interval=4, gdn_num_key_heads=2,
                     gdn_num_value_heads=4, gdn_key_head_dim=8, gdn_value_head_dim=8, gdn_conv_kernel_dim=4)
    at = _at(spec=spec)
    entry = Regrouped("in_proj_ba/kernel", ("in_proj_b.weight", "in_proj_a.weight"),
                      form=Kernel(("E",), ("GBA",)), grouping="ba")
    shapes = entry.hf_shapes(spec)
    hf = {s: _array(shape) for s, shape in shapes.items()}
    t = entry.build(lambda s: LazyTensor.from_array(s, hf[s]), "k", at)
    assert t.shape == entry.framework_shape(spec)
    # the same values, regrouped (per key-head group: each group's b heads, then its a heads)
    np.testing.assert_array_equal(np.sort(t.read(), axis=None),
                                  np.sort(np.concatenate([w.ravel() for w in hf.values()])))
    assert not np.array_equal(t.read(), np.concatenate(list(hf.values())).T)
    for s, part in entry.split(t, at).items():
        np.testing.assert_array_equal(part.read(), hf[s])
