"""Gemma 4 (text; 31b, dense): blocks of 5 sliding + 1 full-attention layers with their own head geometry.

What MaxText 0.2.5's `gemma4` decoder block and transformers' Gemma4ForCausalLM agree on: q/k norms and a
scale-free v norm, no query scaling (scaling 1.0), sandwich norms that multiply by the scale as it is (no
1 + w), a learned scalar on every layer's output, tied embeddings with final logit softcap 30. Sliding layers:
window 1024, rope theta 1e4 on the whole head. Full-attention layers: `global_head_dim`,
`global_num_kv_heads`, no value kernel (the key is the value), rope theta 1e6 on the first quarter of each
head ("proportional" rope). MaxText scans blocks of 6 as `decoder/scanned_blocks/{local_layers, global_layer}`
with the leftover (sliding) layers in `decoder/layers_remainder/local_layers` (formats/maxtext/local_global.py).
The MoE model (26b) is gemma4_moe.py, the small ones with per-layer embeddings (e2b, e4b) gemma4_small.py.
"""

from __future__ import annotations

from maxckpt.families.base import DENSE_ONLY_HF_BRIDGES, Family

FAMILY = Family(
    name="gemma4",
    hf_model_type="gemma4_text",
    hf_architecture="Gemma4ForCausalLM",
    hf_wrapper_model_type="gemma4",  # the multimodal wrapper: its text model is what maxckpt converts
    qk_norm=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=131072,
    bos_token_id=2,
    eos_token_id=1,
    maxtext_models=("gemma4-31b",),
    hf_config_extra={"attention_bias": False, "pad_token_id": 0},
    hf_layer_types=True,
    hf_last_layer_full=True,
    maxtext_scan="local_global",
    bridges=DENSE_ONLY_HF_BRIDGES,
    maxtext_decoder_block="gemma4",
    maxtext_settings={"sliding_window_size": ("sliding_window", 0),
                      "local_rope_max_timescale": ("local_rope_theta", -1),
                      "global_rope_proportion": ("global_partial_rotary_factor", None)},
    unshown_settings=("sliding_window", "local_rope_theta", "global_partial_rotary_factor"),
    bridge_gaps={
        "megatron": "Megatron-Core ships no Gemma 4 model (per-layer head geometry, K=V global layers, layer "
                    "scalars, logit softcapping)",
        "torchtitan": "TorchTitan 0.3.0 ships no such model",
    },
    settings={"sliding_window": 1024, "sliding_window_pattern": 6, "local_rope_theta": 10_000.0,
              "global_partial_rotary_factor": 0.25, "global_k_eq_v": True, "layer_scalar": True,
              "norm_offset": 0.0, "sandwich_norms": True, "maxtext_embedding_scaled": True,
              "activation": "gelu_tanh", "final_logit_softcap": 30.0},
)
