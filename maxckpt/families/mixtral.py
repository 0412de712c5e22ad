"""Mixtral: llama attention with softmax top-2 routing over experts named block_sparse_moe.experts.{e}.w1/w3/w2."""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family

FAMILY = Family(
    name="mixtral",
    hf_model_type="mixtral",
    hf_architecture="MixtralForCausalLM",
    maxtext_rotary="half",
    maxtext_query_scale=True,
    qk_norm=False,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=32768,
    bos_token_id=1,
    eos_token_id=2,
    maxtext_models=("mixtral-8x7b", "mixtral-8x22b"),
    hf_config_extra={"sliding_window": None, "router_jitter_noise": 0.0, "router_aux_loss_coef": 0.02,
                     "output_router_logits": False},
    maxtext_moe="MoeBlock_0",
    hf_experts="per_expert",
    hf_expert_block="block_sparse_moe",
    hf_expert_projections=("w1", "w3", "w2"),
    hf_linear_router="block_sparse_moe.gate",
    bridges=MOE_BRIDGES + ("megatron",),
    bridge_gaps={"torchtitan": "TorchTitan 0.3.0 ships no such model"},
    settings={"routing": "softmax_topk", "num_experts_per_tok": 2, "norm_topk_prob": True},
    model_settings={"mixtral-8x22b": {"max_position_embeddings": 65536}},
    hf_num_experts_key="num_local_experts",
    hf_intermediate_size="expert",
    maxtext_decoder_block="mixtral",
    unshown_settings=("num_experts_per_tok",),
)
