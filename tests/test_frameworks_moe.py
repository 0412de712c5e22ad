"""MoE checkpoints maxckpt writes, loaded by the real Megatron-Core (local spec, CPU, gloo).

MaxText's own mixtral and qwen3-moe training runs go to Megatron's
`torch_dist` with `maxckpt convert`; Megatron-Core's GPTModel (SequentialMLP
experts, top-k-then-softmax routing) loads them strictly and must give
MaxText's logits; the Megatron checkpoint converts back to the same HF
tensors, bit for bit.

Both layer specs: Transformer Engine does not install on CPU, so a TE-spec
checkpoint (`--megatron-spec te`, the default) is loaded into the local-spec
model through a key map from the TE spec's names to the local spec's
(`_te_spec_keys`, what megatron-core 0.16.1's gpt_layer_specs.py names them),
and every tensor the checkpoint holds must be asked for; and it is loaded a
second time, without a key map, into the TE spec's own module tree, built by
Megatron-Core's TE spec functions with CPU stand-ins for the TE modules
(`_te_structured_specs`: same parameter names, TENorm's `_extra_state`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_frameworks_real import _megatron_logits, _te_structured_specs, megatron  # noqa: F401  (the gloo fixture)

from maxckpt.formats import MegatronOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.containers.safetensors import SafetensorsReader

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

MOE = [("mixtral_moe_scan", "mixtral-8x7b"), ("qwen3_moe_scan", "qwen3-30b-a3b")]
SPECS = ["local", "te"]


def _te_spec_keys(sharded_state_dict, dense_layers=()):
    """The local-spec model's sharded keys renamed to the TE spec's (megatron-core 0.16.1, gpt_layer_specs.py).

    - a MoE layer of the TE spec keeps `pre_mlp_layernorm` (a TENorm; no keys map renames it), where the local
      spec's `sharded_state_dict_keys_map` writes `mlp.linear_fc1.layer_norm_weight`;
    - an MLA layer (per-layer keys) fuses q/kv norms into `linear_q_up_proj` / `linear_kv_up_proj`
      (TELayerNormColumnParallelLinear's `layer_norm_weight`), and a dense MLA layer its pre-MLP norm into
      `mlp.linear_fc1`; `input_layernorm` is a TENorm in both.
    """
    import re

    fused = {"self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
             "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight"}
    for sh in sharded_state_dict.values():
        key = getattr(sh, "key", None)
        if key == "decoder.layers.mlp.linear_fc1.layer_norm_weight":  # stacked MoE layers
            sh.key = "decoder.layers.pre_mlp_layernorm.weight"
        elif key and (m := re.match(r"decoder\.layers\.(\d+)\.(.+)$", key)):
            i, suffix = int(m.group(1)), m.group(2)
            if suffix in fused:
                sh.key = f"decoder.layers.{i}.{fused[suffix]}"
            elif suffix == "pre_mlp_layernorm.weight" and i in dense_layers:
                sh.key = f"decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight"
    return sharded_state_dict


def _load(model, ckpt_dir, te_key_map=False, dense_layers=()):
    """Megatron-LM's load (default strictness) into `model`, through the TE key map if asked.

    Every tensor of the checkpoint is asked for (no name went astray), and every `_extra_state` the model
    asks for is there.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject

    from maxckpt.containers.dcp import DcpReader

    sd = model.sharded_state_dict()
    if te_key_map:
        sd = _te_spec_keys(sd, dense_layers)
    reader = DcpReader(ckpt_dir)
    assert {v.key for v in sd.values() if not isinstance(v, ShardedObject)} == set(reader.tensors())
    assert {v.unique_key for v in sd.values() if isinstance(v, ShardedObject)} <= set(reader.objects())
    state = dist_checkpointing.load({"model": sd}, str(ckpt_dir))
    model.load_state_dict(state["model"], strict=True)


def _layer_spec(spec, te_structured, **kwargs):
    """The local layer spec, or (te_structured: the gpt_layer_specs module) the TE one with its stand-ins."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if te_structured:
        return te_structured.get_gpt_layer_with_transformer_engine_spec(moe_grouped_gemm=False, **kwargs)
    return get_gpt_layer_local_spec(moe_grouped_gemm=False, normalization="RMSNorm", **kwargs)


def _moe_model(spec, layout, te_structured=None):
    from megatron.core.models.gpt import GPTModel
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
    layer_spec = _layer_spec(spec, te_structured, num_experts=spec.num_experts, qk_layernorm=spec.qk_norm)
    return GPTModel(
        cfg, layer_spec, vocab_size=layout.padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", rotary_base=int(spec.rope_theta),
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


@pytest.mark.parametrize("megatron_spec", SPECS)
@pytest.mark.parametrize("name,model", MOE, ids=[m[0] for m in MOE])
def test_megatron_core_loads_a_maxtext_moe_run_and_gives_maxtexts_logits(megatron, maxtext_fixtures, tmp_path, monkeypatch, name, model, megatron_spec):  # noqa: F811
    from maxckpt.conversion import convert
    from maxckpt.formats.megatron.files import find_megatron_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

    import megatron.core.transformer.moe.moe_utils as moe_utils

    # megatron-core 0.16.1 names te_general_gemm only when Transformer Engine imports; CPU runs have none.
    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    src = maxtext_fixtures / name / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "mega", to="megatron", model=model, options=MegatronOptions(spec=megatron_spec), source=SourceOptions(overrides=settings))
    spec = report.spec
    layout = MegatronLayout(spec="local")
    ckpt_dir, iteration = find_megatron_checkpoint(tmp_path / "mega")
    assert iteration == 6  # MaxText's step carried over
    model_ = _moe_model(spec, layout)
    _load(model_, ckpt_dir, te_key_map=megatron_spec == "te")

    expected = np.load(maxtext_fixtures / "logits" / f"{name}_step5.npy")[0]
    tokens = np.load(maxtext_fixtures / "logits" / f"{name}_step5_tokens.npy")[0].tolist()
    logits = _megatron_logits(model_, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(logits - expected).max() < 1e-4
    if megatron_spec == "te":  # and into the TE spec's own module tree (CPU stand-ins), no key map
        te_model = _moe_model(spec, layout, _te_structured_specs(monkeypatch))
        assert te_model.decoder.layers[0].pre_mlp_layernorm.__class__.__name__ == "TENorm"
        _load(te_model, ckpt_dir)
        assert np.abs(_megatron_logits(te_model, tokens)[:, : spec.vocab_size].numpy() - expected).max() < 1e-4

    # And back: Megatron -> HF equals MaxText -> HF, bit for bit (family and top-k from maxckpt_model.json).
    convert(tmp_path / "mega", tmp_path / "hf_back", to="hf")
    convert(src, tmp_path / "hf", to="hf", model=model, source=SourceOptions(overrides=settings))
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


def test_maxckpt_reads_the_moe_checkpoint_megatron_core_saves(megatron, maxtext_fixtures, tmp_path, monkeypatch):  # noqa: F811
    """Megatron's own save of a MoE GPTModel -> maxckpt -> HF: every expert where transformers expects it."""
    from megatron.core import dist_checkpointing

    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

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
            source=SourceOptions(overrides={"num_experts_per_tok": 2, "vocab_size": spec.vocab_size, "head_dim": spec.head_dim}))
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


