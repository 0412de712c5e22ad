"""DeepSeek-V3.2: DeepSeek-V3 (MLA with a query LoRA, YaRN, three leading dense layers, sigmoid routing with a
bias, a shared expert) plus the sparse-attention indexer (DSA) in every layer's attention.

The indexer (`self_attention/indexer/{wq_b, wk, k_norm, weights_proj}` in MaxText, `self_attn.indexer.*` in HF
deepseek_v32) scores keys for each query from the query LoRA's output and keeps indexer_topk of them; its
k_norm is a LayerNorm (scale and bias). Its rope is rotate-half over the first qk_rope_head_dim features on both
sides, so its kernels copy as they are. The routing bias is the `nnx_aux` MoEBiasVar, as for deepseek3 (MaxText
0.2.5's own HF export drops it and writes n_group 8).
"""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family
from maxckpt.families.deepseek3 import DEEPSEEK_YARN
from maxckpt.families.deepseek3 import FAMILY as DEEPSEEK3


FAMILY = Family(
    name="deepseek3.2",
    hf_model_type="deepseek_v32",
    hf_architecture="DeepseekV32ForCausalLM",
    maxtext_rotary="half",  # MLA's rope pairs are interleaved on both sides (HF rope_interleave): no reordering
    rope_theta=10_000.0,
    rope_scaling=DEEPSEEK_YARN,
    rms_norm_eps=1e-6,
    max_position_embeddings=163840,
    bos_token_id=0,
    eos_token_id=1,
    maxtext_models=("deepseek3.2-671b",),
    hf_config_extra={**DEEPSEEK3.hf_config_extra},
    maxtext_scan="dense_moe",
    maxtext_moe="DeepSeekMoeBlock_0/MoeBlock_0",
    attention="mla",
    hf_experts="per_expert",
    bridges=MOE_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core 0.16.1 has DeepSeek-V3.2's sparse-attention indexer only as an experimental "
                    "attention variant (experimental_attention_variant/dsa.py, whose indexer needs "
                    "fast_hadamard_transform); maxckpt does not map its torch_dist layout yet",
        "torchtitan": "TorchTitan 0.3.0's deepseek_v3 model has no sparse-attention indexer, so DeepSeek-V3.2's "
                      "indexer weights would be lost",
    },
    settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.5, "indexer_topk": 2048},
    hf_num_experts_key="n_routed_experts",
    torchtitan_rotary="half",
    maxtext_decoder_block="deepseek",
    maxtext_settings={**DEEPSEEK3.maxtext_settings, "indexer_topk": ("indexer_topk", None)},
    unshown_settings=(*DEEPSEEK3.unshown_settings, "indexer_topk"),
    tree_markers=(r"(^|/)self_attention/indexer/|\.self_attn\.indexer\.",),
    tree_markers_required=True,
)
