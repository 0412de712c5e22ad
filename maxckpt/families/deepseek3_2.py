"""DeepSeek-V3.2: DeepSeek-V3 (MLA with a query LoRA, YaRN, three leading dense layers, sigmoid routing with a
bias, a shared expert) plus the sparse-attention indexer (DSA) in every layer's attention.

The indexer (`self_attention/indexer/{wq_b, wk, k_norm, weights_proj}` in MaxText, `self_attn.indexer.*` in HF
deepseek_v32) scores keys for each query from the query LoRA's output and keeps indexer_topk of them; its
k_norm is a LayerNorm (scale and bias). Its rope is rotate-half over the first qk_rope_head_dim features on both
sides, so its kernels copy as they are. The routing bias is the `nnx_aux` MoEBiasVar, as for deepseek3 (MaxText
0.2.5's own HF export drops it and writes n_group 8).
"""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.tables.megatron import STACKED
from maxckpt.families.base import MOE_BRIDGES
from maxckpt.families.deepseek3 import FAMILY as DEEPSEEK3


FAMILY = replace(
    DEEPSEEK3,
    name="deepseek3.2",
    hf_model_type="deepseek_v32",
    hf_architecture="DeepseekV32ForCausalLM",
    maxtext_models=("deepseek3.2-671b",),
    bridges=MOE_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core 0.16.1 has DeepSeek-V3.2's sparse-attention indexer only as an experimental "
                    "attention variant (experimental_attention_variant/dsa.py, whose indexer needs "
                    "fast_hadamard_transform); maxckpt does not map its torch_dist layout yet",
        "torchtitan": "TorchTitan 0.3.0's deepseek_v3 model has no sparse-attention indexer, so DeepSeek-V3.2's "
                      "indexer weights would be lost",
    },
    # No TorchTitan or Megatron bridge: nothing of deepseek3's layout there is this family's.
    torchtitan_model=None,
    megatron_table=STACKED,
    settings={"routing": "sigmoid_bias", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.5, "indexer_topk": 2048},
    maxtext_settings={**DEEPSEEK3.maxtext_settings, "indexer_topk": ("indexer_topk", None)},
    unshown_settings=(*DEEPSEEK3.unshown_settings, "indexer_topk"),
    tree_markers=(r"(^|/)self_attention/indexer/|\.self_attn\.indexer\.",),
    tree_markers_required=True,
)
