"""Kimi-K2: the DeepSeek-V3 architecture (MLA, one leading dense layer, sigmoid routing with a bias, a shared
expert) with its own rope (theta 5e4, YaRN factor 32, beta 1 / 1) and routed scaling 2.827.

MaxText trains it with the deepseek decoder block, so its tree is deepseek3's; HF has no model type of its own
for it (Moonshot's checkpoints say `deepseek_v3`), so a config.json is read as kimi-k2 by its rope theta (the
largest family theta not above the config's), or by `--model kimi-k2-1t`.
"""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family
from maxckpt.families.deepseek3 import FAMILY as DEEPSEEK3

# HF Kimi-K2's rope_scaling, as MaxText's kimi-k2-1t.yml states it (rope_factor 32, beta_fast 1, beta_slow 1,
# mscale 1; rope_interleave and rope_truncate from base.yml, true).
KIMI_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "truncate": True,
}

FAMILY = Family(
    name="kimi-k2",
    hf_model_type="deepseek_v3",
    hf_architecture="DeepseekV3ForCausalLM",
    maxtext_rotary="half",  # MLA's rope pairs are interleaved on both sides (HF rope_interleave): no reordering
    rope_theta=50_000.0,
    rope_scaling=KIMI_YARN,
    rms_norm_eps=1e-6,
    max_position_embeddings=131072,
    bos_token_id=163584,
    eos_token_id=163585,
    maxtext_models=("kimi-k2-1t",),
    hf_config_extra=DEEPSEEK3.hf_config_extra,
    maxtext_scan="dense_moe",
    maxtext_moe="DeepSeekMoeBlock_0/MoeBlock_0",
    attention="mla",
    hf_experts="per_expert",
    bridges=MOE_BRIDGES + ("torchtitan",),
    bridge_gaps={"megatron": "Kimi-K2's YaRN has beta_fast 1 (and beta_slow 1), but Megatron-LM takes no flag for "
                             "beta_fast or beta_slow and Megatron-Core 0.16's MLATransformerConfig defaults them to "
                             "32 and 1, so a Megatron-LM run would rebuild other rotary frequencies"},
    megatron_layers="per_layer",
    settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.827},
    hf_num_experts_key="n_routed_experts",
    torchtitan_rotary="half",
    torchtitan_model="deepseek_v3",
    maxtext_decoder_block="deepseek",
    maxtext_settings=DEEPSEEK3.maxtext_settings,
    unshown_settings=DEEPSEEK3.unshown_settings,
)
