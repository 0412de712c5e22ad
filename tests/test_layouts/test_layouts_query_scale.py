"""Round trips are bit-exact at real head dims: MaxText's query kernel carries a factor of sqrt(head_dim).

At head_dim 128 (or 192, or a Gemma query_pre_attn_scalar) that factor is no
power of two, so scaling a bfloat16 or float16 query kernel in its own dtype
rounds away bits: HF -> MaxText -> HF used to change about 15% of every
q_proj element. MaxText keeps such a kernel in float32 (its default
weight_dtype), and a float32 kernel widened so goes back to the model's dtype
exactly; the same holds in the other direction (a bfloat16 MaxText run's
q_proj goes out in float32). Gemma's norm offsets follow the same rule.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from test_layouts_moe import family_spec, random_hf

from maxckpt.families import FAMILIES
from maxckpt.formats.maxtext.layout import MaxTextLayout
from maxckpt.formats.maxtext.params import query_factor
from maxckpt.tensors import LazyTensor

DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
# Every family with a query kernel (MLA scales its scores at runtime: no factor in any kernel).
FAMILIES_WITH_QUERY = sorted(f for f in FAMILIES if FAMILIES[f].attention != "mla")


def _spec(family: str, head_dim: int):
    spec = family_spec(family, 4)  # 4: one whole block of the hybrids (3 linear-attention layers, then full)
    return dataclasses.replace(spec, head_dim=head_dim)


def _materialized(tensors: dict[str, LazyTensor]) -> dict[str, LazyTensor]:
    return {n: LazyTensor.from_array(n, t.read()) for n, t in tensors.items()}


def _same_bits(got: dict[str, LazyTensor], expected: dict[str, LazyTensor], what: str) -> None:
    assert set(got) == set(expected), what
    for name, t in expected.items():
        a, b = got[name].read(), t.read()
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{what}: {name} ({a.dtype} vs {b.dtype})"


def test_the_factor_at_head_dim_128_is_no_power_of_two():
    assert query_factor(_spec("llama3.1", 128)) == pytest.approx(128 ** 0.5)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("family", FAMILIES_WITH_QUERY)
def test_hf_to_maxtext_to_hf_is_bit_exact(family, head_dim, dtype):
    spec = _spec(family, head_dim)
    hf = {n: LazyTensor.from_array(n, t.read().astype(DTYPES[dtype])) for n, t in random_hf(spec).items()}
    for scanned in (True, False):
        mt = _materialized(MaxTextLayout(scan_layers=scanned).from_hf(hf, spec))
        _same_bits(MaxTextLayout().to_hf(mt, spec), hf, f"{family} head_dim {head_dim} {dtype} scanned={scanned}")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("family", FAMILIES_WITH_QUERY)
def test_maxtext_to_hf_to_maxtext_is_bit_exact(family, head_dim, dtype):
    """A MaxText run saved in bfloat16 (or float16) throughout: HF gets what keeps every bit, and back."""
    spec = _spec(family, head_dim)
    f32 = {n: LazyTensor.from_array(n, t.read()) for n, t in random_hf(spec).items()}
    mt = {n: LazyTensor.from_array(n, t.read().astype(DTYPES[dtype]))
          for n, t in MaxTextLayout().from_hf(f32, spec).items()}
    hf = _materialized(MaxTextLayout().to_hf(mt, spec))
    _same_bits(_materialized(MaxTextLayout().from_hf(hf, spec)), mt, f"{family} head_dim {head_dim} {dtype}")
    factor = query_factor(spec)
    if factor != 2 ** round(np.log2(factor)) or (dtype == "float16" and factor != 1):
        query = next(n for n in hf if n.endswith("self_attn.q_proj.weight"))  # a hybrid's first is layer 3
        assert hf[query].dtype == np.float32


def test_a_float32_source_keeps_float32_everywhere():
    spec = _spec("llama3.1", 128)
    hf = {n: LazyTensor.from_array(n, t.read()) for n, t in random_hf(spec).items()}
    mt = _materialized(MaxTextLayout().from_hf(hf, spec))
    assert {np.dtype(t.dtype) for t in mt.values()} == {np.dtype(np.float32)}
    back = MaxTextLayout().to_hf(mt, spec)
    assert {np.dtype(t.dtype) for t in back.values()} == {np.dtype(np.float32)}
    q = "model.layers.0.self_attn.q_proj.weight"
    exact = np.mean(back[q].read() == hf[q].read())
    assert exact > 0.8  # float32 values come back exactly unless the division by sqrt(128) rounds (measured: README)


def test_convert_round_trips_files_bit_exact_at_head_dim_128(tmp_path):
    """The same through `convert` and the files: a bfloat16 MaxText run -> HF -> MaxText, and a bfloat16 HF
    model (every tensor bf16) -> MaxText -> HF; `verify` agrees with every output."""
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    from maxckpt.containers.orbax import OrbaxReader
    from maxckpt.containers.safetensors import SafetensorsReader
    from maxckpt.conversion import convert
    from maxckpt.conversion.verify import verify

    spec = tiny_spec("llama3.1", head_dim=128)
    params = {n: a.astype(DTYPES["bfloat16"]) for n, a in random_maxtext_params(spec, seed=5).items()}
    run = save_maxtext_run(tmp_path / "run", params, step=1).parent
    convert(run, tmp_path / "hf", to="hf", model="llama3.1")
    convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", model="llama3.1")
    back = OrbaxReader(tmp_path / "mt")
    for name, array in params.items():
        got = back.read("params/params/" + name)
        assert got.dtype == array.dtype and got.tobytes() == array.tobytes(), name
    convert(run, tmp_path / "hf16", to="hf", model="llama3.1", dtype="bfloat16")  # every tensor bf16
    convert(tmp_path / "hf16", tmp_path / "mt16", to="maxtext", model="llama3.1")
    convert(tmp_path / "mt16", tmp_path / "hf16b", to="hf", model="llama3.1")
    a, b = SafetensorsReader(tmp_path / "hf16"), SafetensorsReader(tmp_path / "hf16b")
    assert set(a.tensors()) == set(b.tensors())
    for name in a.tensors():
        x, y = a.read(name), b.read(name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    for ref, other in (("run/checkpoints", "hf"), ("run/checkpoints", "mt"), ("hf16", "mt16"), ("hf16", "hf16b")):
        assert verify(tmp_path / ref, tmp_path / other, model="llama3.1").ok, (ref, other)
