"""Qwen3.5 (text, MoE): qwen3-next's Gated DeltaNet hybrid, scanned per block position, with multimodal rope.

MaxText's qwen3_5 decoder reuses qwen3-next's layers; a scanned block is `decoder/layers/layer_{j}` (one
subtree per position, each stacked over blocks). HF's model is the text model of Qwen3_5MoeForConditionalGeneration
(`qwen3_5_moe_text`, Qwen3_5MoeForCausalLM), whose Gated DeltaNet splits MaxText's per-key-head-group
in_proj_qkvz / in_proj_ba into head-major in_proj_qkv, in_proj_z, in_proj_b and in_proj_a.
"""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family

FAMILY = Family(
    name="qwen3.5",
    hf_model_type="qwen3_5_moe_text",
    hf_architecture="Qwen3_5MoeForCausalLM",
    hf_wrapper_model_type="qwen3_5_moe",  # the multimodal wrapper: its text model is what maxckpt converts
    qk_norm=True,
    rope_theta=10_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    bos_token_id=None,  # not stated by MaxText's config; pass --set eos_token_id=N for generation
    eos_token_id=None,
    maxtext_models=("qwen3.5-35b-a3b", "qwen3.5-397b-a17b"),
    hf_config_extra={"attention_bias": False, "router_aux_loss_coef": 0.001, "output_router_logits": False},
    hf_layer_types=True,
    maxtext_scan="hybrid",
    maxtext_hybrid_block="per_layer",
    hf_gdn_projections="split",
    hf_renormalises_topk=True,
    maxtext_attention="attention/attention",
    maxtext_linear_attention="attention",
    maxtext_layer_norms=("input_layernorm", "post_attention_layernorm"),
    maxtext_moe="mlp/routed_experts",
    maxtext_shared_experts="mlp/shared_expert",
    hf_shared_experts="shared_expert",
    hf_experts="per_expert",
    hf_linear_router="mlp.gate",
    hf_num_experts_key="num_experts",
    hf_intermediate_size="unused",
    bridges=MOE_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core 0.16.1 has these layers only as an experimental attention variant "
                    "(ssm/gated_delta_net.py, which needs flash-linear-attention); maxckpt does not map its "
                    "torch_dist layout yet",
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
