"""Streaming of MoE expert tensors: `[X, L, ...]` stacks are read once, written one expert at a time."""

from __future__ import annotations

import numpy as np

from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.formats.maxtext.layout import MaxTextLayout
from maxckpt.formats.maxtext.params import PARAMS_PREFIX
from maxckpt.conversion.spec import family_defaults
from maxckpt.tensors import LazyTensor


def mixtral_spec(layers: int = 3, experts: int = 4) -> ModelSpec:
    values = {k: v for k, v in family_defaults(FAMILIES["mixtral"]).items()}
    values.update(num_experts=experts, moe_mlp_dim=24, num_experts_per_tok=2)
    return ModelSpec("mixtral", layers, 16, 4, 2, 4, 24, 64, **values)


def random_hf(spec: ModelSpec) -> dict[str, LazyTensor]:
    rng = np.random.default_rng(0)
    return {n: LazyTensor.from_array(n, rng.standard_normal(s).astype(np.float32)) for n, s in hfl.expected_tensors(spec).items()}


def counting(arrays: dict[str, np.ndarray], log: list) -> dict[str, LazyTensor]:
    """LazyTensors that record (name, index, bytes) of every read."""
    def make(name, arr):
        def fn(index):
            out = arr if index is None else arr[index]
            log.append((name, index, out.nbytes))
            return out
        return LazyTensor(name, arr.shape, arr.dtype, fn)
    return {n: make(n, a) for n, a in arrays.items()}


def maxtext_arrays(spec: ModelSpec) -> dict[str, np.ndarray]:
    return {n: t.read() for n, t in MaxTextLayout(scan_layers=True).from_hf(random_hf(spec), spec).items()}


def test_scanned_expert_stack_is_read_once_not_once_per_expert():
    spec = mixtral_spec()
    arrays = maxtext_arrays(spec)
    log: list = []
    hf = MaxTextLayout(read_budget=1 << 30).to_hf(counting(arrays, log), spec)
    expected = hfl.expected_tensors(spec)
    assert set(hf) == set(expected)
    for name, t in hf.items():
        t.read()
    wi_0 = PARAMS_PREFIX + "decoder/layers/MoeBlock_0/wi_0"
    reads = [entry for entry in log if entry[0] == wi_0]
    assert len(reads) == 1 and reads[0][2] == arrays[wi_0].nbytes  # every layer of every expert: one read


def test_an_expert_layer_over_budget_is_read_one_expert_at_a_time():
    spec = mixtral_spec()
    arrays = maxtext_arrays(spec)
    wi_0 = PARAMS_PREFIX + "decoder/layers/MoeBlock_0/wi_0"
    one_expert = arrays[wi_0][0, 0].nbytes
    log: list = []
    budget = 3 * 2 * one_expert  # a third of it holds 2 experts: less than one layer of 4
    hf = MaxTextLayout(read_budget=budget).to_hf(counting(arrays, log), spec)
    for layer in range(spec.num_layers):
        for e in range(spec.num_experts):
            w = hf[f"model.layers.{layer}.block_sparse_moe.experts.{e}.w1.weight"].read()
            assert np.array_equal(w, arrays[wi_0][e, layer].T)
    reads = [entry for entry in log if entry[0] == wi_0]
    assert len(reads) == spec.num_layers * spec.num_experts
    assert {nbytes for _, _, nbytes in reads} == {one_expert}


def test_written_expert_stacks_stream_one_expert_of_one_layer_per_piece():
    spec = mixtral_spec()
    out = MaxTextLayout(scan_layers=True).from_hf(random_hf(spec), spec)
    wi_0 = out[PARAMS_PREFIX + "decoder/layers/MoeBlock_0/wi_0"]
    assert wi_0.shape == (4, 3, 16, 24)
    assert len(wi_0.pieces) == 12
    for index, fn in wi_0.pieces:
        assert fn().shape == (16, 24)
        assert np.array_equal(fn(), wi_0.read()[index])


def family_spec(family: str, layers: int) -> ModelSpec:
    values = dict(family_defaults(FAMILIES[family]))
    return ModelSpec(family, layers, 16, 4, 2, 4, 24, 64, qk_norm=FAMILIES[family].qk_norm,
                     tie_word_embeddings=True, **{k: v for k, v in values.items() if k != "qk_norm"})


def test_gemma3_blocks_and_remainder_for_any_layer_count_scanned_and_not():
    """Blocks of 6 scanned as layers/layers_{j}, the rest under layers_remainder; fewer than 6: remainder only."""
    import ml_dtypes

    for layers in (4, 6, 13):
        spec = family_spec("gemma3", layers)
        # bfloat16 like real Gemma checkpoints: MaxText keeps the norm scales (HF weight + 1) in float32, exactly.
        hf = {n: LazyTensor.from_array(n, t.read().astype(ml_dtypes.bfloat16)) for n, t in random_hf(spec).items()}
        for scanned in (True, False):
            mt = MaxTextLayout(scan_layers=scanned).from_hf(hf, spec)
            names = {n[len(PARAMS_PREFIX):] for n in mt}
            blocks, rest = layers // 6, layers % 6
            assert any(n.startswith("decoder/layers/layers_5/") for n in names) == (scanned and blocks > 0)
            assert any(n.startswith(f"decoder/layers_remainder/layers_{rest - 1}/") for n in names) == (scanned and rest > 0)
            arrays = {n: LazyTensor.from_array(n, t.read()) for n, t in mt.items()}
            layout = MaxTextLayout()
            assert layout.infer_dims({n: t.info for n, t in arrays.items()})["num_layers"] == layers
            back = layout.to_hf(arrays, spec)
            for name, t in hf.items():
                got = back[name].read()
                assert got.dtype == t.dtype, name  # the widened norms go back to the model's bfloat16, exactly
                assert got.tobytes() == t.read().tobytes(), (layers, scanned, name)
