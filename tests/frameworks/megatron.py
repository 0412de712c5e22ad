"""Megatron-Core 0.16.1 on CPU for the framework matrix: the gloo group, the models per family, loading, logits.

Transformer Engine does not install on CPU, so a TE-spec checkpoint (`--megatron-spec te`) is loaded twice:
into the local-spec model through a key map from the TE spec's names to the local spec's (`te_spec_keys`,
what megatron-core 0.16.1's gpt_layer_specs.py names them), and into the TE spec's own module tree, built
by Megatron-Core's TE spec functions with CPU stand-ins for the TE modules (`te_structured_specs`: same
parameter names, TENorm's `_extra_state`), without a key map.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import pytest
import torch


@contextmanager
def megatron_core(tmp_path, monkeypatch):
    """Megatron-Core on CPU: a gloo process group of one rank, TP = PP = 1 (fails, never skips, without it)."""
    try:
        import megatron.core as core
    except ImportError as exc:
        pytest.fail(
            f"megatron-core does not import ({exc}): the `megatron` extra of `pip install -e '.[all]'` installs "
            "megatron-core 0.16.x on Python 3.11 (the release these tests are written for)", pytrace=False,
        )
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    # Megatron asks CUDA for the current device even on CPU-only paths.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        yield core
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def te_structured_specs(monkeypatch):
    """Megatron-Core's own TE layer specs (`get_gpt_layer_with_transformer_engine_spec`, the TE path of
    `get_gpt_decoder_block_spec`), built on CPU: TESpecProvider's modules become local modules carrying what
    the TE ones name and save - TENorm (te.pytorch.RMSNorm, in TE 2 a fusible op) a `weight` and an
    `_extra_state`, TELayerNormColumnParallelLinear its norm as `layer_norm_weight` - so the sharded keys
    of the model are those of the TE spec's module tree, without a key map. Returns gpt_layer_specs."""
    import megatron.core.models.gpt.gpt_layer_specs as specs
    import megatron.core.transformer.transformer_block as block
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    def rms(x, weight, eps):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)

    class TENorm(torch.nn.Module):
        def __init__(self, config, hidden_size, eps=1e-5):
            super().__init__()
            self.weight, self.eps = torch.nn.Parameter(torch.ones(hidden_size)), eps

        def forward(self, x):
            return rms(x, self.weight, self.eps)

        def get_extra_state(self):
            return None

        def set_extra_state(self, state):
            assert state is None

    class TELayerNormColumnParallelLinear(ColumnParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size))

        def forward(self, x, *args, **kwargs):
            return super().forward(rms(x, self.layer_norm_weight, self.config.layernorm_epsilon), *args, **kwargs)

    class TESpecProvider:  # megatron/core/extensions/transformer_engine_spec_provider.py, module for module
        def linear(self):
            return ColumnParallelLinear  # TELinear's place (MLA's down projections)

        def column_parallel_linear(self):
            return ColumnParallelLinear

        def row_parallel_linear(self):
            return RowParallelLinear

        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return TELayerNormColumnParallelLinear

        def layer_norm(self, rms_norm=False, for_qk=False):
            return TENorm

        def core_attention(self):
            return DotProductAttention

        def grouped_mlp_modules(self, moe_use_grouped_gemm, moe_use_legacy_grouped_gemm):
            return SequentialMLP, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)

        def activation_func(self):
            return None

    monkeypatch.setattr(specs, "TESpecProvider", TESpecProvider, raising=False)
    monkeypatch.setattr(specs, "TENorm", TENorm, raising=False)
    monkeypatch.setattr(block, "LayerNormImpl", TENorm)  # the final norm of a block built from one layer spec
    return specs


def te_spec_keys(sharded_state_dict, spec):
    """The local-spec model's sharded keys renamed to the TE spec's (megatron-core 0.16.1, gpt_layer_specs.py).

    - a MoE layer of the TE spec keeps `pre_mlp_layernorm` (a TENorm; no keys map renames it), where the local
      spec's `sharded_state_dict_keys_map` writes `mlp.linear_fc1.layer_norm_weight`;
    - an MLA layer (per-layer keys) fuses q/kv norms into `linear_q_up_proj` / `linear_kv_up_proj`
      (TELayerNormColumnParallelLinear's `layer_norm_weight`), and a dense MLA layer its pre-MLP norm into
      `mlp.linear_fc1`; `input_layernorm` is a TENorm in both.
    A dense model's keys are the same under both specs.
    """
    dense_layers = range(spec.first_dense_layers or 0)
    fused = {"self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
             "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight"}
    for sh in sharded_state_dict.values():
        key = getattr(sh, "key", None)
        if key == "decoder.layers.mlp.linear_fc1.layer_norm_weight" and spec.num_experts:  # stacked MoE layers
            sh.key = "decoder.layers.pre_mlp_layernorm.weight"
        elif key and (m := re.match(r"decoder\.layers\.(\d+)\.(.+)$", key)):
            i, suffix = int(m.group(1)), m.group(2)
            if suffix in fused:
                sh.key = f"decoder.layers.{i}.{fused[suffix]}"
            elif suffix == "pre_mlp_layernorm.weight" and i in dense_layers:
                sh.key = f"decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight"
    return sharded_state_dict


