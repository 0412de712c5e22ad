"""Kimi-K2: the DeepSeek-V3 architecture (MLA, one leading dense layer, sigmoid routing with a bias, a shared
expert) with its own rope (theta 5e4, YaRN factor 32, beta 1 / 1) and routed scaling 2.827.

MaxText trains it with the deepseek decoder block, so its tree is deepseek3's; HF has no model type of its own
for it (Moonshot's checkpoints say `deepseek_v3`), so a config.json is read as kimi-k2 by its rope theta (the
largest family theta not above the config's), or by `--model kimi-k2-1t`.
"""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.base import MOE_BRIDGES
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

FAMILY = replace(
    DEEPSEEK3,
    name="kimi-k2",
    rope_theta=50_000.0,
    rope_scaling=KIMI_YARN,
    max_position_embeddings=131072,
    bos_token_id=163584,
    eos_token_id=163585,
    maxtext_models=("kimi-k2-1t",),
    bridges=MOE_BRIDGES + ("torchtitan",),
    bridge_gaps={"megatron": "Kimi-K2's YaRN has beta_fast 1 (and beta_slow 1), but Megatron-LM takes no flag for "
                             "beta_fast or beta_slow and Megatron-Core 0.16's MLATransformerConfig defaults them to "
                             "32 and 1, so a Megatron-LM run would rebuild other rotary frequencies"},
    settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.827},
)
