"""OLMo 3: post-norms, q/k norms over the whole projection, 3 sliding + 1 full layers, YaRN on every layer.

MaxText 0.2.5's `olmo3` decoder block (`models/olmo3.py`): attention on the un-normed input, its output
normed (`post_self_attention_layer_norm`) before the residual, then the SwiGLU MLP, its output normed
(`post_mlp_layer_norm`) before the residual (OLMo 2's order; HF `post_attention_layernorm` and
`post_feedforward_layernorm`, no `input_layernorm`). The q/k norms are `GlobalRMSNorm`s over all heads
together (`[Hq*D]`, `[Hkv*D]`, as HF's `q_norm`/`k_norm`), applied before RoPE; the query is scaled by
head_dim**-0.5 at runtime. Layers come in blocks of `inhomogeneous_layer_cycle_interval` 4, scanned as
`decoder/layers/layers_{j}`: three sliding-window (4096) layers, then one full. Every layer, sliding ones
included, uses the model's YaRN (factor 8 over 8192, attention scaling 0.1 ln 8 + 1), so the HF config.json
states it for both layer types (a flat rope_parameters would be read as default rope by transformers 5).
"""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.families.base import DENSE_ONLY_HF_BRIDGES, Family

OLMO3_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}

FAMILY = Family(
    name="olmo3",
    hf_model_type="olmo3",
    hf_architecture="Olmo3ForCausalLM",
    qk_norm=True,
    rope_theta=500_000.0,
    rope_scaling=OLMO3_YARN,
    rms_norm_eps=1e-6,
    max_position_embeddings=65536,
    bos_token_id=None,
    eos_token_id=100257,
    maxtext_models=("olmo3-7b", "olmo3-32b", "olmo3-7b-pt"),
    hf_config_extra={"attention_bias": False, "pad_token_id": 100277},
    hf_layer_types=True,
    maxtext_scan="blocks",
    maxtext_attention="attention",
    maxtext_layer_norms=("post_self_attention_layer_norm", "post_mlp_layer_norm"),
    maxtext_decoder_block="olmo3",
    maxtext_settings={"sliding_window_size": ("sliding_window", 0)},
    unshown_settings=("sliding_window",),
    bridges=DENSE_ONLY_HF_BRIDGES,
    bridge_gaps={
        "megatron": "Megatron-Core's GPT layer norms the attention and MLP inputs; OLMo 3 norms their outputs "
                    "(no input norm), its q/k norms span all heads, and its YaRN covers sliding-window layers",
        "torchtitan": "TorchTitan 0.3.0 ships no such model",
    },
    settings={"sliding_window": 4096, "sliding_window_pattern": 4},
    hf_layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
    post_norms=True,
    qk_norm_across_heads=True,
    hf_rope_per_layer_type=True,
    maxtext_scan_remainder=False,  # MaxText 0.2.5's generic scan builds num_decoder_layers // 4 blocks only
    # olmo3-7b-pt: the stage 1 / 2 pretraining revisions of Olmo-3-1025-7B (its yml): default rope on every
    # layer over 8192 positions; YaRN comes with stage 3.
    model_settings={"olmo3-7b-pt": {"rope_scaling": None, "max_position_embeddings": 8192}},
)
