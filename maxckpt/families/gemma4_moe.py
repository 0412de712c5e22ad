"""Gemma 4 MoE (text; 26b): Gemma 4's layers (gemma4.py) with a dense MLP and routed experts side by side.

MaxText 0.2.5's `Gemma4MoE` (models/gemma4.py) and transformers' Gemma4TextDecoderLayer (enable_moe_block)
agree: the dense MLP (MaxText `mlp/moe_block/shared_experts`, HF `mlp`, width intermediate_size) runs on the
pre-ffw norm and gets post_feedforward_layernorm_1; the experts (HF `experts.gate_up_proj` [X, 2M, E] and
`experts.down_proj` [X, E, M], packed) run on pre_feedforward_layernorm_2 of the residual stream and get
post_feedforward_layernorm_2; the router (`router.proj`, `router.scale` = MaxText `pre_forward_scale_2`,
`router.per_expert_scale`) sees the scale-free norm of the residual stream times emb**-0.5 times its scale,
takes the softmax over all experts, the top-k, renormalised, times each chosen expert's scale.
"""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.base import MOE_BRIDGES
from maxckpt.families.gemma4 import FAMILY as GEMMA4

FAMILY = replace(
    GEMMA4,
    name="gemma4-moe",
    maxtext_models=("gemma4-26b",),
    maxtext_moe="mlp/moe_block/MoeBlock_0",
    hf_experts="packed_parallel",
    hf_num_experts_key="num_experts",
    bridges=MOE_BRIDGES,
    bridge_gaps={
        "megatron": GEMMA4.bridge_gaps["megatron"] + "; nor a dense MLP beside routed experts",
        "torchtitan": GEMMA4.bridge_gaps["torchtitan"],
    },
    settings={**GEMMA4.settings, "routing": "softmax_topk", "norm_topk_prob": True, "num_experts_per_tok": 8},
)
