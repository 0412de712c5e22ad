"""Llama 3.1: MaxText's interleaved rotary features and llama3 rope scaling (MaxText's llama3.3-70b is llama3's)."""

from __future__ import annotations

from maxckpt.families.base import LLAMA3_ROPE_SCALING, Family

FAMILY = Family(
    name="llama3.1",
    hf_model_type="llama",
    hf_architecture="LlamaForCausalLM",
    maxtext_rotary="interleaved",
    maxtext_query_scale=True,
    rope_theta=500_000.0,
    rope_scaling=LLAMA3_ROPE_SCALING,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_id=128001,
    maxtext_models=("llama3.1-8b", "llama3.1-70b", "llama3.1-405b"),
    # MaxText's llama3.1 is the llama2 block with its interleaved, scaled rope
    maxtext_decoder_block="llama2",
    maxtext_rope_type="llama3.1",
    hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
)