def load(model, ckpt_dir, spec, *, te_key_map=False, strict="assume_ok_unexpected"):
    """Megatron-LM's load into `model` (model keys under "model"), through the TE key map if asked.

    Every tensor of the checkpoint is asked for (no name went astray), and every `_extra_state` the model
    asks for is there. Returns the loaded state (common.pt's entries merged in).
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject

    from maxckpt.containers.dcp import DcpReader

    sd = model.sharded_state_dict()
    if te_key_map:
        sd = te_spec_keys(sd, spec)
    reader = DcpReader(ckpt_dir)
    assert {v.key for v in sd.values() if not isinstance(v, ShardedObject)} == set(reader.tensors())
    assert {v.unique_key for v in sd.values() if isinstance(v, ShardedObject)} <= set(reader.objects())
    state = dist_checkpointing.load({"model": sd}, str(ckpt_dir), strict=strict)
    model.load_state_dict(state["model"], strict=True)
    return state


def save(model, out, *, singleton_local_shards=False):
    """Megatron's own `dist_checkpointing.save` of `model` into the new folder `out`."""
    from megatron.core import dist_checkpointing

    out.mkdir(parents=True)
    # Megatron's save path calls torch.cuda.synchronize, which CPU-only torch lacks.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        dist_checkpointing.save(model.sharded_state_dict(metadata={"singleton_local_shards": singleton_local_shards}),
                                str(out))


def logits(model, tokens, vocab_size):
    """The model's logits for one sequence, the padded vocabulary rows cut off, as numpy."""
    s = len(tokens)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)  # True = masked
    with torch.no_grad():
        return model(torch.tensor([tokens]), torch.arange(s)[None], mask)[0][:, :vocab_size].numpy()


def assert_te_structure(model, spec):
    """The TE spec's module tree, as its checkpoint names it: TENorm final norm (with its `_extra_state`), a
    TENorm before each MoE block, the q/kv norms of MLA fused into their up projections."""
    from megatron.core.dist_checkpointing import ShardedObject

    objects = {v.unique_key for v in model.sharded_state_dict().values() if isinstance(v, ShardedObject)}
    assert "decoder.final_layernorm._extra_state/shard_0_1" in objects
    for i, layer in enumerate(model.decoder.layers):
        if spec.num_experts and i >= (spec.first_dense_layers or 0):
            assert layer.pre_mlp_layernorm.__class__.__name__ == "TENorm", i
        if spec.q_lora_rank:
            assert layer.self_attention.linear_q_up_proj.layer_norm_weight is not None, i


# ------------------------------------------------------------------ models, one builder per kind of family


def _cpu_config(**kwargs):
    """The TransformerConfig fields every model here shares: float32 on CPU, no dropout, no fused kernels."""
    return dict(
        use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, normalization="RMSNorm", **kwargs,
    )


def _moe_config(num_experts, top_k, ffn):
    return dict(num_moe_experts=num_experts, moe_router_topk=top_k, moe_ffn_hidden_size=ffn,
                moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0, moe_router_load_balancing_type="none")


