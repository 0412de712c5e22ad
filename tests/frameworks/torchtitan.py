"""TorchTitan 0.3.0 on CPU for the framework matrix: the models per family, model-only loading, logits.

Each builder takes a ModelSpec and returns TorchTitan's own model for it, built from its model package's
layer builders (`_build_llama3_layers`, `_build_qwen3_layers`, ...), weights initialised by `init_weights`.
Its experts always run in bfloat16; `float32_experts` makes them compute in float32 (the same computation
per expert), so a comparison with transformers checks placement, not bf16 rounding.
"""

from __future__ import annotations

import torch


def load_model_only(model, step_dir):
    """TorchTitan's model-only load (initial_load_model_only): dcp.load into ModelWrapper's state dict.

    dcp.load raises for any model key the checkpoint lacks."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper

    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    wrapper.load_state_dict(state)
    return model.eval()


def model_state(model):
    """What TorchTitan's checkpointer saves of the model (ModelWrapper's state dict), detached."""
    from torchtitan.components.checkpointer.base import ModelWrapper

    return {k: v.detach().clone() for k, v in ModelWrapper(model).state_dict().items()}


def logits(model, tokens):
    """The model's logits for one sequence (FlexAttention's eager CPU path needs a full 128-token block)."""
    assert len(tokens) % 128 == 0, "shorter inputs give garbage on CPU"
    pos = torch.arange(len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), pos, model.get_attention_masks(pos))[0].numpy()


def _built(cfg):
    model = cfg.build()
    model.init_weights(buffer_device=torch.device("cpu"))  # the RoPE cache is a non-persistent buffer
    return model.eval()


def llama3_model(spec, monkeypatch=None):
    """TorchTitan's Llama3Model (llama2, llama3, llama3.1, mistral: the same decoder; llama rope scaling).
    Its builder takes head_dim = dim / n_heads, as in real Llama models."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    assert spec.head_dim * spec.num_heads == spec.emb_dim
    dim, vocab = spec.emb_dim, spec.vocab_size
    scaling = dict(spec.rope_scaling or {})
    rope = ComplexRoPE.Config(
        dim=spec.head_dim, max_seq_len=256, theta=spec.rope_theta,
        **({"scaling": "llama", "scaling_factor": scaling["factor"], "low_freq_factor": scaling["low_freq_factor"],
            "high_freq_factor": scaling["high_freq_factor"],
            "original_max_position_embeddings": scaling["original_max_position_embeddings"]} if scaling else {}),
    )
    return _built(Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=spec.tie_word_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=spec.num_layers, dim=dim, n_heads=spec.num_heads,
            n_kv_heads=spec.num_kv_heads, hidden_dim=spec.mlp_dim, attn_backend="flex", rope=rope,
        ),
    ))


def _qwen3(spec, layers):
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.qwen3 import Qwen3Model

    dim, vocab = spec.emb_dim, spec.vocab_size
    model = Qwen3Model.Config(
        vocab_size=vocab, dim=dim, enable_weight_tying=spec.tie_word_embeddings,
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab), layers=layers,
    )
    return _built(model)


def _cos_sin_rope(spec):
    from torchtitan.models.common import CosSinRoPE

    return CosSinRoPE.Config(dim=spec.head_dim, max_seq_len=256, theta=spec.rope_theta)


def qwen3_model(spec, monkeypatch=None):
    """TorchTitan's dense Qwen 3 model (q/k norms, rotate-half rope, head_dim independent of dim)."""
    from torchtitan.models.qwen3 import _build_qwen3_layers

    return _qwen3(spec, _build_qwen3_layers(
        fuse_qkv=True, n_layers=spec.num_layers, dim=spec.emb_dim, n_heads=spec.num_heads,
        n_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, hidden_dim=spec.mlp_dim, attn_backend="flex",
        rope=_cos_sin_rope(spec),
    ))


def qwen3_moe_model(spec, monkeypatch):
    """TorchTitan's Qwen 3 MoE model; its experts compute in float32 (`float32_experts`)."""
    from torchtitan.models.common.moe import GroupedExperts
    from torchtitan.models.qwen3 import _build_qwen3_moe_layers

    monkeypatch.setattr(GroupedExperts, "forward", float32_experts)
    return _qwen3(spec, _build_qwen3_moe_layers(
        fuse_qkv=True, n_layers=spec.num_layers, dim=spec.emb_dim, n_heads=spec.num_heads,
        n_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, moe_hidden_dim=spec.moe_mlp_dim,
        num_experts=spec.num_experts, top_k=spec.num_experts_per_tok, attn_backend="flex",
        moe_comm_backend="standard", rope=_cos_sin_rope(spec),
    ))


