"""Megatron-Core GPT `torch_dist` tensor names: the suffixes after `decoder.layers.[i.]` and the globals.

Plain data shared by the layout, the TE-vs-local naming and the support checks, so none of them
imports another for a string. Stacked keys carry a leading `[L]` axis; per-layer keys an index.
"""

from __future__ import annotations

# Attention and dense MLP (stacked or per layer).
QKV = "self_attention.linear_qkv.weight"
PROJ = "self_attention.linear_proj.weight"
FC1 = "mlp.linear_fc1.weight"
FC2 = "mlp.linear_fc2.weight"
# Norms: the Transformer-Engine names (fused into the following linear) and the local spec's modules.
IN_NORM_TE = "self_attention.linear_qkv.layer_norm_weight"
IN_NORM_LOCAL = "input_layernorm.weight"
MLP_NORM_TE = "mlp.linear_fc1.layer_norm_weight"
MLP_NORM_LOCAL = "pre_mlp_layernorm.weight"
Q_NORM = "self_attention.q_layernorm.weight"
K_NORM = "self_attention.k_layernorm.weight"
# MoE layers (SequentialMLP's torch_dist keys, which (TE)GroupedMLP shares): router [L, X, E], experts [L, X, ...].
ROUTER = "mlp.router.weight"
EXP_FC1 = "mlp.experts.experts.linear_fc1.weight"
EXP_FC2 = "mlp.experts.experts.linear_fc2.weight"
EXP_MODULES = ("mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2")
# gpt-oss (`--add-qkv-bias`, bias linears, `--softmax-type learnable`): stacked like the rest.
QKV_BIAS = "self_attention.linear_qkv.bias"
PROJ_BIAS = "self_attention.linear_proj.bias"
SINKS = "self_attention.core_attention.softmax_offset"  # HF self_attn.sinks: the learned extra logit per head
ROUTER_BIAS = "mlp.router.bias"
EXP_FC1_BIAS = "mlp.experts.experts.linear_fc1.bias"
EXP_FC2_BIAS = "mlp.experts.experts.linear_fc2.bias"
# Globals.
EMBED = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"

# DeepSeek-V3 layers (MLA, dense leading layers, shared experts, routing bias) as Megatron-Core 0.16.1
# keys them with the local spec: per layer (`decoder.layers.{i}.` + suffix), checked against a real
# GPTModel built by `get_gpt_decoder_block_spec(MLATransformerConfig(...), use_transformer_engine=False)`
# and saved by `dist_checkpointing.save`. Megatron suffix -> HF suffix; MLA's projections keep HF's shapes
# and row order (q_b rows per head [nope | rope], kv_a rows [kv_lora | rope], kv_b rows per head [k_nope | v]).
MLA_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
# MLA's query LoRA; without one (DeepSeek-V2-Lite, q_lora_rank None) Megatron-Core builds one linear_q_proj.
MLA_Q_LORA = ("self_attention.linear_q_down_proj.weight", "self_attention.q_layernorm.weight",
              "self_attention.linear_q_up_proj.weight")
MLA_Q_PROJ = {"self_attention.linear_q_proj.weight": "self_attn.q_proj.weight"}
EXPERT_BIAS = "mlp.router.expert_bias"
SHARED_FC1 = "mlp.shared_experts.linear_fc1.weight"
SHARED_FC2 = "mlp.shared_experts.linear_fc2.weight"

# One per-layer mapping entry: (Megatron suffix, how, HF suffixes). How: "same" (one tensor, same
# shape), "gate_up" ([gate; up] rows), "experts_gate_up" ([X, 2M, E] of per-expert gate/up, `{e}` in the
# HF names), "experts" ([X, ...] of one per-expert tensor).
Entry = tuple[str, str, tuple[str, ...]]
