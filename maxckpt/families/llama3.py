"""Llama 3: llama2's block and layout, rope theta 5e5, no rope scaling.

MaxText 0.2.5 runs llama3.3-70b this way too: its yml sets no rope_type and its name does not start with
"llama3.1", so `attentions.py` gives it the default rotate-half RotaryEmbedding without llama3 scaling
(HF's Llama-3.3-70B has the scaling; a MaxText run of it computes without)."""

from __future__ import annotations

from maxckpt.families.base import Family

FAMILY = Family(
    name="llama3",
    hf_model_type="llama",
    hf_architecture="LlamaForCausalLM",
    maxtext_query_scale=True,
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
    bos_token_id=128000,
    eos_token_id=128001,
    maxtext_models=("llama3-8b", "llama3-70b", "llama3-405b", "llama3.3-70b"),
    hf_config_extra={"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
)
