"""Gemma 4 small (text; e2b, e4b): Gemma 4's layers (gemma4.py) with per-layer input embeddings and KV sharing.

MaxText 0.2.5's `gemma4_small` decoder block (models/gemma4_small.py, unscanned only) and transformers'
Gemma4TextModel with hidden_size_per_layer_input agree: a per-layer input embedder (`embed_tokens_per_layer`
[V_ple, L * P] scaled by sqrt(P) at runtime, plus `per_layer_model_projection` of the input embeddings times
emb**-0.5, RMS-normed per layer, the two summed times 2**-0.5) feeds every layer a [P] input, which the layer
gates with gelu(per_layer_input_gate(h)), projects back, norms and adds after its MLP. The last
`num_kv_shared_layers` layers have no k/v projections: they reuse the keys and values of the last earlier
layer of their attention type, and with `use_double_wide_mlp` (e2b) their MLP is twice as wide. The
full-attention layers keep a value kernel (no K=V). e2b's pattern is 4 sliding + 1 full, e4b's 5 + 1.
"""

from __future__ import annotations

from dataclasses import replace

from maxckpt.families.gemma4 import FAMILY as GEMMA4

FAMILY = replace(
    GEMMA4,
    name="gemma4-small",
    maxtext_models=("gemma4-e2b", "gemma4-e4b"),
    per_layer_inputs=True,
    maxtext_decoder_block="gemma4_small",
    maxtext_settings={**GEMMA4.maxtext_settings, "hidden_size_per_layer_input": ("per_layer_input_dim", None),
                      "vocab_size_per_layer_input": ("per_layer_vocab_size", None),
                      "use_double_wide_mlp": ("double_wide_mlp", None)},
    bridge_gaps={
        "megatron": GEMMA4.bridge_gaps["megatron"] + "; nor per-layer input embeddings or KV-shared layers",
        "torchtitan": GEMMA4.bridge_gaps["torchtitan"],
    },
    settings={**GEMMA4.settings, "sliding_window": 512, "global_k_eq_v": False, "sliding_window_pattern": 6},
    model_settings={"gemma4-e2b": {"sliding_window_pattern": 5}},
)
