"""Qwen 3 (dense): q/k norms, queries scaled at runtime, rotate-half rope (theta 1e6)."""

from __future__ import annotations

from maxckpt.families.base import Family

FAMILY = Family(
    name="qwen3",
    hf_model_type="qwen3",
    hf_architecture="Qwen3ForCausalLM",
    qk_norm=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    bos_token_id=151643,
    eos_token_id=151645,
    # MaxText 0.2.5's dense qwen3 decoders (its qwen3-vl-* add a vision tower and multimodal rope: not these)
    maxtext_models=("qwen3-0.6b", "qwen3-1.7b", "qwen3-1.7b-base", "qwen3-4b", "qwen3-4b-base",
                    "qwen3-4b-thinking-2507", "qwen3-8b", "qwen3-8b-base", "qwen3-14b", "qwen3-14b-base",
                    "qwen3-32b"),
    model_settings={"qwen3-4b-thinking-2507": {"rope_theta": 5_000_000.0, "max_position_embeddings": 262144}},
    hf_config_extra={"attention_bias": False, "sliding_window": None, "use_sliding_window": False},
    hf_num_layers_keys=("max_window_layers",),
    hf_layer_types=True,
    maxtext_decoder_block="qwen3",
    torchtitan_rotary="half",
)
