"""Llama 2: MaxText's llama2 decoder block, rotate-half rope (theta 1e4), the query scale folded into the kernel."""

from __future__ import annotations

from maxckpt.families.base import Family

FAMILY = Family(
    name="llama2",
    hf_model_type="llama",
    hf_architecture="LlamaForCausalLM",
    maxtext_query_scale=True,
    rope_theta=10_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    maxtext_models=("llama2-7b", "llama2-13b", "llama2-70b"),
    maxtext_decoder_block="llama2",
    hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
)
