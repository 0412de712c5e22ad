"""Transformer Engine vs local layer spec: the names its norms get and the `_extra_state` items it saves.

Megatron-Core 0.16.1's `get_gpt_layer_with_transformer_engine_spec` and `get_gpt_layer_local_spec` hold the
same tensors under a few different names: a MoE layer of the TE spec keeps its pre-MLP norm as a module
(a TENorm), `decoder.layers.pre_mlp_layernorm.weight`, where the local spec's key map writes
`mlp.linear_fc1.layer_norm_weight`; an MLA layer of the TE spec fuses the q and kv norms into
`self_attention.linear_q_up_proj.layer_norm_weight` / `linear_kv_up_proj.layer_norm_weight` (local:
`q_layernorm` / `kv_layernorm`) and, in a dense layer, the pre-MLP norm into `mlp.linear_fc1.layer_norm_weight`.
TE's modules, its norms included (TE 2's fusible ops), each save an `_extra_state`. Reading takes either.

>>> layer_key(True, ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250), 0, "self_attention.q_layernorm.weight")
'self_attention.linear_q_up_proj.layer_norm_weight'
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from maxckpt.formats.hf import layout as hfl
from maxckpt.families.tables import megatron as n
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import Entry, Experts, Interleaved, Transposed

__all__ = ["FUSED_NORMS", "LOCAL_NAMES", "READ_ALIASES", "extra_state", "layer_key", "norm_names"]

# The Transformer-Engine spec fuses these norms of an MLA layer into the following linear (a
# TELayerNormColumnParallelLinear); writing with spec "te" uses these names, reading accepts both.
FUSED_NORMS = {
    "self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
    "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight",
    "pre_mlp_layernorm.weight": n.MLP_NORM_TE,  # dense layers only (MoE layers keep a separate norm)
}
# A table's key (the local spec's name) -> the other names a checkpoint may hold it under (either spec, either
# norm_keys); and each of those back to the table's key.
READ_ALIASES = {n.IN_NORM_LOCAL: (n.IN_NORM_TE,), **{k: (v,) for k, v in FUSED_NORMS.items()}}
LOCAL_NAMES = {alias: key for key, aliases in READ_ALIASES.items() for alias in aliases}

# Modules whose `_extra_state` Megatron saves per layer: the four linears for
# both specs; TE's DotProductAttention too with the TE spec (core 0.16.1 asks for it only with
# `--softmax-type learnable`, earlier releases always: an item no model asks for is ignored on load).
_EXTRA_LOCAL = (
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)
_EXTRA_TE = _EXTRA_LOCAL + ("self_attention.core_attention",)
# TE 2's norms (TENorm = te.pytorch.RMSNorm, a fusible op) save an `_extra_state` as well.
_FINAL_NORM_EXTRA = "decoder.final_layernorm._extra_state/shard_0_1"


def norm_names(norm_keys: Literal["te", "local"], spec: ModelSpec, te: bool) -> tuple[str, str]:
    """(input norm, pre-MLP norm) suffixes of a stacked layer written with these `norm_keys`.

    "te" is what core 0.16 saves for both specs of a dense layer; "local" the module names of releases
    before the local spec's key map. The TE spec's MoE layer keeps its pre-MLP norm as its own TENorm.
    """
    in_norm, mlp_norm = (n.IN_NORM_TE, n.MLP_NORM_TE) if norm_keys == "te" else (n.IN_NORM_LOCAL, n.MLP_NORM_LOCAL)
    if spec.num_experts and te:
        mlp_norm = n.MLP_NORM_LOCAL
    return in_norm, mlp_norm


def layer_key(te: bool, spec: ModelSpec, i: int, meg: str) -> str:
    """The suffix the spec (TE when `te`) gives layer i's tensor `meg` (a per-layer entry's, local spec's name)."""
    if not te or meg not in FUSED_NORMS:
        return meg
    if meg == n.MLP_NORM_LOCAL and hfl.is_moe_layer(spec, i):
        return meg  # a MoE layer keeps its pre-MLP TENorm; a dense one fuses it into fc1
    return FUSED_NORMS[meg]


def extra_state(
    spec: ModelSpec, te: bool, layer_entries: Callable[[int], tuple[Entry, ...]] | None = None
) -> dict[str, Any]:
    """The `_extra_state` bytes items Megatron's loader expects, as objects to `torch.save`.

    Each is `[None]` - what core 0.16 itself saves for a model without FP8
    state (local linears return None; TE modules accept None on load).

    Local spec: one per linear (per layer, and per expert). TE spec: every
    TE module's - the linears, `core_attention`, and the TENorms (the final
    norm, q/k norms, a MoE layer's `pre_mlp_layernorm`, an MLA layer's
    `input_layernorm`); norms fused into a linear share its item.
    `layer_entries(i)` gives layer i's entries of a per-layer family (None: stacked keys).
    """
    L = spec.num_layers
    out: dict[str, Any] = {_FINAL_NORM_EXTRA: [None]} if te else {}
    if layer_entries is not None:  # per-layer keys: each layer's modules are a shard 0 of 1; experts e of X
        for i in range(L):
            modules: dict[str, int] = {}
            for entry in layer_entries(i):
                module = layer_key(te, spec, i, entry.key).rsplit(".", 1)[0]
                if module == "mlp.router" or ("layernorm" in module and not te):
                    continue
                per_expert = isinstance(entry, (Experts, Interleaved, Transposed))
                modules.setdefault(module, spec.num_experts if per_expert else 1)
                if te and module == "self_attention.linear_kv_up_proj":
                    modules.setdefault("self_attention.core_attention", 1)
            for module, count in modules.items():
                for e in range(count):
                    out[f"decoder.layers.{i}.{module}._extra_state/shard_{e}_{count}"] = [None]
        return out
    stacked = list(_EXTRA_TE if te else _EXTRA_LOCAL)
    if te and spec.qk_norm:
        stacked += ["self_attention.q_layernorm", "self_attention.k_layernorm"]
    if spec.num_experts:  # the experts' linears have one item per (layer, expert); no dense MLP
        stacked = [m for m in stacked if not m.startswith("mlp.")] + (["pre_mlp_layernorm"] if te else [])
        X = spec.num_experts
        experts = {
            f"decoder.layers.{m}._extra_state/shard_{i}.{e}_{L}.{X}": [None]
            for m in n.EXP_MODULES for i in range(L) for e in range(X)
        }
    else:
        experts = {}
    out.update({f"decoder.layers.{m}._extra_state/shard_{i}_{L}": [None] for m in stacked for i in range(L)})
    out.update(experts)
    return out