def _layer_spec(spec, te_structured, **kwargs):
    """The local layer spec, or (te_structured: the gpt_layer_specs module) the TE one with its stand-ins."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if te_structured:
        return te_structured.get_gpt_layer_with_transformer_engine_spec(moe_grouped_gemm=False, **kwargs)
    return get_gpt_layer_local_spec(moe_grouped_gemm=False, normalization="RMSNorm", **kwargs)


def gpt_model(spec, monkeypatch, te_structured=None):
    """Megatron-Core's GPTModel for a Llama-style family: dense (llama2/3/3.1, mistral, qwen3, qwen2.5) or with
    SequentialMLP experts and top-k-then-softmax routing (mixtral, qwen3-moe); llama3 rope scaling."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from maxckpt.formats.megatron.layout import MegatronLayout

    moe = {}
    if spec.num_experts:
        import megatron.core.transformer.moe.moe_utils as moe_utils

        # megatron-core 0.16.1 names te_general_gemm only when Transformer Engine imports; CPU runs have none.
        monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
        moe = dict(_moe_config(spec.num_experts, spec.num_experts_per_tok, spec.moe_mlp_dim), moe_router_pre_softmax=False)
    cfg = TransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.emb_dim, num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim, ffn_hidden_size=spec.mlp_dim,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        layernorm_epsilon=spec.rms_norm_eps, add_bias_linear=False, qk_layernorm=spec.qk_norm,
        add_qkv_bias=spec.qkv_bias,  # qwen2.5
        **_cpu_config(**moe),
    )
    return GPTModel(
        cfg, _layer_spec(spec, te_structured, num_experts=spec.num_experts or None, qk_layernorm=spec.qk_norm),
        vocab_size=MegatronLayout(spec="local").padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", rotary_base=int(spec.rope_theta),
        rope_scaling=bool(spec.rope_scaling), rope_scaling_factor=float((spec.rope_scaling or {}).get("factor", 8.0)),
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


def _mla_core_attention(monkeypatch):
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


def deepseek_model(spec, monkeypatch, te_structured=None):
    """Megatron-Core's DeepSeek-V3 GPTModel for `spec`: MLA + YaRN, dense leading layers, sigmoid routing with bias
    (DeepSeek-V2: no query LoRA, q_lora_rank None; the top-k of the softmax over every expert, not renormalised)."""
    from megatron.core.models.gpt import GPTModel, gpt_layer_specs
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from maxckpt.formats.megatron.layout import MegatronLayout

    core_attention = _mla_core_attention(monkeypatch)
    yarn = dict(spec.rope_scaling)
    k = spec.first_dense_layers
    greedy = spec.routing == "softmax_greedy"
    cfg = MLATransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.emb_dim, num_attention_heads=spec.num_heads,
        ffn_hidden_size=spec.mlp_dim, kv_channels=spec.v_head_dim,
        q_lora_rank=spec.q_lora_rank or None, kv_lora_rank=spec.kv_lora_rank, qk_head_dim=spec.qk_nope_head_dim,
        qk_pos_emb_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, qk_layernorm=True,
        rope_type="yarn", rotary_base=spec.rope_theta, rotary_scaling_factor=yarn["factor"], mscale=yarn["mscale"],
        mscale_all_dim=yarn["mscale_all_dim"], original_max_position_embeddings=yarn["original_max_position_embeddings"],
        beta_fast=yarn["beta_fast"], beta_slow=yarn["beta_slow"],
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        layernorm_epsilon=spec.rms_norm_eps, add_bias_linear=False,
        moe_shared_expert_intermediate_size=spec.num_shared_experts * spec.moe_mlp_dim,
        moe_layer_freq=[0] * k + [1] * (spec.num_layers - k),
        moe_router_score_function="softmax" if greedy else "sigmoid", moe_router_pre_softmax=greedy,
        moe_router_enable_expert_bias=not greedy, moe_router_topk_scaling_factor=spec.routed_scaling_factor,
        **_cpu_config(**_moe_config(spec.num_experts, spec.num_experts_per_tok, spec.moe_mlp_dim)),
    )
    block = (te_structured or gpt_layer_specs).get_gpt_decoder_block_spec(
        cfg, use_transformer_engine=te_structured is not None, normalization="RMSNorm")
    for layer_spec in block.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    return GPTModel(
        cfg, block, vocab_size=MegatronLayout(spec="local").padded_vocab_size(spec.vocab_size), max_sequence_length=64,
        position_embedding_type="rope", share_embeddings_and_output_weights=spec.tie_word_embeddings,
    ).eval()


def _sliding_window_mask_on_cpu(sq, skv, window_size):
    """megatron.core.transformer.utils.get_sliding_window_causal_mask of 0.16.1, without its `device="cuda"`."""
    m = torch.ones(sq, skv, dtype=torch.bool)
    return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])


def gpt_oss_model(spec, monkeypatch, te_structured=None):
    """Megatron-Core 0.16.1's GPTModel for gpt-oss, configured from the args maxckpt writes to common.pt:
    q/k/v/o and expert biases, router bias, learnable softmax offsets (sinks), a window on every other layer,
    quick-GeGLU with +1 offset and clamp, YaRN positions."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core.activations import quick_gelu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from maxckpt.formats.megatron.args import megatron_args
    from maxckpt.formats.megatron.layout import MegatronLayout

    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    monkeypatch.setattr(fused_softmax, "get_sliding_window_causal_mask", _sliding_window_mask_on_cpu)
    a = megatron_args(spec, MegatronLayout(spec="local"))
    assert a.quick_geglu and a.softmax_type == "learnable" and a.position_embedding_type == "yarn"
    cfg = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups, kv_channels=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size,
        gated_linear_unit=True, activation_func=quick_gelu, glu_linear_offset=a.glu_linear_offset,
        activation_func_clamp_value=a.activation_func_clamp_value,
        layernorm_epsilon=a.norm_epsilon, add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias,
        softmax_type=a.softmax_type, window_size=a.window_size, window_attn_skip_freq=a.window_attn_skip_freq,
        bias_activation_fusion=False, moe_router_pre_softmax=False,
        **_cpu_config(**_moe_config(a.num_experts, a.moe_router_topk, a.moe_ffn_hidden_size)),
    )
    for key, value in vars(a).items():  # GPTModel reads the YaRN settings as config attributes (yarn_*)
        if key.startswith("yarn_"):
            setattr(cfg, key, value)
    return GPTModel(
        cfg, _layer_spec(spec, te_structured, num_experts=a.num_experts),
        vocab_size=a.padded_vocab_size, max_sequence_length=256, position_embedding_type="yarn",
        rotary_base=a.rotary_base, share_embeddings_and_output_weights=False,
    ).eval()
