"""Qwen 2.5: the Llama block with q/k/v biases (no output bias), queries scaled at runtime, rope theta 1e6.

MaxText 0.2.5's `qwen2` decoder block (`models/qwen2.py`): `attention_bias: true` gives the query, key and
value projections a bias and the output projection none (`use_bias=False if self.is_qwen2`), and the
query is scaled by head_dim**-0.5 at runtime (`query_pre_attn_scalar`), not folded into its kernel.
HF's Qwen2ForCausalLM has the same biases, hard-coded (its config has no `attention_bias` key).
"""

from __future__ import annotations

from maxckpt.families.base import Family

FAMILY = Family(
    name="qwen2.5",
    hf_model_type="qwen2",
    hf_architecture="Qwen2ForCausalLM",
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151643,
    maxtext_models=("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"),
    hf_config_extra={"sliding_window": None, "use_sliding_window": False},
    hf_num_layers_keys=("max_window_layers",),
    hf_layer_types=True,
    maxtext_decoder_block="qwen2",
    settings={"qkv_bias": True},
    bridges=("maxtext", "hf", "torch", "megatron"),
    # TorchTitan 0.3.0's models: llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7, flux, muse_glimmer;
    # neither its llama3 nor its qwen3 builds q/k/v biases.
    bridge_gaps={"torchtitan": "TorchTitan 0.3.0 ships no such model"},
)
