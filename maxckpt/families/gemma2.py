"""Gemma 2: (local, global) layer pairs, logit softcaps, sandwich norms, (1 + w) norms, a scaled embedding."""

from __future__ import annotations

from maxckpt.families.base import DENSE_ONLY_HF_BRIDGES, Family

FAMILY = Family(
    name="gemma2",
    hf_model_type="gemma2",
    hf_architecture="Gemma2ForCausalLM",
    maxtext_query_scale=True,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=8192,
    bos_token_id=2,
    eos_token_id=1,
    maxtext_models=("gemma2-2b", "gemma2-9b", "gemma2-27b"),
    hf_config_extra={"attention_bias": False, "pad_token_id": 0},
    hf_layer_types=True,
    maxtext_scan="pairs",
    maxtext_decoder_block="gemma2",
    maxtext_settings={"sliding_window_size": ("sliding_window", 0), "attn_logits_soft_cap": ("attn_logit_softcap", 0.0),
                      "final_logits_soft_cap": ("final_logit_softcap", 0.0)},
    unshown_settings=("sliding_window", "attn_logit_softcap", "final_logit_softcap"),
    bridges=DENSE_ONLY_HF_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core's GPT model has no logit softcapping, Gemma sandwich norms or (1 + w) norms",
        "torchtitan": "TorchTitan 0.3.0 ships no such model",
    },
    settings={"attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "sliding_window": 4096,
              "sliding_window_pattern": 2, "norm_offset": 1.0, "sandwich_norms": True,
              "maxtext_embedding_scaled": True, "activation": "gelu_tanh"},
    # HF gemma-2-27b scales queries by (emb/heads)**-0.5 = 144**-0.5, not head_dim**-0.5.
    model_settings={"gemma2-27b": {"query_pre_attn_scalar": 144.0}},
)