def deepseek_model(spec, monkeypatch):
    """TorchTitan's DeepSeek V3 model for `spec` (MLA, YaRN, sigmoid routing with bias; or DeepSeek-V2's one query
    projection and softmax routing, not renormalised)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.moe import GroupedExperts
    from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers

    monkeypatch.setattr(GroupedExperts, "forward", float32_experts)
    yarn = dict(spec.rope_scaling)
    layers = _build_dsv3_layers(
        n_layers=spec.num_layers, n_dense_layers=spec.first_dense_layers, dim=spec.emb_dim, n_heads=spec.num_heads,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, mscale=yarn["mscale_all_dim"],
        dense_hidden_dim=spec.mlp_dim, moe_hidden_dim=spec.moe_mlp_dim, num_experts=spec.num_experts,
        num_shared_experts=spec.num_shared_experts, router_top_k=spec.num_experts_per_tok, router_score_func="softmax" if spec.routing == "softmax_greedy" else "sigmoid",
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
    return _built(DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim, tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=dim, out_features=vocab), layers=layers, mtp_layers=[],
    ))


def gpt_oss_model(spec, monkeypatch):
    """TorchTitan's gpt_oss model for `spec`: its own attention/expert config builders, stock balancing;
    its experts compute in float32 (`float32_gpt_oss_experts`)."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.moe import TokenChoiceTopKRouter
    from torchtitan.models.gpt_oss import GptOssModel, _make_gptoss_attn_config, _make_gptoss_experts_config
    from torchtitan.models.gpt_oss.model import GptOssTransformerBlock
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts, GptOssMoE

    monkeypatch.setattr(GptOssGroupedExperts, "forward", float32_gpt_oss_experts)
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
    return _built(GptOssModel.Config(
        dim=E, vocab_size=spec.vocab_size, tok_embeddings=Embedding.Config(num_embeddings=spec.vocab_size, embedding_dim=E),
        norm=RMSNorm.Config(normalized_shape=E, eps=spec.rms_norm_eps),
        lm_head=Linear.Config(in_features=E, out_features=spec.vocab_size), layers=layers))


def layer(model, i: int):
    return model.layers[str(i)] if isinstance(model.layers, torch.nn.ModuleDict) else model.layers[i]


def assert_gpt_oss_matches_transformers(model, hf, spec):
    """TorchTitan's gpt_oss attention needs a compiled FlexAttention with LSE, which CPU torch cannot build:
    each layer's MoE block computes what transformers' does, and the sinks and q/k/v (with biases) are its."""
    from torchtitan.components.checkpointer.base import ModelWrapper

    x = torch.randn(1, 16, spec.emb_dim, generator=torch.Generator().manual_seed(0))
    loaded = ModelWrapper(model).state_dict()
    for i in range(spec.num_layers):
        with torch.no_grad():
            ours = layer(model, i).moe(x)
            theirs = hf.model.layers[i].mlp(x)
            theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        assert (ours - theirs).abs().max().item() < 1e-5, i
        tt_attn, hf_attn = layer(model, i).attention, hf.model.layers[i].self_attn
        assert torch.equal(tt_attn.sinks, hf_attn.sinks)
        # TorchTitan fuses q, k, v into one linear grouped per kv head; its state dict splits them back.
        for p in "qkv":
            assert torch.equal(loaded[f"layers.{i}.attention.qkv_linear.w{p}.weight"], getattr(hf_attn, f"{p}_proj").weight)
            assert torch.equal(loaded[f"layers.{i}.attention.qkv_linear.w{p}.bias"], getattr(hf_attn, f"{p}_proj").bias)


def float32_experts(self, x_RD, num_tokens_per_expert_E):
    """GroupedExperts.forward of torchtitan 0.3.0, in float32 (it casts to bfloat16 unconditionally).

    The same computation per expert, on the tokens routed to it (rows grouped by expert, as its grouped
    GEMM takes them)."""
    out, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        x = x_RD[start : start + n].float()
        h = torch.nn.functional.silu(x @ self.w1_EFD[e].float().T) * (x @ self.w3_EFD[e].float().T)
        out.append(h @ self.w2_EDF[e].float().T)
        start += n
    return torch.cat(out + [x_RD.new_zeros(x_RD.shape[0] - start, x_RD.shape[1])]).type_as(x_RD)


def float32_gpt_oss_experts(self, x_RD, num_tokens_per_expert_E):
    """torchtitan 0.3.0's GptOssGroupedExperts.forward in float32 (it casts to bfloat16), with its own swiglu."""
    from torchtitan.models.gpt_oss.moe import swiglu

    out, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        x = x_RD[start : start + n].float()
        h = swiglu(x @ self.mlp1_weight_EGD[e].float().T + self.mlp1_bias_EG[e].float(), limit=self.swiglu_limit)
        out.append(h @ self.mlp2_weight_EDF[e].float().T + self.mlp2_bias_ED[e].float())
        start += n
    return torch.cat(out + [x_RD.new_zeros(x_RD.shape[0] - start, x_RD.shape[1])]).type_as(x_RD)
