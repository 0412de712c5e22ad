"""Qwen 3 MoE: qwen3's attention (q/k norms) with softmax top-k routing, every layer MoE."""

from __future__ import annotations

from maxckpt.families.base import MOE_BRIDGES, Family

FAMILY = Family(
    name="qwen3-moe",
    hf_model_type="qwen3_moe",
    hf_architecture="Qwen3MoeForCausalLM",
    qk_norm=True,
    rope_theta=10_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    bos_token_id=151643,
    eos_token_id=151645,
    maxtext_models=("qwen3-30b-a3b", "qwen3-30b-a3b-base", "qwen3-235b-a22b", "qwen3-480b-a35b"),
    # rope theta as each MaxText 0.2.5 yml sets it (the family's 1e7 is qwen3-30b-a3b's and qwen3-480b-a35b's)
    model_settings={"qwen3-30b-a3b-base": {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768},
                    "qwen3-235b-a22b": {"rope_theta": 5_000_000.0}},
    hf_config_extra={"attention_bias": False, "sliding_window": None, "use_sliding_window": False,
                     "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
                     "output_router_logits": False},
    hf_num_layers_keys=("max_window_layers",),
    maxtext_moe="moe_block",
    hf_experts="per_expert",
    hf_linear_router="mlp.gate",
    bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
    settings={"routing": "softmax_topk", "num_experts_per_tok": 8, "norm_topk_prob": True},
    hf_num_experts_key="num_experts",
    hf_intermediate_size="unused",
    torchtitan_rotary="half",
    torchtitan_model="qwen3 MoE",
    maxtext_decoder_block="qwen3_moe",
    maxtext_settings={"norm_topk_prob": ("norm_topk_prob", None)},
    unshown_settings=("num_experts_per_tok", "norm_topk_prob"),
)
