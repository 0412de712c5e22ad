"""MaxText layout <-> HF on in-memory tensors: exact inverses, MaxText's conventions, shape checks."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from conversion_models import FAMILY_NAMES, random_maxtext_params, tiny_spec
from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.maxtext.layout import MaxTextLayout, canonical_names
from maxckpt.formats.maxtext.params import PARAMS_PREFIX
from maxckpt.tensors import LazyTensor


def lazies(params, prefix=PARAMS_PREFIX):
    return {prefix + n: LazyTensor.from_array(prefix + n, a) for n, a in params.items()}


def materialize(tensors):
    return {n: t.read() for n, t in tensors.items()}


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("scanned", [True, False], ids=["scanned", "unscanned"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_maxtext_to_hf_and_back_is_bit_exact(family, scanned, dtype):
    spec = tiny_spec(family)
    params = random_maxtext_params(spec, scanned=scanned, dtype=dtype)
    layout = MaxTextLayout(scan_layers=scanned)
    hf = layout.to_hf(lazies(params), spec)
    assert list(hf) == [n for n in hf]  # dict order is the streaming order
    assert {n: t.shape for n, t in hf.items()} == hfl.expected_tensors(spec)
    back = materialize(layout.from_hf(hf, spec))
    assert set(back) == {PARAMS_PREFIX + n for n in params}
    for name, array in params.items():
        assert back[PARAMS_PREFIX + name].dtype == array.dtype
        assert np.array_equal(back[PARAMS_PREFIX + name], array), name


def test_query_kernel_toward_hf_undoes_maxtexts_scaling_and_interleaving():
    spec = tiny_spec("llama3.1")
    params = random_maxtext_params(spec, scanned=True)
    q = params["decoder/layers/self_attention/query/kernel"][:, 1]  # layer 1: [E, H, D]
    k = params["decoder/layers/self_attention/key/kernel"][:, 1]
    hf = MaxTextLayout().to_hf(lazies(params), spec)
    order = np.r_[0 : spec.head_dim : 2, 1 : spec.head_dim : 2]  # evens, then odds per head
    expected_q = (q[:, :, order] * math.sqrt(spec.head_dim)).reshape(spec.emb_dim, -1).T
    assert np.array_equal(hf["model.layers.1.self_attn.q_proj.weight"].read(), expected_q)
    assert np.array_equal(hf["model.layers.1.self_attn.k_proj.weight"].read(), k[:, :, order].reshape(spec.emb_dim, -1).T)
    v = params["decoder/layers/self_attention/value/kernel"][:, 1]
    assert np.array_equal(hf["model.layers.1.self_attn.v_proj.weight"].read(), v.reshape(spec.emb_dim, -1).T)


def test_qwen3_query_kernel_is_copied_unscaled_and_norms_map():
    spec = tiny_spec("qwen3")
    params = random_maxtext_params(spec, scanned=True)
    hf = MaxTextLayout().to_hf(lazies(params), spec)
    q = params["decoder/layers/self_attention/query/kernel"][:, 0]
    assert np.array_equal(hf["model.layers.0.self_attn.q_proj.weight"].read(), q.reshape(spec.emb_dim, -1).T)
    assert np.array_equal(hf["model.layers.0.self_attn.q_norm.weight"].read(), params["decoder/layers/self_attention/query_norm/scale"][:, 0])
    assert "lm_head.weight" not in hf  # tied


def test_output_projection_and_logits_dense_map_to_torch_layout():
    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec, scanned=False)
    hf = MaxTextLayout().to_hf(lazies(params, prefix=""), spec)  # params-only checkpoints have no prefix
    out = params["decoder/layers_1/self_attention/out/kernel"]  # [H, D, E]
    assert np.array_equal(hf["model.layers.1.self_attn.o_proj.weight"].read(), out.reshape(-1, spec.emb_dim).T)
    assert np.array_equal(hf["lm_head.weight"].read(), params["decoder/logits_dense/kernel"].T)
    assert np.array_equal(hf["model.layers.1.input_layernorm.weight"].read(), params["decoder/layers_1/pre_self_attention_layer_norm/scale"])


@pytest.mark.parametrize("scanned", [True, False])
def test_infer_dims_reads_every_dimension_from_shapes(scanned):
    spec = tiny_spec("qwen3", layers=3)
    infos = {n: t.info for n, t in lazies(random_maxtext_params(spec, scanned=scanned)).items()}
    infos["opt_state/mu/params/token_embedder/embedding"] = infos[PARAMS_PREFIX + "token_embedder/embedding"]
    dims = MaxTextLayout().infer_dims(infos)
    assert dims == {
        "num_layers": 3, "emb_dim": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "mlp_dim": 64, "vocab_size": 128, "tie_word_embeddings": True, "qk_norm": True,
    }


def test_infer_dims_refuses_a_tree_of_another_architecture():
    """A tree with an embedding but an MLP no family has: one clear error, not a KeyError."""
    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec)
    params = {n: a for n, a in params.items() if "/mlp/" not in n}
    params["decoder/layers/sparse_block/wi_0"] = np.zeros((4, 2, 32, 64), np.float32)
    infos = {n: t.info for n, t in lazies(params).items()}
    with pytest.raises(UnsupportedModelError, match="has no layer param mlp/wi_0/kernel: not a parameter tree"):
        MaxTextLayout().infer_dims(infos)


def test_scanned_output_streams_layer_pieces_on_axis_one():
    spec = tiny_spec("llama2", layers=3)
    hf = MaxTextLayout().to_hf(lazies(random_maxtext_params(spec)), spec)
    out = MaxTextLayout(scan_layers=True).from_hf(hf, spec)
    wo = out[PARAMS_PREFIX + "decoder/layers/mlp/wo/kernel"]
    assert wo.shape == (64, 3, 32)
    assert [index for index, _ in wo.pieces] == [(slice(None), 0), (slice(None), 1), (slice(None), 2)]
    norm = out[PARAMS_PREFIX + "decoder/layers/pre_self_attention_layer_norm/scale"]
    assert norm.shape == (32, 3)  # [E, L]: the layer axis is 1 for vectors too


def test_shape_mismatch_names_the_tensor():
    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec)
    params["decoder/layers/mlp/wo/kernel"] = params["decoder/layers/mlp/wo/kernel"][:, :, :16]
    with pytest.raises(ShapeMismatchError, match=r"tensor 'decoder/layers/mlp/wo/kernel' has shape \(64, 2, 16\), expected \(64, 2, 32\)"):
        MaxTextLayout().to_hf(lazies(params), spec)
    del params["decoder/layers/mlp/wo/kernel"]
    with pytest.raises(CorruptCheckpointError, match="'decoder/layers/mlp/wo/kernel' is missing"):
        MaxTextLayout().to_hf(lazies(params), spec)


def test_canonical_names_prefer_params_and_drop_training_state():
    names = ["params/params/token_embedder/embedding", "opt_state/0/mu/params/token_embedder/embedding", "step", "nnx_aux/x"]
    assert canonical_names(names) == {"token_embedder/embedding": "params/params/token_embedder/embedding"}
    assert canonical_names(["token_embedder/embedding", "nnx_aux/x", "step"]) == {"token_embedder/embedding": "token_embedder/embedding"}
