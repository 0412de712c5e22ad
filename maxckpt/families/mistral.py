"""Mistral 7B: llama's layout under HF's mistral model type (no sliding window)."""

from __future__ import annotations

from maxckpt.families.base import Family

FAMILY = Family(
    name="mistral",
    hf_model_type="mistral",
    hf_architecture="MistralForCausalLM",
    maxtext_query_scale=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=32768,
    bos_token_id=1,
    eos_token_id=2,
    maxtext_models=("mistral-7b",),
    maxtext_decoder_block="mistral",
    hf_config_extra={"sliding_window": None},
)
