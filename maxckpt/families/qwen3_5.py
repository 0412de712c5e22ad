"""Qwen3.5 (text, MoE): qwen3-next's Gated DeltaNet hybrid, scanned per block position, with multimodal rope.

MaxText's qwen3_5 decoder reuses qwen3-next's layers; a scanned block is `decoder/layers/layer_{j}` (one
subtree per position, each stacked over blocks). HF's model is the text model of Qwen3_5MoeForConditionalGeneration
(`qwen3_5_moe_text`, Qwen3_5MoeForCausalLM), whose Gated DeltaNet splits MaxText's per-key-head-group
in_proj_qkvz / in_proj_ba into head-major in_proj_qkv, in_proj_z, in_proj_b and in_proj_a.
"""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.qwen3_next import FAMILY as QWEN3_NEXT

FAMILY = replace(
    QWEN3_NEXT,
    name="qwen3.5",
    hf_model_type="qwen3_5_moe_text",
    hf_architecture="Qwen3_5MoeForCausalLM",
    hf_wrapper_model_type="qwen3_5_moe",  # the multimodal wrapper: its text model is what maxckpt converts
    bos_token_id=None,  # not stated by MaxText's config; pass --set eos_token_id=N for generation
    eos_token_id=None,
    maxtext_models=("qwen3.5-35b-a3b", "qwen3.5-397b-a17b"),
    hf_config_extra={"attention_bias": False, "router_aux_loss_coef": 0.001, "output_router_logits": False},
    maxtext_hybrid_block="per_layer",
    hf_gdn_projections="split",
    hf_renormalises_topk=True,
    bridge_gaps={
        "megatron": QWEN3_NEXT.bridge_gaps["megatron"],
        "torchtitan": "TorchTitan 0.3.0's qwen3_5 model always builds its vision encoder, which a MaxText "
                      "text run has no weights for",
    },
    maxtext_decoder_block="qwen3_5",
    maxtext_settings={"inhomogeneous_layer_cycle_interval": ("full_attention_interval", None),
                      "partial_rotary_factor": ("partial_rotary_factor", None),
                      "mrope_section": ("mrope_section", None),
                      **{k: (k, None) for k in ("gdn_num_key_heads", "gdn_key_head_dim", "gdn_conv_kernel_dim")}},
    unshown_settings=("num_experts_per_tok", "full_attention_interval", "gdn_num_key_heads", "gdn_key_head_dim",
                      "partial_rotary_factor"),
    settings={"routing": "softmax_topk", "num_experts_per_tok": 8, "norm_topk_prob": True,
              "full_attention_interval": 4, "gdn_num_key_heads": 16, "gdn_num_value_heads": 32,
              "gdn_key_head_dim": 128, "gdn_value_head_dim": 128, "gdn_conv_kernel_dim": 4,
              "partial_rotary_factor": 0.25, "attention_output_gate": True, "norm_plus_one": True,
              "shared_expert_gate": True, "mrope_section": (11, 11, 10)},
    model_settings={"qwen3.5-397b-a17b": {"num_experts_per_tok": 10, "gdn_num_value_heads": 64}},
)