def _torchtitan_qwen3_moe_logits(spec, step_dir, tokens):
    """Build TorchTitan 0.3.0's Qwen 3 MoE model for `spec`, load `step_dir` model-only as TorchTitan does, run it."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers

    dim, vocab = spec.emb_dim, spec.vocab_size
    cfg = Qwen3Model.Config(
        vocab_size=vocab, dim=dim, enable_weight_tying=spec.tie_word_embeddings,
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_qwen3_moe_layers(
            fuse_qkv=True, n_layers=spec.num_layers, dim=dim, n_heads=spec.num_heads, n_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, moe_hidden_dim=spec.moe_mlp_dim, num_experts=spec.num_experts,
            top_k=spec.num_experts_per_tok, attn_backend="flex", moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=spec.head_dim, max_seq_len=256, theta=spec.rope_theta),
        ),
    )
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))
    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    wrapper.load_state_dict(state)
    model.eval()
    assert len(tokens) == 128  # FlexAttention's eager CPU path needs a full 128-token block
    pos = torch.arange(len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), pos, model.get_attention_masks(pos))[0]


def _float32_experts(self, x_RD, num_tokens_per_expert_E):
    """GroupedExperts.forward of torchtitan 0.3.0, in float32 (it casts to bfloat16 unconditionally).

    The same computation per expert, on the tokens routed to it (rows grouped
    by expert, as its grouped GEMM takes them).
    """
    out, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        x = x_RD[start : start + n].float()
        h = torch.nn.functional.silu(x @ self.w1_EFD[e].float().T) * (x @ self.w3_EFD[e].float().T)
        out.append(h @ self.w2_EDF[e].float().T)
        start += n
    return torch.cat(out + [x_RD.new_zeros(x_RD.shape[0] - start, x_RD.shape[1])]).type_as(x_RD)


def test_torchtitan_loads_a_maxtext_qwen3_moe_run_and_matches_transformers(torchtitan, maxtext_fixtures, tmp_path, monkeypatch):
    import transformers
    from torchtitan.models.common.moe import GroupedExperts

    # Compare placement, not bf16 rounding: torchtitan's experts always run in bfloat16.
    monkeypatch.setattr(GroupedExperts, "forward", _float32_experts)
    from maxckpt.conversion import convert
    from maxckpt.formats.torchtitan.files import find_step_dir

    src = maxtext_fixtures / "qwen3_moe_scan" / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "titan", to="torchtitan", model="qwen3-30b-a3b", source=SourceOptions(overrides=settings))
    convert(src, tmp_path / "hf", to="hf", model="qwen3-30b-a3b", source=SourceOptions(overrides=settings))
    step_dir, step = find_step_dir(tmp_path / "titan")
    assert step == 6
    tokens = [(7 * i + 1) % report.spec.vocab_size for i in range(128)]
    logits = _torchtitan_qwen3_moe_logits(report.spec, step_dir, tokens)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    assert (logits - expected).abs().max().item() < 1e-4

    # And back: TorchTitan -> HF equals MaxText -> HF, bit for bit.
    convert(tmp_path / "titan", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


def test_maxckpt_reads_the_qwen3_moe_checkpoint_torchtitan_saves(torchtitan, maxtext_fixtures, tmp_path):
    """TorchTitan's own DCP save of a Qwen 3 MoE model -> maxckpt -> HF: every expert where transformers expects it."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers

    from maxckpt.conversion import convert

    cfg = Qwen3Model.Config(
        vocab_size=256, dim=64, norm=RMSNorm.Config(normalized_shape=64, eps=1e-6),
        tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=64),
        lm_head=Linear.Config(in_features=64, out_features=256),
        layers=_build_qwen3_moe_layers(fuse_qkv=True, n_layers=2, dim=64, n_heads=4, n_kv_heads=2, head_dim=16,
                                       moe_hidden_dim=48, num_experts=4, top_k=2, attn_backend="flex",
                                       moe_comm_backend="standard", rope=CosSinRoPE.Config(dim=16, max_seq_len=256, theta=1e6)),
    )
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))
    state = {k: v.detach().clone() for k, v in ModelWrapper(model).state_dict().items()}
    dcp.save(state, checkpoint_id=str(tmp_path / "ckpt" / "step-10"))
    report = convert(tmp_path / "ckpt", tmp_path / "hf", to="hf", model="qwen3-30b-a3b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert report.spec.num_experts == 4 and report.spec.moe_mlp_dim == 48
    hf = SafetensorsReader(tmp_path / "hf")
    for i in range(2):
        p = f"layers.{i}.moe."
        assert np.array_equal(hf.read(f"model.layers.{i}.mlp.gate.weight"), state[p + "router.gate.weight"].numpy())
        for e in range(4):
            for key, name in (("w1_EFD", "gate_proj"), ("w3_EFD", "up_proj"), ("w2_EDF", "down_proj")):
                got = hf.read(f"model.layers.{i}.mlp.experts.{e}.{name}.weight")
                assert np.array_equal(got, state[p + "routed_experts.inner_experts." + key][e].numpy())


def _torchtitan_deepseek_logits(spec, step_dir, tokens):
    """TorchTitan 0.3.0's DeepSeek V3 model for `spec` (MLA, YaRN, sigmoid routing with bias), loaded model-only."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers

    yarn = dict(spec.rope_scaling)
    layers = _build_dsv3_layers(
        n_layers=spec.num_layers, n_dense_layers=spec.first_dense_layers, dim=spec.emb_dim, n_heads=spec.num_heads,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, mscale=yarn["mscale_all_dim"],
        dense_hidden_dim=spec.mlp_dim, moe_hidden_dim=spec.moe_mlp_dim, num_experts=spec.num_experts,
        num_shared_experts=spec.num_shared_experts, router_top_k=spec.num_experts_per_tok, router_score_func="sigmoid",
        router_route_scale=spec.routed_scaling_factor, router_route_norm=spec.norm_topk_prob, attn_backend="flex",
        moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=spec.qk_rope_head_dim, max_seq_len=4096 * 4, theta=spec.rope_theta, scaling="yarn",
                                rope_factor=yarn["factor"], beta_fast=yarn["beta_fast"], beta_slow=yarn["beta_slow"],
                                original_seq_len=yarn["original_max_position_embeddings"]),
    )
    for layer in layers:  # the fixture's norms use eps 1e-6, as does HF's config
        for norm in (layer.attention_norm, layer.ffn_norm, layer.attention.kv_norm, layer.attention.q_norm):
            norm.eps = spec.rms_norm_eps
    vocab, dim = spec.vocab_size, spec.emb_dim
    cfg = DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim, tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=dim, out_features=vocab), layers=layers, mtp_layers=[],
    )
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))
    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    wrapper.load_state_dict(state)
    model.eval()
    pos = torch.arange(len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), pos, model.get_attention_masks(pos))[0]


def test_torchtitan_loads_a_maxtext_deepseek3_run_and_matches_transformers(torchtitan, maxtext_fixtures, tmp_path, monkeypatch):
    import transformers
    from torchtitan.models.common.moe import GroupedExperts

    from maxckpt.conversion import convert
    from maxckpt.formats.torchtitan.files import find_step_dir

    monkeypatch.setattr(GroupedExperts, "forward", _float32_experts)
    src = maxtext_fixtures / "deepseek3_scan" / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "titan", to="torchtitan", model="deepseek3-671b", source=SourceOptions(overrides=settings))
    convert(src, tmp_path / "hf", to="hf", model="deepseek3-671b", source=SourceOptions(overrides=settings))
    step_dir, _ = find_step_dir(tmp_path / "titan")
    tokens = [(7 * i + 1) % report.spec.vocab_size for i in range(128)]
    logits = _torchtitan_deepseek_logits(report.spec, step_dir, tokens)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    assert (logits - expected).abs().max().item() < 1e-4

    convert(tmp_path / "titan", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


def _tt_gpt_oss_model(spec):
    """TorchTitan 0.3.0's gpt_oss model for `spec`: its own attention/expert config builders, stock balancing."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.moe import TokenChoiceTopKRouter
    from torchtitan.models.gpt_oss import GptOssModel, _make_gptoss_attn_config, _make_gptoss_experts_config
    from torchtitan.models.gpt_oss.model import GptOssTransformerBlock
    from torchtitan.models.gpt_oss.moe import GptOssMoE

    yarn = dict(spec.rope_scaling)
    rope = CosSinRoPE.Config(dim=spec.head_dim, max_seq_len=256, theta=spec.rope_theta, scaling="yarn",
                             rope_factor=yarn["factor"], beta_fast=yarn["beta_fast"], beta_slow=yarn["beta_slow"],
                             truncate=yarn["truncate"], original_seq_len=yarn["original_max_position_embeddings"])
    E, X, K = spec.emb_dim, spec.num_experts, spec.num_experts_per_tok
    layers = []
    for i in range(spec.num_layers):
        attention = _make_gptoss_attn_config(
            dim=E, layer_id=i, attn_backend="flex", n_heads=spec.num_heads, n_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, sliding_window_size=spec.sliding_window if i % 2 == 0 else None, rope=rope)
        moe = GptOssMoE.Config(
            num_experts=X, load_balance_coeff=1e-3,
            routed_experts=_make_gptoss_experts_config(dim=E, hidden_dim=spec.moe_mlp_dim, num_experts=X, layer_id=i,
                                                       top_k=K, moe_comm_backend="standard"),
            router=TokenChoiceTopKRouter.Config(num_experts=X, score_func="softmax", route_norm=True, top_k=K,
                                                gate=Linear.Config(in_features=E, out_features=X, bias=True)))
        layers.append(GptOssTransformerBlock.Config(
            attention=attention, moe=moe, attention_norm=RMSNorm.Config(normalized_shape=E, eps=spec.rms_norm_eps),
            ffn_norm=RMSNorm.Config(normalized_shape=E, eps=spec.rms_norm_eps)))
    cfg = GptOssModel.Config(
        dim=E, vocab_size=spec.vocab_size, tok_embeddings=Embedding.Config(num_embeddings=spec.vocab_size, embedding_dim=E),
        norm=RMSNorm.Config(normalized_shape=E, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=E, out_features=spec.vocab_size), layers=layers)
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))
    return model


