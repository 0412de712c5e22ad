"""TorchTitan's layer tables for llama3, qwen3, qwen3 MoE and deepseek_v3, in the mapping vocabulary.

A family's record points at the table its TorchTitan model has (`Family.torchtitan_table`); gpt-oss keeps its
own in its file. The walker is :class:`maxckpt.formats.torchtitan.layout.TorchTitanLayout`: the `renames` of
every layer are written kind by kind (every layer's wq, then every layer's wk, ...), so a scanned MaxText
source decodes each stacked array once; the `moe` entries follow, layer by layer.

Two key generations exist: "classic" (`attention.wq`, `output`) and "2026" (torchtitan 0.3.0:
`attention.qkv_linear.wq`, `lm_head`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import Entry, Experts, Same, ZeroBias

__all__ = ["KeyGeneration", "OUTPUT_NAMES", "QKV_NAMES", "TorchTitanLayer", "TorchTitanTable", "standard_layer"]

KeyGeneration = Literal["2026", "classic"]

QKV_NAMES = {
    "2026": ("attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight", "attention.qkv_linear.wv.weight"),
    "classic": ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight"),
}
OUTPUT_NAMES = {"2026": "lm_head.weight", "classic": "output.weight"}
EXPERT_BIAS = "moe.expert_bias_E"  # the aux-loss-free balancing bias, added to the scores when choosing experts
ROUTER = "moe.router.gate.weight"


@dataclass(frozen=True)
class TorchTitanLayer:
    """One layer's entries: `renames` (written kind by kind across layers) and `moe` (written per layer)."""

    renames: tuple[Entry, ...]
    moe: tuple[Entry, ...] = ()


TorchTitanTable = Callable[[ModelSpec, KeyGeneration, bool], TorchTitanLayer]  # (spec, keys, MoE layer) -> layer


def global_entries(spec: ModelSpec, keys: KeyGeneration) -> tuple[Entry, ...]:
    """The embedding, the output (the model state dict holds it even when tied: then the embedding's values,
    and reading leaves the stored copy alone) and the final norm."""
    output = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    return (Same("tok_embeddings.weight", "model.embed_tokens.weight"), Same(OUTPUT_NAMES[keys], output),
            Same("norm.weight", "model.norm.weight"))


def attention(keys: KeyGeneration) -> list[Entry]:
    """Grouped-query attention: q and k rows change rotary order where TorchTitan's differs from HF's."""
    wq, wk, wv = QKV_NAMES[keys]
    return [Same(wq, "self_attn.q_proj.weight", rotary="q"), Same(wk, "self_attn.k_proj.weight", rotary="k"),
            Same(wv, "self_attn.v_proj.weight"), Same("attention.wo.weight", "self_attn.o_proj.weight")]


DENSE_MLP = (Same("feed_forward.w1.weight", "mlp.gate_proj.weight"),
             Same("feed_forward.w3.weight", "mlp.up_proj.weight"),
             Same("feed_forward.w2.weight", "mlp.down_proj.weight"))
NORMS = (Same("attention_norm.weight", "input_layernorm.weight"),
         Same("ffn_norm.weight", "post_attention_layernorm.weight"))
QK_NORMS = (Same("attention.q_norm.weight", "self_attn.q_norm.weight"),
            Same("attention.k_norm.weight", "self_attn.k_norm.weight"))
# DeepSeek V3's multi-latent attention (torchtitan deepseek_v3); rope pairs are interleaved in TorchTitan and in HF's
# rope_interleave alike, so nothing is permuted.
MLA_Q_LORA = (Same("attention.wq_a.weight", "self_attn.q_a_proj.weight"),
              Same("attention.q_norm.weight", "self_attn.q_a_layernorm.weight"),
              Same("attention.wq_b.weight", "self_attn.q_b_proj.weight"))
MLA_NO_Q_LORA = (Same("attention.wq.weight", "self_attn.q_proj.weight"),)  # DeepSeek-V2-Lite: one wq
MLA_KV = (Same("attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"),
          Same("attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"),
          Same("attention.wkv_b.weight", "self_attn.kv_b_proj.weight"),
          Same("attention.wo.weight", "self_attn.o_proj.weight"))
SHARED_EXPERTS = (Same("moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
                  Same("moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
                  Same("moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"))
ROUTED_EXPERTS = (Experts("moe.routed_experts.inner_experts.w1_EFD", ("mlp.experts.{e}.gate_proj.weight",)),
                  Experts("moe.routed_experts.inner_experts.w3_EFD", ("mlp.experts.{e}.up_proj.weight",)),
                  Experts("moe.routed_experts.inner_experts.w2_EDF", ("mlp.experts.{e}.down_proj.weight",)))


def routed_moe(spec: ModelSpec) -> tuple[Entry, ...]:
    """The router, experts stacked `[X, ...]` and the balancing bias: DeepSeek's e_score_correction_bias, or zeros
    that must stay zero (HF Qwen 3 MoE has none)."""
    router = Same(ROUTER, "mlp.gate.weight")
    if spec.routing == "sigmoid_bias":
        return (router, *ROUTED_EXPERTS, Same(EXPERT_BIAS, "mlp.gate.e_score_correction_bias"))
    return (router, *ROUTED_EXPERTS, ZeroBias(EXPERT_BIAS, "HF Qwen 3 MoE", guards="mlp.gate.weight"))


def standard_layer(spec: ModelSpec, keys: KeyGeneration, moe: bool) -> TorchTitanLayer:
    """llama3 and qwen3 (dense or MoE) layers, and deepseek_v3's (MLA, shared experts)."""
    if spec.kv_lora_rank:
        attn = [*(MLA_Q_LORA if spec.q_lora_rank else MLA_NO_Q_LORA), *MLA_KV]
        shared = SHARED_EXPERTS if moe and spec.num_shared_experts else ()
        renames = [*attn, *([] if moe else DENSE_MLP), *NORMS, *shared]
    else:
        renames = [*attention(keys), *([] if moe else DENSE_MLP), *NORMS,
                   *(QK_NORMS if spec.qk_norm else ())]
    return TorchTitanLayer(tuple(renames), routed_moe(spec) if moe else ())


def reading_entries(keys: KeyGeneration) -> tuple[Entry, ...]:
    """Every entry the standard tables use, to tell dims from a checkpoint's shapes before the model is known."""
    return (*attention(keys), *DENSE_MLP, *NORMS, *QK_NORMS, *MLA_Q_LORA, *MLA_NO_Q_LORA, *MLA_KV,
            *SHARED_EXPERTS, *ROUTED_EXPERTS, Same(ROUTER, "mlp.gate.weight"))
