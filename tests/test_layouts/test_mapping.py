"""The mapping vocabulary: every entry kind goes HF -> framework -> HF unchanged, states its shapes both ways,
and the refusals (a non-zero balancing bias, a failed requirement) say why."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from maxckpt.errors import UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.errors import ShapeMismatchError
from maxckpt.layouts.mapping import (
    At, Experts, FusedQKV, GatedPair, Interleaved, Memo, Padded, Requirement, Same, Transposed, ZeroBias,
    check_requirements, hf_infos_of,
)
from maxckpt.layouts.torch_transforms import rotary_rows, split_qkv
from maxckpt.tensors import LazyTensor

SPEC = ModelSpec("llama2", 2, 8, 4, 2, 4, 12, 32, num_experts=3, moe_mlp_dim=6)
RNG = np.random.default_rng(0)


def hf_layer() -> dict[str, np.ndarray]:
    H, G, D, E, F, X, M = 4, 2, 4, 8, 12, 3, 6
    out = {
        "q.weight": RNG.standard_normal((H * D, E)), "k.weight": RNG.standard_normal((G * D, E)),
        "v.weight": RNG.standard_normal((G * D, E)), "q.bias": RNG.standard_normal(H * D),
        "k.bias": RNG.standard_normal(G * D), "v.bias": RNG.standard_normal(G * D),
        "gate": RNG.standard_normal((F, E)), "up": RNG.standard_normal((F, E)),
        "fused_gate_up": RNG.standard_normal((X, E, 2 * M)), "fused_bias": RNG.standard_normal((X, 2 * M)),
        "down_fused": RNG.standard_normal((X, M, E)),
    }
    for e in range(X):
        out[f"experts.{e}.gate"] = RNG.standard_normal((M, E))
        out[f"experts.{e}.up"] = RNG.standard_normal((M, E))
        out[f"experts.{e}.down"] = RNG.standard_normal((E, M))
    return {k: v.astype(np.float32) for k, v in out.items()}


ENTRIES = [
    Same("wq", "q.weight", rotary="q"),
    Same("wk", "k.weight", rotary="k"),
    GatedPair("fc1", ("gate", "up")),
    FusedQKV("qkv", ("q.weight", "k.weight", "v.weight")),
    FusedQKV("qkv_bias", ("q.bias", "k.bias", "v.bias")),
    Experts("exp_fc1", ("experts.{e}.gate", "experts.{e}.up")),
    Experts("exp_fc2", ("experts.{e}.down",)),
    Transposed("mlp2", "down_fused"),
    Interleaved("mlp1", "fused_gate_up"),
    Interleaved("mlp1_bias", "fused_bias", bias=True),
]


def _at(rotary: str = "half") -> At:
    return At(SPEC, 0, lambda s: f"model.layers.0.{s}", rotary)  # type: ignore[arg-type]


@pytest.mark.parametrize("rotary", ["half", "interleaved"])
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{type(e).__name__}-{e.key}")
def test_every_entry_goes_to_the_framework_and_back_unchanged(entry, rotary):
    hf = hf_layer()
    lazy = {k: LazyTensor.from_array(k, v) for k, v in hf.items()}
    at = _at(rotary)
    built = entry.build(lambda s: lazy[s], entry.key, at)
    assert built.shape == entry.shape(lambda s: hf[s].shape, SPEC)
    assert built.read().shape == built.shape
    back = entry.split(LazyTensor.from_array(entry.key, built.read()), at)
    assert sorted(back) == sorted(entry.hf_suffixes(SPEC))
    for suffix, t in back.items():
        assert t.name == f"model.layers.0.{suffix}"
        np.testing.assert_array_equal(t.read(), hf[suffix])


def test_rotary_rows_change_order_only_where_the_framework_pairs_features_otherwise():
    hf = hf_layer()
    q = LazyTensor.from_array("q", hf["q.weight"])
    entry = Same("wq", "q.weight", rotary="q")
    np.testing.assert_array_equal(entry.build(lambda s: q, "wq", _at("half")).read(), hf["q.weight"])
    interleaved = entry.build(lambda s: q, "wq", _at("interleaved")).read()
    np.testing.assert_array_equal(interleaved, rotary_rows(hf["q.weight"], 4, 4, "interleaved"))
    assert not np.array_equal(interleaved, hf["q.weight"])


def test_stacked_entries_stream_one_expert_per_piece():
    hf = hf_layer()
    lazy = {k: LazyTensor.from_array(k, v) for k, v in hf.items()}
    for entry in (Experts("exp_fc1", ("experts.{e}.gate", "experts.{e}.up")), Transposed("mlp2", "down_fused"),
                  Interleaved("mlp1", "fused_gate_up")):
        built = entry.build(lambda s: lazy[s], entry.key, _at())
        assert len(built.pieces) == 3
        np.testing.assert_array_equal(np.stack([fn() for _, fn in built.pieces]), built.read())
        assert len(entry.parts(lambda s: lazy[s], _at())) == 3


def test_hf_infos_give_back_the_hf_shapes_a_framework_tensor_stands_for():
    hf = hf_layer()
    lazy = {k: LazyTensor.from_array(k, v) for k, v in hf.items()}
    entries = {e.key: e for e in ENTRIES if not isinstance(e, (FusedQKV, Interleaved))}
    infos = {key: e.build(lambda s: lazy[s], key, _at()).info for key, e in entries.items()}
    for suffix, info in hf_infos_of(entries, infos, SPEC).items():
        assert info.shape == hf[suffix].shape, suffix


def test_a_padded_vocabulary_gets_zero_rows_and_loses_them_again():
    table = RNG.standard_normal((32, 8)).astype(np.float32)  # SPEC's vocabulary and width
    entry = Padded("embedding", "model.embed_tokens.weight")
    padded = entry.build(lambda s: LazyTensor.from_array(s, table), "embedding", At(SPEC, -1, lambda s: s, vocab_rows=40))
    assert padded.shape == (40, 8)
    np.testing.assert_array_equal(padded.read()[32:], 0)
    back = entry.split(LazyTensor.from_array("embedding", padded.read()), At(SPEC, -1, lambda s: s))
    np.testing.assert_array_equal(back["model.embed_tokens.weight"].read(), table)
    with pytest.raises(ShapeMismatchError, match=r"expected \[padded vocab >= 32, 8\]"):
        entry.split(LazyTensor.from_array("embedding", table[:30]), At(SPEC, -1, lambda s: s))


def test_a_non_zero_balancing_bias_refuses_to_let_the_router_be_read():
    router = LazyTensor.from_array("model.layers.0.mlp.gate.weight", np.ones((3, 8), np.float32))
    entry = ZeroBias("moe.expert_bias_E", "HF Qwen 3 MoE", guards="mlp.gate.weight")
    zeros = entry.build(lambda s: None, "layers.0.moe.expert_bias_E", _at())
    np.testing.assert_array_equal(zeros.read(), np.zeros(3, np.float32))
    outputs = {"mlp.gate.weight": router}
    entry.guard(zeros, outputs, "TorchTitan")
    np.testing.assert_array_equal(outputs["mlp.gate.weight"].read(), router.read())
    outputs = {"mlp.gate.weight": router}
    entry.guard(LazyTensor.from_array("layers.0.moe.expert_bias_E", np.full(3, 0.5, np.float32)), outputs, "TorchTitan")
    with pytest.raises(UnsupportedModelError, match="layers.0.moe.expert_bias_E is non-zero: TorchTitan's "
                       "load-balancing bias steers routing and HF Qwen 3 MoE has no such tensor"):
        outputs["mlp.gate.weight"].read()


def test_a_failed_requirement_is_refused_with_its_message():
    needs_yarn = Requirement(lambda s: bool(s.rope_scaling), lambda s: f"{s.family}: needs YaRN rope")
    with pytest.raises(UnsupportedModelError, match="llama2: needs YaRN rope"):
        check_requirements((needs_yarn,), SPEC)
    check_requirements((needs_yarn,), ModelSpec("llama2", 2, 8, 4, 2, 4, 12, 32, rope_scaling={"rope_type": "yarn"}))


def test_a_fused_read_is_shared_by_the_tensors_split_from_it_across_threads():
    reads = []
    fused = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)  # (H + 2G) * D rows

    def read(index=None):
        reads.append(index)
        return fused if index is None else fused[index]

    t = LazyTensor("qkv", fused.shape, fused.dtype, read)
    parts = FusedQKV("qkv", ("q", "k", "v")).split(t, At(SPEC, 0, lambda s: s, memos={}))
    results = {}
    threads = [threading.Thread(target=lambda s=s: results.__setitem__(s, parts[s].read())) for s in parts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(reads) == 1 and sorted(results) == ["k", "q", "v"]
    for got, want in zip((results["q"], results["k"], results["v"]), split_qkv(fused, 4, 2, 4)):
        np.testing.assert_array_equal(got, want)


def test_a_memo_holds_only_its_last_results():
    calls = []
    memo = Memo(keep=2)
    for key in (1, 2, 1, 3, 1):
        memo(key, lambda key=key: calls.append(key) or key)
    assert calls == [1, 2, 3, 1]  # 1 was read again while held; 3 pushed the older 1 out