def _tt_layer(model, i: int):
    return model.layers[str(i)] if isinstance(model.layers, torch.nn.ModuleDict) else model.layers[i]


def _float32_gpt_oss_experts(self, x_RD, num_tokens_per_expert_E):
    """torchtitan 0.3.0's GptOssGroupedExperts.forward in float32 (it casts to bfloat16), with its own swiglu."""
    from torchtitan.models.gpt_oss.moe import swiglu

    out, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        x = x_RD[start : start + n].float()
        h = swiglu(x @ self.mlp1_weight_EGD[e].float().T + self.mlp1_bias_EG[e].float(), limit=self.swiglu_limit)
        out.append(h @ self.mlp2_weight_EDF[e].float().T + self.mlp2_bias_ED[e].float())
        start += n
    return torch.cat(out + [x_RD.new_zeros(x_RD.shape[0] - start, x_RD.shape[1])]).type_as(x_RD)


def test_torchtitan_loads_a_maxtext_gpt_oss_run_and_its_moe_matches_transformers(torchtitan, maxtext_fixtures, tmp_path, monkeypatch):
    """Strict model-only load into TorchTitan's gpt_oss model; each layer's MoE block then computes what
    transformers' does (its attention needs a compiled FlexAttention with LSE, which CPU torch cannot build)."""
    import transformers
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    from maxckpt.conversion import convert
    from maxckpt.formats.torchtitan.files import find_step_dir

    monkeypatch.setattr(GptOssGroupedExperts, "forward", _float32_gpt_oss_experts)
    src = maxtext_fixtures / "gpt_oss_scan" / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "titan", to="torchtitan", model="gpt-oss-20b", source=SourceOptions(overrides=settings))
    convert(src, tmp_path / "hf", to="hf", model="gpt-oss-20b", source=SourceOptions(overrides=settings))
    step_dir, _ = find_step_dir(tmp_path / "titan")
    model = _tt_gpt_oss_model(report.spec)
    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))  # raises for any model key the checkpoint lacks
    wrapper.load_state_dict(state)
    model.eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    x = torch.randn(1, 16, report.spec.emb_dim, generator=torch.Generator().manual_seed(0))
    for i in range(report.spec.num_layers):
        with torch.no_grad():
            ours = _tt_layer(model, i).moe(x)
            theirs = hf.model.layers[i].mlp(x)
            theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        assert (ours - theirs).abs().max().item() < 1e-5, i
        tt_attn, hf_attn = _tt_layer(model, i).attention, hf.model.layers[i].self_attn
        assert torch.equal(tt_attn.sinks, hf_attn.sinks)
        # TorchTitan fuses q, k, v into one linear grouped per kv head; its state dict splits them back.
        loaded = ModelWrapper(model).state_dict()
        for p in "qkv":
            assert torch.equal(loaded[f"layers.{i}.attention.qkv_linear.w{p}.weight"], getattr(hf_attn, f"{p}_proj").weight)
            assert torch.equal(loaded[f"layers.{i}.attention.qkv_linear.w{p}.bias"], getattr(hf_attn, f"{p}_proj").bias)

    convert(tmp_path / "titan", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


# ---------------------------------------------------------------- DeepSeek-V3 (MLA) in Megatron-Core


def _megatron_mla_patches(monkeypatch):
    """What Megatron-Core 0.16.1's MLA needs to run on CPU without Transformer Engine.

    - `multi_latent_attention.HAVE_TE` is True whenever `megatron.core.extensions.transformer_engine`
      imports, which it does without TE (its TE classes are then MagicMock placeholders); the
      `isinstance(self.linear_proj, TELinear)` check then raises "isinstance() arg 2 must be a type".
    - MLA builds its core attention with `k_channels=` / `v_channels=`, which the local spec's
      `DotProductAttention.__init__` does not take (TEDotProductAttention does); its forward is
      written for any q/k and v widths, so a subclass that accepts and drops the two keywords runs
      Megatron's own attention (the output width per head is `kv_channels`, set to v_head_dim).
    """
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.multi_latent_attention as mla
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    monkeypatch.setattr(mla, "HAVE_TE", False)

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)
            assert v_channels in (None, self.config.kv_channels), "set kv_channels to v_head_dim"

    return MLADotProductAttention


