"""DeepSeek-V3: multi-latent attention, YaRN, leading dense layers then MoE layers with shared experts."""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.families.tables.megatron import MLA
from maxckpt.families.base import MOE_BRIDGES, Family

DEEPSEEK_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "truncate": True,
}

FAMILY = Family(
    name="deepseek3",
    hf_model_type="deepseek_v3",
    hf_architecture="DeepseekV3ForCausalLM",
    maxtext_rotary="half",  # MLA's rope pairs are interleaved on both sides (HF rope_interleave): no reordering
    rope_theta=10_000.0,
    rope_scaling=DEEPSEEK_YARN,
    rms_norm_eps=1e-6,
    max_position_embeddings=163840,
    bos_token_id=0,
    eos_token_id=1,
    maxtext_models=("deepseek3-671b",),
    hf_config_extra={"attention_bias": False, "rope_interleave": True, "scoring_func": "sigmoid",
                     "topk_method": "noaux_tc", "moe_layer_freq": 1,
                     "ep_size": 1, "num_nextn_predict_layers": 0, "pretraining_tp": 1},
    maxtext_scan="dense_moe",
    maxtext_moe="DeepSeekMoeBlock_0/MoeBlock_0",
    attention="mla",
    hf_experts="per_expert",
    bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
    megatron_table=MLA,
    settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.5},
    hf_num_experts_key="n_routed_experts",
    torchtitan_rotary="half",
    torchtitan_model="deepseek_v3",
    maxtext_decoder_block="deepseek",
    maxtext_settings={"n_routing_groups": ("n_group", -1), "topk_routing_group": ("topk_group", -1),
                      "routed_scaling_factor": ("routed_scaling_factor", None)},
    unshown_settings=("num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor"),
)
