"""Dimension symbols: the sizes a table's shapes are written in (`E`, `Hq*D`, `2*M`, ...).

Tables state shapes as symbols so one entry serves every size of a family; :func:`dim` resolves a symbol
against a :class:`ModelSpec`. The HF layout's expected shapes and MaxText's kernel forms
(:mod:`maxckpt.layouts.forms`) are both written in them.

>>> from maxckpt.layouts.base import ModelSpec
>>> shape_of(("E", "Hq*D"), ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 256))
(64, 64)
"""

from __future__ import annotations

from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.gated_deltanet import gdn_sizes

__all__ = ["dim", "shape_of"]


def dim(symbol: str, spec: ModelSpec) -> int:
    """The size a dimension symbol (`E`, `Hq*D`, `2*M`, ...) stands for in `spec`."""
    sizes = {
        "E": spec.emb_dim,
        "Hq": spec.num_heads,
        "Hkv": spec.num_kv_heads,
        "D": spec.head_dim,
        "F": spec.mlp_dim,
        "V": spec.vocab_size,
        "L": spec.num_layers,
        "X": spec.num_experts,  # routed experts
        "M": spec.moe_mlp_dim,  # one expert's width
        "S": spec.moe_mlp_dim * spec.num_shared_experts,  # the shared experts' width
        "QL": spec.q_lora_rank,
        "KL": spec.kv_lora_rank,
        "KR": spec.qk_rope_head_dim,
        "QK": spec.qk_nope_head_dim + spec.qk_rope_head_dim,  # one MLA query head
        "KVB": spec.qk_nope_head_dim + spec.v_head_dim,  # one MLA kv_b head: [k_nope | v]
        "KVA": spec.kv_lora_rank + spec.qk_rope_head_dim,  # MLA kv_a: [kv_lora | k_rope]
        "VD": spec.v_head_dim,
        "P": spec.per_layer_input_dim,  # gemma4 e2b/e4b: one layer's per-layer input width
        "VP": spec.per_layer_vocab_size,
        "IH": spec.indexer_n_heads,  # DeepSeek-V3.2's indexer heads and their width
        "ID": spec.indexer_head_dim,
    }
    if spec.full_attention_interval:  # Gated DeltaNet hybrids
        sizes.update(gdn_sizes(spec))
    out = 1
    for part in symbol.split("*"):
        out *= int(part) if part.isdigit() else sizes[part]
    return out


def shape_of(symbols: tuple[str, ...], spec: ModelSpec) -> tuple[int, ...]:
    return tuple(dim(s, spec) for s in symbols)