def _deepseek_model(spec, layout, core_attention, te_structured=None):
    """Megatron-Core's DeepSeek-V3 GPTModel for `spec`: MLA + YaRN, dense leading layers, sigmoid routing with bias
    (te_structured: the TE spec's module tree, `_te_structured_specs`)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    yarn = dict(spec.rope_scaling)
    k = spec.first_dense_layers
    cfg = MLATransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.emb_dim, num_attention_heads=spec.num_heads,
        ffn_hidden_size=spec.mlp_dim, kv_channels=spec.v_head_dim,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_head_dim=spec.qk_nope_head_dim,
        qk_pos_emb_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, qk_layernorm=True,
        rope_type="yarn", rotary_base=spec.rope_theta, rotary_scaling_factor=yarn["factor"], mscale=yarn["mscale"],
        mscale_all_dim=yarn["mscale_all_dim"], original_max_position_embeddings=yarn["original_max_position_embeddings"],
        beta_fast=yarn["beta_fast"], beta_slow=yarn["beta_slow"],
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps, add_bias_linear=False,
        use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        num_moe_experts=spec.num_experts, moe_router_topk=spec.num_experts_per_tok, moe_ffn_hidden_size=spec.moe_mlp_dim,
        moe_shared_expert_intermediate_size=spec.num_shared_experts * spec.moe_mlp_dim,
        moe_layer_freq=[0] * k + [1] * (spec.num_layers - k), moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=spec.routed_scaling_factor,
        moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0, moe_router_load_balancing_type="none",
    )
    block = (te_structured or gpt_layer_specs).get_gpt_decoder_block_spec(
        cfg, use_transformer_engine=te_structured is not None, normalization="RMSNorm")
    for layer_spec in block.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    return GPTModel(
        cfg, block, vocab_size=layout.padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


def _hf_logits(path, tokens):
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].numpy()


@pytest.mark.parametrize("megatron_spec", SPECS)
def test_megatron_core_loads_a_maxtext_deepseek3_run_and_matches_transformers(megatron, maxtext_fixtures, tmp_path, monkeypatch, megatron_spec):  # noqa: F811
    """MaxText's DeepSeek-V3 run (MLA, YaRN, 3 dense + 2 MoE layers, shared expert, routing bias) ->
    Megatron `torch_dist` -> Megatron-Core's GPTModel, strict load: transformers' logits on the HF export."""
    pytest.importorskip("transformers")
    from maxckpt.conversion import convert
    from maxckpt.formats.megatron.files import find_megatron_checkpoint, read_megatron_common
    from maxckpt.formats.megatron.layout import MegatronLayout

    core_attention = _megatron_mla_patches(monkeypatch)
    src = maxtext_fixtures / "deepseek3_scan" / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    report = convert(src, tmp_path / "mega", to="megatron", model="deepseek3-671b", options=MegatronOptions(spec=megatron_spec), source=SourceOptions(overrides=settings))
    convert(src, tmp_path / "hf", to="hf", model="deepseek3-671b", source=SourceOptions(overrides=settings))
    spec = report.spec
    assert spec.first_dense_layers == 3 and spec.num_shared_experts == 1 and spec.q_lora_rank
    layout = MegatronLayout(spec="local")
    ckpt_dir, _ = find_megatron_checkpoint(tmp_path / "mega")
    args = read_megatron_common(ckpt_dir)["args"]
    assert args.multi_latent_attention and args.moe_layer_freq == [0, 0, 0, 1, 1]
    assert args.moe_router_score_function == "sigmoid" and args.moe_router_enable_expert_bias
    assert args.transformer_impl == ("transformer_engine" if megatron_spec == "te" else "local")
    model = _deepseek_model(spec, layout, core_attention)
    _load(model, ckpt_dir, te_key_map=megatron_spec == "te", dense_layers=range(spec.first_dense_layers))

    tokens = [(7 * i + 1) % spec.vocab_size for i in range(32)]
    expected = _hf_logits(tmp_path / "hf", tokens)
    logits = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(logits - expected).max() < 1e-4
    if megatron_spec == "te":  # and into the TE spec's own module tree (CPU stand-ins), no key map
        te_model = _deepseek_model(spec, layout, core_attention, _te_structured_specs(monkeypatch))
        assert te_model.decoder.layers[0].self_attention.linear_q_up_proj.layer_norm_weight is not None
        _load(te_model, ckpt_dir)
        assert np.abs(_megatron_logits(te_model, tokens)[:, : spec.vocab_size].numpy() - expected).max() < 1e-4

    # The routing bias (MaxText's nnx_aux) is carried and matters: without it Megatron routes otherwise.
    bias = model.decoder.layers[3].mlp.router.expert_bias
    assert bias.abs().max() > 0
    for layer in model.decoder.layers[3:]:
        layer.mlp.router.expert_bias.zero_()
    unbiased = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(unbiased - expected).max() > 1e-3

    # And back: Megatron -> HF equals MaxText -> HF, bit for bit (settings from maxckpt_model.json).
    convert(tmp_path / "mega", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n


def test_a_deepseek3_checkpoint_megatron_core_saves_converts_to_hf_and_gives_megatrons_logits(megatron, maxtext_fixtures, tmp_path, monkeypatch):  # noqa: F811
    """Megatron's own `dist_checkpointing.save` of a random DeepSeek-V3 GPTModel (expert bias set) -> maxckpt
    -> HF: transformers computes Megatron's logits; HF -> Megatron again gives the same tensors, bit for bit."""
    pytest.importorskip("transformers")
    from megatron.core import dist_checkpointing

    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

    core_attention = _megatron_mla_patches(monkeypatch)
    with open_checkpoint(maxtext_fixtures / "deepseek3_scan" / "checkpoints" / "5" / "items", model="deepseek3-671b",
                         overrides={"num_experts_per_tok": 2}) as ckpt:
        spec = ckpt.spec
    layout = MegatronLayout(spec="local")
    torch.manual_seed(0)
    model = _deepseek_model(spec, layout, core_attention)
    with torch.no_grad():
        for layer in model.decoder.layers[spec.first_dense_layers:]:
            layer.mlp.router.expert_bias.copy_(torch.randn(spec.num_experts) * 0.5)
        for name, p in model.named_parameters():
            if "layernorm" in name:  # norms other than 1, so a swapped norm would show
                p.add_(torch.randn_like(p) * 0.1)
    out = tmp_path / "saved"
    out.mkdir()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    dist_checkpointing.save(model.sharded_state_dict(), str(out))
    overrides = {"num_experts_per_tok": 2, "vocab_size": spec.vocab_size}
    convert(out, tmp_path / "hf", to="hf", model="deepseek3-671b", source=SourceOptions(overrides=overrides))

    tokens = [(5 * i + 3) % spec.vocab_size for i in range(32)]
    expected = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(_hf_logits(tmp_path / "hf", tokens) - expected).max() < 1e-4

    # HF -> Megatron -> HF is bit-exact, and the Megatron tensors are Megatron's own.
    convert(tmp_path / "hf", tmp_path / "mega", to="megatron", options=MegatronOptions(spec="local"))
    convert(tmp_path / "mega", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n
    sd = model.state_dict()
    hf = direct
    assert np.array_equal(hf.read("model.layers.4.mlp.gate.e_score_correction_bias"), sd["decoder.layers.4.mlp.router.expert_bias"].numpy())
    assert np.array_equal(hf.read("model.layers.4.self_attn.kv_b_proj.weight"), sd["decoder.layers.4.self_attention.linear_kv_up_proj.weight"].numpy())


# ---------------------------------------------------------------- gpt-oss in Megatron-Core


def _sliding_window_mask_on_cpu(sq, skv, window_size):
    """megatron.core.transformer.utils.get_sliding_window_causal_mask of 0.16.1, without its `device="cuda"`."""
    m = torch.ones(sq, skv, dtype=torch.bool)
    return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])


