"""The family record: what tensor shapes cannot tell about a model, as one frozen dataclass.

Each module of :mod:`maxckpt.families` defines one :class:`Family` as ``FAMILY``; the
layouts, the reference forward and the CLI read those records, never a family's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from maxckpt.families.tables.megatron import STACKED, MegatronTable
from maxckpt.families.tables.torchtitan import TorchTitanTable, standard_layer
from maxckpt.layouts.mapping import Entry

# The parameters of the "llama3" rope type as Megatron-Core hard-codes them (it saves only the factor).
LLAMA3_ROPE_SCALING: Mapping[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Which formats can hold each family (see docs/conversion.md, "Which pairs are possible").
ALL_BRIDGES = ("maxtext", "hf", "torch", "megatron", "torchtitan")
MOE_BRIDGES = ("maxtext", "hf", "torch")
DENSE_ONLY_HF_BRIDGES = ("maxtext", "hf", "torch")


@dataclass(frozen=True)
class Family:
    """One model family: MaxText's conventions and HF's config for it."""

    name: str
    hf_model_type: str
    hf_architecture: str
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    # How MaxText orders each head's rotary features: "half" as HF (rotate-half), or "interleaved" pairs
    # (MaxText's llama3.1 rope), which the HF side permutes.
    maxtext_rotary: Literal["half", "interleaved"] = "half"
    # MaxText initialises the query kernel divided by sqrt(head_dim) instead of
    # scaling attention logits; HF scales logits, so the factor moves.
    maxtext_query_scale: bool = False
    qk_norm: bool = False
    rope_scaling: Mapping[str, Any] | None = None
    maxtext_models: tuple[str, ...] = ()
    # The model type of HF's multimodal wrapper whose text model this family is (gemma3's "gemma3").
    hf_wrapper_model_type: str | None = None
    # Extra config.json keys transformers expects for this model type.
    hf_config_extra: Mapping[str, Any] = field(default_factory=dict)
    # config.json keys whose value is the number of layers (qwen3's max_window_layers).
    hf_num_layers_keys: tuple[str, ...] = ()
    # config.json lists every layer's type (sliding_attention / full_attention).
    hf_layer_types: bool = False
    # ---- how MaxText lays out the layers (see formats/maxtext/layout.py: layer_stacks)
    # "layers": one stack; "pairs": one MaxText layer holds a (local, global) pair (gemma2);
    # "blocks": scanned in blocks of sliding_window_pattern layers plus a remainder (gemma3, gpt-oss);
    # "dense_moe": dense_layers then moe_layers (deepseek3).
    # "hybrid": Gated DeltaNet hybrids (qwen3-next), blocks of full_attention_interval layers scanned as
    # `decoder/layers/local_layers` (stacked on the scan axis and the next) and `decoder/layers/global_layer`.
    # "cycle": llama4, `decoder/layers/layers_{j}` for j < layer_cycle_interval, stacked over blocks, each position
    # its own kind of layer (MoE or dense MLP by interleave_moe_layer_step); no remainder.
    # "local_global": gemma4, blocks of sliding_window_pattern layers scanned as `decoder/scanned_blocks/local_layers`
    # (the sliding ones, on two axes) and `.../global_layer`, leftovers in `decoder/layers_remainder/local_layers`.
    maxtext_scan: Literal["layers", "pairs", "blocks", "dense_moe", "hybrid", "cycle", "local_global"] = "layers"
    maxtext_attention: str = "self_attention"  # attention module name in a MaxText layer
    maxtext_moe: str | None = None  # MoE module path in a MaxText layer (None: dense MLP)
    attention: Literal["mha", "mla"] = "mha"
    # How HF stores the routed experts: "per_expert" (`{hf_expert_block}.experts.{e}.<projection>.weight`, one
    # tensor each) or "fused_interleaved" (gpt-oss: `mlp.experts.gate_up_proj` [X, emb, 2F], gate/up interleaved).
    # "fused_concat" (llama4): `{hf_expert_block}.experts.gate_up_proj` [X, emb, 2F] (gate then up), `down_proj`
    # [X, F, emb], the router `{hf_expert_block}.router.weight`.
    # "packed_parallel" (gemma4): `experts.gate_up_proj` [X, 2M, E] (gate then up) and `experts.down_proj`
    # [X, E, M] beside a dense `mlp` and a `router` (formats/hf/gemma4.py).
    hf_experts: Literal["per_expert", "fused_interleaved", "fused_concat", "packed_parallel"] | None = None
    # The HF module holding a per-expert MoE's router (`.gate`), experts and shared experts, and the names of
    # one expert's gate, up and down projections (mixtral: block_sparse_moe, w1 / w3 / w2).
    hf_expert_block: str = "mlp"
    hf_expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    # The shared experts' module names: HF's under hf_expert_block, MaxText's in a layer (None: the MoE
    # module's sibling `shared_experts`); qwen3-next has one `shared_expert`.
    hf_shared_experts: str = "shared_experts"
    maxtext_shared_experts: str | None = None
    # The Gated DeltaNet module in a MaxText layer (hybrid families; its full-attention layers use
    # maxtext_attention).
    maxtext_linear_attention: str = "attention"
    # The two norms of a MaxText decoder layer (before attention, before the MLP), for the non-Gemma layouts.
    maxtext_layer_norms: tuple[str, str] = ("pre_self_attention_layer_norm", "post_self_attention_layer_norm")
    # A hybrid's scanned block: "local_global" (qwen3-next: `local_layers` stacked twice + `global_layer`) or
    # "per_layer" (qwen3.5: `decoder/layers/layer_{j}`, one subtree per position, each stacked over blocks).
    maxtext_hybrid_block: Literal["local_global", "per_layer"] = "local_global"
    # How HF holds a Gated DeltaNet's input projections: "grouped" (qwen3-next: in_proj_qkvz / in_proj_ba
    # packed per key-head group, as MaxText's kernels) or "split" (qwen3.5: in_proj_qkv [q | k | v], in_proj_z,
    # in_proj_b, in_proj_a, each head-major).
    hf_gdn_projections: Literal["grouped", "split"] = "grouped"
    # HF's router always renormalises the top-k weights (its config has no norm_topk_prob): a model that does
    # not cannot be written as this family's HF model (qwen3.5).
    hf_renormalises_topk: bool = False
    # The router's module when transformers makes it an nn.Linear (an FP8 output keeps it full precision and
    # says so in quantization_config); None: no such Linear (DeepSeek's router is not one).
    hf_linear_router: str | None = None
    # config.json: the key holding the routed-expert count, and what `intermediate_size` means:
    # "mlp" (the dense MLP width), "expert" (one expert's width: mixtral, gpt-oss) or "unused" (qwen3-moe,
    # all of whose layers are MoE: its dense width is never used).
    hf_num_experts_key: str | None = None
    hf_intermediate_size: Literal["mlp", "expert", "unused"] = "mlp"
    # TorchTitan's rotary feature order for this family ("half": HF's, no q/k row permutation).
    torchtitan_rotary: Literal["interleaved", "half"] = "interleaved"
    # The TorchTitan model a MoE family loads into, as the hand-off note names it (None: TorchTitan has none;
    # a dense family loads into llama3, or qwen3 with q/k norms).
    torchtitan_model: str | None = None
    # TorchTitan's layer table (maxckpt.families.tables.torchtitan): (spec, key generation, MoE layer) -> its
    # entries; and the entries beyond the standard ones a checkpoint of this family is read by (gpt-oss's).
    torchtitan_table: TorchTitanTable = standard_layer
    torchtitan_reading: tuple[Entry, ...] = ()
    # ---- a MaxText run's config.yml
    # The decoder_block naming this family in a run without a model_name (the first family in registry order
    # with that block and the run's rope_type wins), and the MaxText rope_type it needs (None: any other).
    maxtext_decoder_block: str | None = None
    maxtext_rope_type: str | None = None
    # MaxText keys a run's config sets for this family with maxckpt's meaning: key -> (ModelSpec field, the
    # value MaxText uses for "off", or None); elsewhere MaxText ignores them or means something else.
    maxtext_settings: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    # Logit-relevant ModelSpec fields no tensor shape shows, beyond rope and norm eps: what a preset would
    # decide silently, so the conversion notes say where each came from.
    unshown_settings: tuple[str, ...] = ()
    # Formats whose model code expresses this family (maxckpt converts to and from these).
    bridges: tuple[str, ...] = ALL_BRIDGES
    # Why this family cannot go to or from a format missing from `bridges`: format -> reason (shown by
    # `convert` and its --help).
    bridge_gaps: Mapping[str, str] = field(default_factory=dict)
    # Megatron-Core's layer table for this family (maxckpt.families.tables.megatron): STACKED on a leading [L]
    # axis (homogeneous layers), or MLA, keyed per layer (`decoder.layers.{i}.…`): what core 0.16 saves once
    # `moe_layer_freq` is a list, as it is for DeepSeek's dense leading layers.
    megatron_table: MegatronTable = STACKED
    # ModelSpec defaults for this family (routing, softcaps, windows, norm offset, ...): field -> value.
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Per MaxText model name, settings that differ from the family's (e.g. top-k).
    model_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # HF's names of the two layer norms `maxtext_layer_norms` names (olmo3: post_attention_layernorm and
    # post_feedforward_layernorm).
    hf_layer_norms: tuple[str, str] = ("input_layernorm", "post_attention_layernorm")
    # The two layer norms apply to the attention and MLP *outputs* before each residual (OLMo 2/3), not to
    # their inputs: no norm before attention.
    post_norms: bool = False
    # The q/k norms normalise the whole projection (all heads together: MaxText's GlobalRMSNorm, HF olmo3's
    # q_norm [Hq*D]), not each head.
    qk_norm_across_heads: bool = False
    # config.json states rope_parameters per layer type (full_attention / sliding_attention), the model's rope
    # (scaling included) on both: transformers reads a flat rope_parameters as default rope for this model type.
    hf_rope_per_layer_type: bool = False
    # MaxText scans leftover layers after the last whole block ("blocks" layout: `decoder/layers_remainder`);
    # False: its decoder builds whole blocks only and drops the rest (olmo3's generic scan), so a scanned
    # output of such a model is refused (--no-scan-layers writes it).
    maxtext_scan_remainder: bool = True
    # The HF module holding a layer's dense MLP (`{hf_mlp_block}.gate_proj.weight`; llama4: feed_forward).
    hf_mlp_block: str = "mlp"
    # How HF's own model orders each head's rotary features, when not rotate-half: "interleaved" pairs (llama4's
    # complex rope). MaxText's interleaved order then needs no permutation (set maxtext_rotary "half"), but the
    # reference forward rotates pairs.
    hf_rotary: Literal["half", "interleaved"] = "half"
    # transformers makes the last layer full attention whatever layer_types says (gemma4): a model whose last
    # layer slides cannot be written as this family's HF model.
    hf_last_layer_full: bool = False
    # The family's layers take per-layer input embeddings (gemma4 e2b/e4b): tensor names say it.
    per_layer_inputs: bool = False
    # Regexes over a checkpoint's tensor names (MaxText canonical or HF), any of which says this family where the
    # names alone read as a family with the same MaxText modules (every DeepSeek-style tree reads as deepseek3):
    # deepseek3.2's indexer, deepseek2-16b's one query kernel. Required: a tree without them is not this family
    # (deepseek3.2 without its indexer); else --model may still pick it (deepseek2-236b has a query LoRA).
    tree_markers: tuple[str, ...] = ()
    tree_markers_required: bool = False
