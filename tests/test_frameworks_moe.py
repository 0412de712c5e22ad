"""MoE checkpoints maxckpt writes, loaded by the real Megatron-Core (local spec, CPU, gloo).

MaxText's own mixtral and qwen3-moe training runs go to Megatron's
`torch_dist` with `maxckpt convert`; Megatron-Core's GPTModel (SequentialMLP
experts, top-k-then-softmax routing) loads them strictly and must give
MaxText's logits; the Megatron checkpoint converts back to the same HF
tensors, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_frameworks_real import _megatron_logits, megatron  # noqa: F401  (the gloo fixture)

from maxckpt.containers.safetensors import SafetensorsReader

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

MOE = [("mixtral_moe_scan", "mixtral-8x7b"), ("qwen3_moe_scan", "qwen3-30b-a3b")]


def _moe_model(spec, layout):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.emb_dim, num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim, ffn_hidden_size=spec.mlp_dim,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps, add_bias_linear=False, qk_layernorm=spec.qk_norm,
        use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        num_moe_experts=spec.num_experts, moe_router_topk=spec.num_experts_per_tok, moe_ffn_hidden_size=spec.moe_mlp_dim,
        moe_token_dispatcher_type="allgather", moe_router_pre_softmax=False, moe_aux_loss_coeff=0.0,
        moe_router_load_balancing_type="none",
    )
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_experts, moe_grouped_gemm=False,
                                          qk_layernorm=spec.qk_norm, normalization="RMSNorm")
    return GPTModel(
        cfg, layer_spec, vocab_size=layout.padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", rotary_base=int(spec.rope_theta),
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


@pytest.mark.parametrize("name,model", MOE, ids=[m[0] for m in MOE])
def test_megatron_core_loads_a_maxtext_moe_run_and_gives_maxtexts_logits(megatron, maxtext_fixtures, tmp_path, monkeypatch, name, model):  # noqa: F811
    from megatron.core import dist_checkpointing

    from maxckpt.conversion import convert
    from maxckpt.layouts.megatron import MegatronLayout, find_megatron_checkpoint

    import megatron.core.transformer.moe.moe_utils as moe_utils

    # megatron-core 0.16.1 names te_general_gemm only when Transformer Engine imports; CPU runs have none.
    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    src = maxtext_fixtures / name / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "mega", to="megatron", model=model, overrides=settings, megatron_spec="local")
    spec = report.spec
    layout = MegatronLayout(spec="local")
    ckpt_dir, iteration = find_megatron_checkpoint(tmp_path / "mega")
    assert iteration == 6  # MaxText's step carried over
    model_ = _moe_model(spec, layout)
    state = dist_checkpointing.load({"model": model_.sharded_state_dict()}, str(ckpt_dir))
    model_.load_state_dict(state["model"], strict=True)

    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")[0]
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")[0].tolist()
    logits = _megatron_logits(model_, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(logits - expected).max() < 1e-4

    # And back: Megatron -> HF equals MaxText -> HF, bit for bit (family and top-k from maxckpt_model.json).
    convert(tmp_path / "mega", tmp_path / "hf_back", to="hf")
    convert(src, tmp_path / "hf", to="hf", model=model, overrides=settings)
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


def test_maxckpt_reads_the_moe_checkpoint_megatron_core_saves(megatron, maxtext_fixtures, tmp_path, monkeypatch):  # noqa: F811
    """Megatron's own save of a MoE GPTModel -> maxckpt -> HF: every expert where transformers expects it."""
    from megatron.core import dist_checkpointing

    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.layouts.megatron import MegatronLayout

    with open_checkpoint(maxtext_fixtures / "qwen3_moe_scan" / "checkpoints" / "5" / "items", model="qwen3-30b-a3b",
                         overrides={"num_experts_per_tok": 2}) as ckpt:
        spec = ckpt.spec
    model = _moe_model(spec, MegatronLayout(spec="local"))
    sd = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    out = tmp_path / "saved"
    out.mkdir()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    dist_checkpointing.save(model.sharded_state_dict(), str(out))
    convert(out, tmp_path / "hf", to="hf", model="qwen3-30b-a3b",
            overrides={"num_experts_per_tok": 2, "vocab_size": spec.vocab_size, "head_dim": spec.head_dim})
    hf = SafetensorsReader(tmp_path / "hf")
    for i in range(spec.num_layers):
        assert np.array_equal(hf.read(f"model.layers.{i}.mlp.gate.weight"), sd[f"decoder.layers.{i}.mlp.router.weight"].numpy())
        for e in range(spec.num_experts):
            fc1 = sd[f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight"].numpy()
            fc2 = sd[f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight"].numpy()
            M = spec.moe_mlp_dim
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.experts.{e}.gate_proj.weight"), fc1[:M])
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.experts.{e}.up_proj.weight"), fc1[M:])
            assert np.array_equal(hf.read(f"model.layers.{i}.mlp.experts.{e}.down_proj.weight"), fc2)
