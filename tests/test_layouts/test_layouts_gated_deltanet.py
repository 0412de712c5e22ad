"""The Gated DeltaNet hybrids' MaxText layout on synthetic models: the cases no fixture covers.

qwen3-next with 6 layers (one scanned block of 4 plus a 2-layer remainder under
`decoder/layers_remainder/local_layers`), both hybrids scanned and unscanned, and qwen3.5's split HF
projections, each HF -> MaxText -> HF bit for bit; the reference forward agrees across layouts and with
transformers on the remainder model.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxckpt.layouts import gated_deltanet as hybrid
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.maxtext.layout import MaxTextLayout
from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import LazyTensor

GDN = {"full_attention_interval": 4, "gdn_num_key_heads": 2, "gdn_num_value_heads": 4, "gdn_key_head_dim": 8,
       "gdn_value_head_dim": 8, "gdn_conv_kernel_dim": 4, "partial_rotary_factor": 0.25,
       "attention_output_gate": True, "norm_plus_one": True, "shared_expert_gate": True, "qk_norm": True,
       "maxtext_query_scale": False, "num_experts": 4, "num_experts_per_tok": 2, "moe_mlp_dim": 16,
       "num_shared_experts": 1, "routing": "softmax_topk", "rope_theta": 1e7, "rms_norm_eps": 1e-6}


def spec(family: str, layers: int) -> ModelSpec:
    return ModelSpec(family, layers, 32, 4, 2, 8, 16, 64, **GDN)


def random_hf(s: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(shape) * 0.2).astype(np.float32) for n, shape in hfl.expected_tensors(s).items()}


def through_maxtext(s: ModelSpec, hf: dict[str, np.ndarray], scanned: bool):
    lazies = {n: LazyTensor.from_array(n, a) for n, a in hf.items()}
    mt = {n: t.read() for n, t in MaxTextLayout(scan_layers=scanned).from_hf(lazies, s).items()}
    back = MaxTextLayout().to_hf({n: LazyTensor.from_array(n, a) for n, a in mt.items()}, s)
    return mt, {n: t.read() for n, t in back.items()}


@pytest.mark.parametrize("family,layers", [("qwen3-next", 6), ("qwen3-next", 4), ("qwen3.5", 8)])
@pytest.mark.parametrize("scanned", [True, False])
def test_hf_maxtext_hf_is_bit_exact(family, layers, scanned):
    s = spec(family, layers)
    hf = random_hf(s)
    mt, back = through_maxtext(s, hf, scanned)
    assert sorted(back) == sorted(hf)
    for n in hf:
        assert back[n].tobytes() == hf[n].tobytes(), n
    names = set(mt)
    if scanned and family == "qwen3-next":
        assert mt["params/params/decoder/layers/local_layers/attention/A_log"].shape == (4, 1, 3)
        assert mt["params/params/decoder/layers/local_layers/mlp/routed_experts/wi_0"].shape == (4, 1, 3, 32, 16)
        if layers == 6:  # the two leftover Gated DeltaNet layers, stacked on the scan axis
            assert mt["params/params/decoder/layers_remainder/local_layers/attention/conv1d/kernel"].shape == (
                4, 2, 1, 64)
    elif scanned:
        assert mt["params/params/decoder/layers/layer_3/attention/attention/query/kernel"].shape == (32, 2, 4, 16)
        assert "params/params/decoder/layers/layer_0/attention/in_proj_qkvz/kernel" in names
    else:
        assert not any(n.startswith("params/params/decoder/layers/") for n in names)


def test_qwen3_5_split_projections_regroup_per_key_head():
    """MaxText's in_proj_qkvz packs [q, k, v, z] per key head; HF's in_proj_qkv is q (all heads) | k | v."""
    s = spec("qwen3.5", 4)
    hk, dk, per, dv = 2, 8, 2, 8
    rows = np.arange((2 * dk + 2 * per * dv) * hk, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    qkv, z = hybrid.split_grouped("qkvz", rows, s)
    group = 2 * dk + 2 * per * dv
    assert qkv[:dk, 0].tolist() == list(range(dk))  # key head 0's q
    assert qkv[dk : 2 * dk, 0].tolist() == list(range(group, group + dk))  # key head 1's q
    assert z[:per * dv, 0].tolist() == list(range(2 * dk + per * dv, group))  # head 0's z
    assert np.array_equal(hybrid.join_split("qkvz", [qkv, z], s), rows)
    ba = np.arange(2 * 4, dtype=np.float32)[:, None]
    b, a = hybrid.split_grouped("ba", ba, s)
    assert b[:, 0].tolist() == [0, 1, 4, 5] and a[:, 0].tolist() == [2, 3, 6, 7]
    assert np.array_equal(hybrid.join_split("ba", [b, a], s), ba)


def test_reference_on_a_remainder_block_matches_transformers(tmp_path):
    """6 qwen3-next layers: the remainder's layers are HF layers 4 and 5, in the reference as in transformers."""
    import torch
    import transformers
    from safetensors.numpy import save_file

    from maxckpt.formats.hf.config import config_json
    from maxckpt.reference import reference_logits

    s = spec("qwen3-next", 6)
    hf = random_hf(s, seed=1)
    tokens = [[3, 7, 11, 2, 9, 30, 41, 5]]
    logits = {}
    for scanned in (True, False):
        mt, _ = through_maxtext(s, hf, scanned)
        params = {n[len("params/params/"):]: a for n, a in mt.items()}
        logits[scanned] = reference_logits(params, s, tokens)
    np.testing.assert_array_equal(logits[True], logits[False])
    import json

    (tmp_path / "config.json").write_text(json.dumps(config_json(s)))
    save_file(hf, str(tmp_path / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(logits[True], expected, atol=1e-4, rtol=0)
