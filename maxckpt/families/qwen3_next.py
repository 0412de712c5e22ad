"""Qwen3-Next: Gated DeltaNet layers with a gated full-attention layer every 4, MoE with a gated shared expert.

MaxText scans one block of `inhomogeneous_layer_cycle_interval` layers: the Gated DeltaNet layers under
`decoder/layers/local_layers` (stacked on the block axis and then on the layer-in-block axis), the full
attention layer under `decoder/layers/global_layer`. Decoder norms are (1 + scale) on both sides; the
query kernel holds query and output gate per head; rope covers the first quarter of each head.
"""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family

FAMILY = Family(
    name="qwen3-next",
    hf_model_type="qwen3_next",
    hf_architecture="Qwen3NextForCausalLM",
    qk_norm=True,
    rope_theta=10_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    bos_token_id=151643,
    eos_token_id=151645,
    maxtext_models=("qwen3-next-80b-a3b",),
    hf_config_extra={"attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                     "router_aux_loss_coef": 0.001, "output_router_logits": False},
    hf_layer_types=True,
    maxtext_scan="hybrid",
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
        "torchtitan": "TorchTitan 0.3.0 ships no qwen3-next model (no Gated DeltaNet layers)",
    },
    maxtext_decoder_block="qwen3_next",
    maxtext_settings={"inhomogeneous_layer_cycle_interval": ("full_attention_interval", None),
                      "partial_rotary_factor": ("partial_rotary_factor", None),
                      "norm_topk_prob": ("norm_topk_prob", None),
                      **{k: (k, None) for k in ("gdn_num_key_heads", "gdn_key_head_dim", "gdn_conv_kernel_dim")}},
    unshown_settings=("num_experts_per_tok", "norm_topk_prob", "full_attention_interval", "gdn_num_key_heads",
                      "gdn_key_head_dim", "partial_rotary_factor"),
    settings={"routing": "softmax_topk", "num_experts_per_tok": 10, "norm_topk_prob": True,
              "full_attention_interval": 4, "gdn_num_key_heads": 16, "gdn_num_value_heads": 32,
              "gdn_key_head_dim": 128, "gdn_value_head_dim": 128, "gdn_conv_kernel_dim": 4,
              "partial_rotary_factor": 0.25, "attention_output_gate": True, "norm_plus_one": True,
              "shared_expert_gate": True},
)
