"""Gemma 3 (text): blocks of 6 layers, q/k norms, two rope thetas, sandwich norms, (1 + w) norms."""

from __future__ import annotations

from maxckpt.families.base import DENSE_ONLY_HF_BRIDGES, Family

FAMILY = Family(
    name="gemma3",
    hf_model_type="gemma3_text",
    hf_architecture="Gemma3ForCausalLM",
    hf_wrapper_model_type="gemma3",  # the multimodal wrapper: its text model is what maxckpt converts
    qk_norm=True,
    rope_theta=1_000_000.0,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
    rms_norm_eps=1e-6,
    max_position_embeddings=131072,
    bos_token_id=2,
    eos_token_id=1,
    maxtext_models=("gemma3-4b", "gemma3-12b", "gemma3-27b"),
    hf_config_extra={"attention_bias": False, "pad_token_id": 0, "attn_logit_softcapping": None,
                     "final_logit_softcapping": None},
    hf_layer_types=True,
    maxtext_scan="blocks",
    bridges=DENSE_ONLY_HF_BRIDGES,
    maxtext_decoder_block="gemma3",
    maxtext_settings={"sliding_window_size": ("sliding_window", 0),
                      "local_rope_max_timescale": ("local_rope_theta", -1)},
    unshown_settings=("sliding_window", "local_rope_theta"),
    bridge_gaps={
        "megatron": "Megatron-Core's GPT model has no logit softcapping, Gemma sandwich norms or (1 + w) norms",
        "torchtitan": "TorchTitan 0.3.0 ships no such model",
    },
    settings={"sliding_window": 1024, "sliding_window_pattern": 6, "local_rope_theta": 10_000.0,
              "norm_offset": 1.0, "sandwich_norms": True, "maxtext_embedding_scaled": True,
              "activation": "gelu_tanh"},
    # MaxText's get_query_pre_attn_scalar and HF gemma-3-27b: queries scaled by (emb/heads)**-0.5
    # = 168**-0.5, not head_dim**-0.5.
    model_settings={"gemma3-27b": {"query_pre_attn_scalar": 168.0}},
)
