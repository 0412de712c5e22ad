"""Mixtral: llama attention with softmax top-2 routing over experts named block_sparse_moe.experts.{e}.w1/w3/w2."""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.base import MOE_BRIDGES
from maxckpt.families.mistral import FAMILY as MISTRAL

# Mistral's attention, rope and tokens; its own HF model type, MaxText names and experts.
FAMILY = replace(
    MISTRAL,
    name="mixtral",
    hf_model_type="mixtral",
    hf_architecture="MixtralForCausalLM",
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
