"""Gemma (v1): the Llama block with Gemma's GeGLU, (1 + w) norms, a scaled tied embedding, MQA at 2b.

MaxText 0.2.5's `gemma` decoder block (`models/gemma.py`): pre-attention norm, attention, residual,
pre-MLP norm, gated MLP (`mlp_activations: [gelu, linear]`; MaxText's gelu is jax.nn.gelu, the tanh
approximation, as HF's `hidden_activation: gelu_pytorch_tanh`), residual. Unlike gemma2 and gemma3 there
are no sandwich norms, no softcaps and no sliding window. MaxText's plain RMSNorm scales stand for HF's
`(1 + w)` weights (HF weight = scale - 1), its query kernel carries 1/sqrt(head_dim), its embedding table
is stored times sqrt(emb) (HF scales the looked-up embedding at runtime) and the output is tied
(`logits_via_embedding: true`). gemma-2b has one key/value head (MQA), gemma-7b as many as query heads.
"""

from __future__ import annotations

from maxckpt.families.base import DENSE_ONLY_HF_BRIDGES, Family

FAMILY = Family(
    name="gemma",
    hf_model_type="gemma",
    hf_architecture="GemmaForCausalLM",
    maxtext_query_scale=True,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=8192,
    bos_token_id=2,
    eos_token_id=1,
    maxtext_models=("gemma-2b", "gemma-7b"),
    hf_config_extra={"attention_bias": False, "pad_token_id": 0},
    maxtext_decoder_block="gemma",
    maxtext_layer_norms=("pre_self_attention_norm", "pre_ffw_norm"),
    bridges=DENSE_ONLY_HF_BRIDGES,
    bridge_gaps={
        # Megatron-Core 0.16's LanguageModelEmbedding has no embedding multiplier (Megatron-Bridge's Gemma
        # provider adds one outside core).
        "megatron": "Megatron-Core's GPT model does not scale its input embeddings by sqrt(hidden) as Gemma does",
        "torchtitan": "TorchTitan 0.3.0 ships no such model",
    },
    settings={"norm_offset": 1.0, "maxtext_embedding_scaled": True, "activation": "gelu_tanh"},
)
