"""DeepSeek-V2: multi-latent attention (deepseek2-16b without a query LoRA: one q_proj), YaRN with mscale
0.707, a leading dense layer, then MoE layers with two shared experts and softmax routing.

MaxText 0.2.5 routes deepseek2 as its generic top-k does (`moe.py`, "deepseek2 has a different pattern"): the
softmax over every expert, its top-k probabilities as weights, not renormalised, times routed_scaling_factor;
no routing bias and no expert groups (n_routing_groups is read by the deepseek3 routing only). That is HF
deepseek_v2's `topk_method: greedy`.
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.families.tables.megatron import MLA
from maxckpt.families.base import MOE_BRIDGES, Family

# MaxText's deepseek2 ymls: rope_factor 40, beta_fast 32, mscale 0.707 (HF DeepSeek-V2's mscale and
# mscale_all_dim: the softmax scale gets mscale_all_dim's factor, cos/sin none: rope_attention_scaling false).
DEEPSEEK2_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "truncate": True,
}


FAMILY = Family(
    name="deepseek2",
    hf_model_type="deepseek_v2",
    hf_architecture="DeepseekV2ForCausalLM",
    maxtext_rotary="half",  # MLA's rope pairs are interleaved on both sides (HF's complex rotary): no reordering
    rope_theta=10_000.0,
    rope_scaling=DEEPSEEK2_YARN,
    rms_norm_eps=1e-6,
    max_position_embeddings=163840,
    bos_token_id=100000,
    eos_token_id=100001,
    maxtext_models=("deepseek2-16b", "deepseek2-236b"),
    # rope_interleave: not a deepseek_v2 key (its rotary is always interleaved); the reference forward reads it
    hf_config_extra={"attention_bias": False, "topk_method": "greedy", "scoring_func": "softmax",
                     "rope_interleave": True, "moe_layer_freq": 1, "pretraining_tp": 1},
    maxtext_scan="dense_moe",
    maxtext_moe="DeepSeekMoeBlock_0/MoeBlock_0",
    attention="mla",
    hf_experts="per_expert",
    bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
    megatron_table=MLA,  # Megatron-Core: linear_q_proj (no query LoRA), --moe-router-pre-softmax
    settings={"routing": "softmax_greedy", "num_experts_per_tok": 6, "norm_topk_prob": False,
              "routed_scaling_factor": 1.0},
    model_settings={"deepseek2-236b": {"routed_scaling_factor": 16.0}},
    hf_num_experts_key="n_routed_experts",
    torchtitan_rotary="half",
    torchtitan_model="deepseek_v3",  # TorchTitan's deepseek_v3 builds DeepSeek-V2 too (q_lora_rank 0: `wq`)
    maxtext_decoder_block="deepseek",
    maxtext_settings={"routed_scaling_factor": ("routed_scaling_factor", None)},
    unshown_settings=("num_experts_per_tok", "routed_scaling_factor"),
    # deepseek2-16b's MLA has one query kernel (q_lora_rank 0), which no other DeepSeek tree has
    tree_markers=(r"^decoder/(dense|moe)_layers[^/]*/self_attention/query/kernel$", r"\.self_attn\.q_proj\.weight$"),
)