def _gpt_oss_model(spec, layout, monkeypatch, te_structured=None):
    """Megatron-Core 0.16.1's GPTModel for gpt-oss, configured from the args maxckpt writes to common.pt:
    q/k/v/o and expert biases, router bias, learnable softmax offsets (sinks), a window on every other layer,
    quick-GeGLU with +1 offset and clamp, YaRN positions."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core.activations import quick_gelu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from maxckpt.formats.megatron.args import megatron_args

    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    monkeypatch.setattr(fused_softmax, "get_sliding_window_causal_mask", _sliding_window_mask_on_cpu)
    a = megatron_args(spec, layout)
    assert a.quick_geglu and a.softmax_type == "learnable" and a.position_embedding_type == "yarn"
    cfg = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups, kv_channels=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size,
        gated_linear_unit=True, activation_func=quick_gelu, glu_linear_offset=a.glu_linear_offset,
        activation_func_clamp_value=a.activation_func_clamp_value, normalization="RMSNorm",
        layernorm_epsilon=a.norm_epsilon, add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias,
        softmax_type=a.softmax_type, window_size=a.window_size, window_attn_skip_freq=a.window_attn_skip_freq,
        use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        moe_token_dispatcher_type="allgather", moe_router_pre_softmax=False, moe_aux_loss_coeff=0.0,
        moe_router_load_balancing_type="none",
    )
    for key, value in vars(a).items():  # GPTModel reads the YaRN settings as config attributes (yarn_*)
        if key.startswith("yarn_"):
            setattr(cfg, key, value)
    return GPTModel(
        cfg, _layer_spec(spec, te_structured, num_experts=a.num_experts),
        vocab_size=a.padded_vocab_size, max_sequence_length=256, position_embedding_type="yarn",
        rotary_base=a.rotary_base, share_embeddings_and_output_weights=False,
    ).eval()


def test_megatron_core_loads_a_maxtext_gpt_oss_run_and_matches_transformers(megatron, maxtext_fixtures, tmp_path, monkeypatch):  # noqa: F811
    """MaxText's gpt-oss run -> Megatron `torch_dist` -> Megatron-Core's GPTModel, strict load: transformers'
    logits on the HF export over 160 tokens (past the 128-token window of the sliding layers). Both layer
    specs (one model, the TE-spec checkpoint through the TE key map), each back to HF bit for bit."""
    pytest.importorskip("transformers")
    from maxckpt.conversion import convert
    from maxckpt.formats.megatron.files import find_megatron_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

    src = maxtext_fixtures / "gpt_oss_scan" / "checkpoints" / "5" / "items"
    settings = {"num_experts_per_tok": 2}
    convert(src, tmp_path / "hf", to="hf", model="gpt-oss-20b", source=SourceOptions(overrides=settings))
    expected = None
    for megatron_spec in ("te", "local"):  # the window check below runs on the local one
        report = convert(src, tmp_path / f"mega_{megatron_spec}", to="megatron", model="gpt-oss-20b",
                         options=MegatronOptions(spec=megatron_spec), source=SourceOptions(overrides=settings))
        spec = report.spec
        tokens = [(7 * i + 1) % spec.vocab_size for i in range(160)]
        ckpt_dir, _ = find_megatron_checkpoint(tmp_path / f"mega_{megatron_spec}")
        model = _gpt_oss_model(spec, MegatronLayout(spec="local"), monkeypatch)
        _load(model, ckpt_dir, te_key_map=megatron_spec == "te")
        expected = _hf_logits(tmp_path / "hf", tokens) if expected is None else expected
        logits = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
        assert np.abs(logits - expected).max() < 1e-4, megatron_spec
        if megatron_spec == "te":  # and into the TE spec's own module tree (CPU stand-ins), no key map
            with pytest.MonkeyPatch.context() as mp:
                te_model = _gpt_oss_model(spec, MegatronLayout(spec="local"), mp, _te_structured_specs(mp))
                _load(te_model, ckpt_dir)
                te_logits = _megatron_logits(te_model, tokens)[:, : spec.vocab_size].numpy()
            assert np.abs(te_logits - expected).max() < 1e-4
        convert(tmp_path / f"mega_{megatron_spec}", tmp_path / f"hf_back_{megatron_spec}", to="hf")
        back, direct = SafetensorsReader(tmp_path / f"hf_back_{megatron_spec}"), SafetensorsReader(tmp_path / "hf")
        assert set(back.tensors()) == set(direct.tensors())
        for n in direct.tensors():
            assert np.array_equal(back.read(n), direct.read(n)), n
    # The window is exact: HF's sliding_window W is Megatron's window_size (W - 1, 0); one more key differs.
    for layer in model.decoder.layers:
        softmax = layer.self_attention.core_attention.scale_mask_softmax
        if softmax.window_size is not None:
            softmax.window_size = (softmax.window_size[0] + 1, 0)
    wider = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(wider - expected).max() > 1e-2


def test_a_gpt_oss_checkpoint_megatron_core_saves_converts_to_hf_and_gives_megatrons_logits(megatron, maxtext_fixtures, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("transformers")
    from megatron.core import dist_checkpointing

    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.formats.megatron.layout import MegatronLayout

    with open_checkpoint(maxtext_fixtures / "gpt_oss_scan" / "checkpoints" / "5" / "items", model="gpt-oss-20b",
                         overrides={"num_experts_per_tok": 2}) as ckpt:
        spec = ckpt.spec
    torch.manual_seed(0)
    model = _gpt_oss_model(spec, MegatronLayout(spec="local"), monkeypatch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "softmax_offset")):  # Megatron initialises biases to zero: make them count
                p.copy_(torch.randn_like(p) * 0.3)
    out = tmp_path / "saved"
    out.mkdir()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    dist_checkpointing.save(model.sharded_state_dict(), str(out))
    overrides = {"num_experts_per_tok": 2, "vocab_size": spec.vocab_size, "head_dim": spec.head_dim}
    convert(out, tmp_path / "hf", to="hf", model="gpt-oss-20b", source=SourceOptions(overrides=overrides))

    tokens = [(5 * i + 3) % spec.vocab_size for i in range(160)]
    expected = _megatron_logits(model, tokens)[:, : spec.vocab_size].numpy()
    assert np.abs(_hf_logits(tmp_path / "hf", tokens) - expected).max() < 1e-4

    convert(tmp_path / "hf", tmp_path / "mega", to="megatron", options=MegatronOptions(spec="local"))
    convert(tmp_path / "mega", tmp_path / "hf_back", to="hf")
    back, direct = SafetensorsReader(tmp_path / "hf_back"), SafetensorsReader(tmp_path / "hf")
    assert set(back.tensors()) == set(direct.tensors())
    for n in direct.tensors():
        assert np.array_equal(back.read(n), direct.read(n)), n
