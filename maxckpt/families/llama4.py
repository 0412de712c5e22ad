"""Llama 4 (text): NoPE layers, chunked attention, interleaved MoE layers with a shared expert, top-1 sigmoid routing.

MaxText 0.2.5's `llama4` decoder block (`models/llama4.py`, `layers/attentions.py`, `layers/moe.py`):

- layer i has no rope iff (i + 1) % nope_layer_interval == 0 (a NoPE layer, global attention, queries
  temperature-tuned by log(floor((pos + 1) / 8192) + 1) * 0.1 + 1, which is 1 below 8192 tokens); the others
  rope (MaxText's llama3.1 `LLaMARotaryEmbedding`: interleaved pairs, llama3 scaling, theta 5e5) and attend
  within chunks of chunk_attn_window_size tokens;
- `use_qk_norm`: a weight-free L2 norm of q and k *after* rope, on rope layers only (17b-16e; 17b-128e has none);
- queries scaled by head_dim**-0.5 at runtime (query_pre_attn_scalar), not folded into the kernel;
- layer i is MoE iff (i + 1) % interleave_moe_layer_step == 0 (`Llama4MoEBlock_0`: routed `MoeBlock_0` plus
  `shared_experts`), else a dense `mlp`; the router takes the top-1 logit, and the chosen expert's *input* is
  scaled by its sigmoid (not the output);
- scanned: one block of inhomogeneous_layer_cycle_interval (4) layers, `decoder/layers/layers_{j}`, stacked
  over blocks (MaxText drops layers past the last whole block, so there is no remainder).

HF's Llama4ForCausalLM (model type `llama4_text`, the text model of the multimodal `llama4`) computes the
same: its complex rope rotates interleaved pairs, as MaxText's does, so q/k rows are copied as they are; its
experts are fused `feed_forward.experts.gate_up_proj [X, emb, 2F]` (gate then up) and `down_proj [X, F, emb]`
(transformers 5.24 has no conversion mapping for llama4: those are the names its files hold).
"""

from __future__ import annotations

from maxckpt.families.base import LLAMA3_ROPE_SCALING, MOE_BRIDGES, Family

FAMILY = Family(
    name="llama4",
    hf_model_type="llama4_text",
    hf_architecture="Llama4ForCausalLM",
    hf_wrapper_model_type="llama4",
    maxtext_rotary="half",  # interleaved on both sides: no reordering (hf_rotary says how to rotate)
    hf_rotary="interleaved",
    maxtext_query_scale=False,
    rope_theta=500_000.0,
    rope_scaling=LLAMA3_ROPE_SCALING,  # MaxText's LLaMARotaryEmbedding: factor 8, low 1, high 4, 8192
    rms_norm_eps=1e-5,
    max_position_embeddings=10485760,
    bos_token_id=200000,
    eos_token_id=[200001, 200007, 200008],
    maxtext_models=("llama4-17b-16e", "llama4-17b-128e"),
    hf_config_extra={"attention_bias": False, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
                     "output_router_logits": False, "floor_scale": 8192, "attn_scale": 0.1},
    maxtext_scan="cycle",
    maxtext_moe="Llama4MoEBlock_0/MoeBlock_0",
    hf_experts="fused_concat",
    hf_expert_block="feed_forward",
    hf_mlp_block="feed_forward",
    hf_shared_experts="shared_expert",
    hf_linear_router="feed_forward.router",
    hf_num_experts_key="num_local_experts",
    hf_intermediate_size="expert",
    bridges=MOE_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core 0.16.1 skips rope per layer (no_rope_freq) and scales the routed experts' input "
                    "(moe_apply_probs_on_input), but its L2 q/k norm (qk_l2_norm) is in every layer's spec, NoPE "
                    "layers included, where llama4 has none, and it has no chunked attention or query temperature "
                    "tuning: the same weights would compute other logits",
        "torchtitan": "TorchTitan 0.3.0 ships no llama4 model (its models: llama3, qwen3, qwen3_5, deepseek_v3, "
                      "gpt_oss, kimi_k2_7, flux, muse_glimmer)",
    },
    settings={"routing": "sigmoid_input", "num_experts_per_tok": 1, "nope_layer_interval": 4,
              "interleave_moe_layer_step": 1, "qk_l2_norm": True, "attention_chunk_size": 8192,
              "attn_temperature_tuning": True, "layer_cycle_interval": 4},
    model_settings={"llama4-17b-128e": {"qk_l2_norm": False, "rope_scaling": None, "interleave_moe_layer_step": 2,
                                        "max_position_embeddings": 1048576}},
    maxtext_decoder_block="llama4",
    maxtext_settings={"nope_layer_interval": ("nope_layer_interval", -1),
                      "interleave_moe_layer_step": ("interleave_moe_layer_step", None),
                      "use_qk_norm": ("qk_l2_norm", None),
                      "chunk_attn_window_size": ("attention_chunk_size", 0),
                      "temperature_tuning": ("attn_temperature_tuning", None),
                      "inhomogeneous_layer_cycle_interval": ("layer_cycle_interval", None)},
    unshown_settings=("num_experts_per_tok", "nope_layer_interval", "qk_l2_norm", "attention_chunk_size",
                      "attn_temperature_tuning"),
)
