"""Megatron-Core GPT `torch_dist` names and layer tables, in the mapping vocabulary (:mod:`maxckpt.layouts.mapping`).

The names are the suffixes after `decoder.layers.[i.]` and the globals; stacked keys carry a leading `[L]` axis,
per-layer keys an index. A family's record points at its table (`Family.megatron_table`): `STACKED` (llama,
qwen, mistral, mixtral, qwen3-moe: every layer alike, each tensor stacked on `[L]`) or `MLA` (DeepSeek-V3's
multi-latent attention, dense leading layers, shared experts and routing bias, keyed per layer); gpt-oss keeps
its own in its file. Norms are named as the local spec's modules; the layout renames them for the TE spec and
`norm_keys` (:mod:`maxckpt.formats.megatron.te_spec`). The walker is
:class:`maxckpt.formats.megatron.layout.MegatronLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.geometry import is_moe_layer
from maxckpt.layouts.mapping import Entry, Experts, FusedQKV, GatedPair, Padded, Requirement, Same


# Attention and dense MLP (stacked or per layer).
QKV = "self_attention.linear_qkv.weight"
PROJ = "self_attention.linear_proj.weight"
FC1 = "mlp.linear_fc1.weight"
FC2 = "mlp.linear_fc2.weight"
# Norms: the Transformer-Engine names (fused into the following linear) and the local spec's modules.
IN_NORM_TE = "self_attention.linear_qkv.layer_norm_weight"
IN_NORM_LOCAL = "input_layernorm.weight"
MLP_NORM_TE = "mlp.linear_fc1.layer_norm_weight"
MLP_NORM_LOCAL = "pre_mlp_layernorm.weight"
Q_NORM = "self_attention.q_layernorm.weight"
K_NORM = "self_attention.k_layernorm.weight"
# MoE layers (SequentialMLP's torch_dist keys, which (TE)GroupedMLP shares): router [L, X, E], experts [L, X, ...].
ROUTER = "mlp.router.weight"
EXP_FC1 = "mlp.experts.experts.linear_fc1.weight"
EXP_FC2 = "mlp.experts.experts.linear_fc2.weight"
EXP_MODULES = ("mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2")
# gpt-oss (`--add-qkv-bias`, bias linears, `--softmax-type learnable`): stacked like the rest.
QKV_BIAS = "self_attention.linear_qkv.bias"
PROJ_BIAS = "self_attention.linear_proj.bias"
SINKS = "self_attention.core_attention.softmax_offset"  # HF self_attn.sinks: the learned extra logit per head
ROUTER_BIAS = "mlp.router.bias"
EXP_FC1_BIAS = "mlp.experts.experts.linear_fc1.bias"
EXP_FC2_BIAS = "mlp.experts.experts.linear_fc2.bias"
# Globals.
EMBED = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"

# DeepSeek-V3 layers (MLA, dense leading layers, shared experts, routing bias) as Megatron-Core 0.16.1
# keys them with the local spec: per layer (`decoder.layers.{i}.` + suffix), checked against a real
# GPTModel built by `get_gpt_decoder_block_spec(MLATransformerConfig(...), use_transformer_engine=False)`
# and saved by `dist_checkpointing.save`. Megatron suffix -> HF suffix; MLA's projections keep HF's shapes
# and row order (q_b rows per head [nope | rope], kv_a rows [kv_lora | rope], kv_b rows per head [k_nope | v]).
MLA_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
# MLA's query LoRA; without one (DeepSeek-V2-Lite, q_lora_rank None) Megatron-Core builds one linear_q_proj.
MLA_Q_LORA = ("self_attention.linear_q_down_proj.weight", "self_attention.q_layernorm.weight",
              "self_attention.linear_q_up_proj.weight")
MLA_Q_PROJ = {"self_attention.linear_q_proj.weight": "self_attn.q_proj.weight"}
EXPERT_BIAS = "mlp.router.expert_bias"
SHARED_FC1 = "mlp.shared_experts.linear_fc1.weight"
SHARED_FC2 = "mlp.shared_experts.linear_fc2.weight"


# What Megatron-Core 0.16's MLATransformerConfig assumes and Megatron-LM's flags do not set: the YaRN
# settings a spec must have for the hand-off flags to rebuild the same model.
MEGATRON_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def yarn_values(spec: ModelSpec, factor: float) -> dict[str, Any]:
    """HF's YaRN parameters of `spec` with HF's defaults (`factor` where the config has none), for the two
    sets of Megatron names that take them (MLA's `rotary_scaling_factor`, `mscale`, ...; gpt-oss's `yarn_*`)."""
    yarn = dict(spec.rope_scaling or {})
    return {
        "factor": float(yarn.get("factor", factor)),
        "original_max_position_embeddings": int(yarn.get("original_max_position_embeddings", 4096)),
        "beta_fast": float(yarn.get("beta_fast", 32.0)),
        "beta_slow": float(yarn.get("beta_slow", 1.0)),
        "mscale": float(yarn.get("mscale", 1.0)),
        "mscale_all_dim": float(yarn.get("mscale_all_dim", 0.0)),
        "truncate": bool(yarn.get("truncate", True)),
    }


@dataclass(frozen=True)
class MegatronTable:
    """A Megatron model's layers: `layer(spec, i, family)` gives layer i's entries in Megatron's module order.

    per_layer: keys `decoder.layers.{i}.…` (else every tensor stacked on `[L]`). `requires` must hold to map
    a model either way, `requires_to_write` to write one (the hand-off flags must rebuild the same model).
    A family whose Megatron model needs settings of its own states them here, both ways: `run_args(spec)`,
    `common.pt` args under Megatron-Core's TransformerConfig names; `run_flags(spec)`, the hand-off's
    activation and bias flags (None: SwiGLU without biases); `run_fields(args)`, the ModelSpec fields (with
    `family`) a run's saved args give when they are this family's, else None.
    """

    layer: Callable[[ModelSpec, int, Any], tuple[Entry, ...]]
    per_layer: bool = False
    requires: tuple[Requirement, ...] = ()
    requires_to_write: tuple[Requirement, ...] = ()
    run_args: Callable[[ModelSpec], dict[str, Any]] | None = None
    run_flags: Callable[[ModelSpec], list[str]] | None = None
    run_fields: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None


def global_entries(spec: ModelSpec) -> tuple[Entry, ...]:
    """The embedding and output (vocabulary padded; no output when tied) and the final norm."""
    output = () if spec.tie_word_embeddings else (Padded(OUTPUT, "lm_head.weight"),)
    return (Padded(EMBED, "model.embed_tokens.weight"), *output, Same(FINAL_NORM, "model.norm.weight"))


def attention(spec: ModelSpec) -> list[Entry]:
    """Grouped-query attention: the fused QKV (and its bias: qwen2.5's `--add-qkv-bias`, gpt-oss's), the output
    projection (and its bias) and gpt-oss's sinks."""
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    out: list[Entry] = [FusedQKV(QKV, tuple(f"{p}.weight" for p in qkv)), Same(PROJ, "self_attn.o_proj.weight")]
    if spec.attention_bias or spec.qkv_bias:
        out.append(FusedQKV(QKV_BIAS, tuple(f"{p}.bias" for p in qkv)))
    if spec.attention_bias:
        out.append(Same(PROJ_BIAS, "self_attn.o_proj.bias"))
    if spec.attention_sinks:
        out.append(Same(SINKS, "self_attn.sinks"))
    return out


def hf_expert_names(family: Any) -> tuple[str, str, str, str]:
    """HF router and per-expert gate/up/down suffixes (`{e}` for the expert) of a per-expert family."""
    block, (gate, up, down) = family.hf_expert_block, family.hf_expert_projections
    return (f"{block}.gate.weight", f"{block}.experts.{{e}}.{gate}.weight", f"{block}.experts.{{e}}.{up}.weight",
            f"{block}.experts.{{e}}.{down}.weight")


def routed_experts(spec: ModelSpec, family: Any) -> list[Entry]:
    """The router `[X, E]` and the experts' fc1 `[X, 2M, E]` (gate and up per expert) and fc2 `[X, E, M]`."""
    router, gate, up, down = hf_expert_names(family)
    return [Same(ROUTER, router), Experts(EXP_FC1, (gate, up)), Experts(EXP_FC2, (down,))]


DENSE_MLP = (GatedPair(FC1, ("mlp.gate_proj.weight", "mlp.up_proj.weight")), Same(FC2, "mlp.down_proj.weight"))
NORMS = (Same(IN_NORM_LOCAL, "input_layernorm.weight"), Same(MLP_NORM_LOCAL, "post_attention_layernorm.weight"))
QK_NORMS = (Same(Q_NORM, "self_attn.q_norm.weight"), Same(K_NORM, "self_attn.k_norm.weight"))


def stacked_layer(spec: ModelSpec, i: int, family: Any,
                  experts: Callable[[ModelSpec, Any], list[Entry]] | None = None) -> tuple[Entry, ...]:
    """A llama/qwen/mistral layer, with routed experts in place of the MLP for mixtral and qwen3-moe (`experts`:
    a family's own, gpt-oss's)."""
    mlp = (experts or routed_experts)(spec, family) if spec.num_experts else list(DENSE_MLP)
    return (*attention(spec), *mlp, *NORMS, *(QK_NORMS if spec.qk_norm else ()))


def _deepseek_only(spec: ModelSpec) -> bool:
    return not spec.num_experts or not (spec.first_dense_layers or spec.num_shared_experts or spec.kv_lora_rank
                or spec.routing in ("sigmoid_bias", "softmax_greedy"))


def no_biases(spec: ModelSpec) -> bool:
    biases = spec.router_bias or spec.expert_bias or spec.attention_bias or spec.attention_sinks
    return not spec.num_experts or not biases


STACKED_REQUIRES = (
    Requirement(_deepseek_only, lambda s: (
        f"{s.family}: maxckpt's Megatron mapping writes dense leading layers, shared experts, MLA and routing "
        "biases for the DeepSeek-V3 family only")),
    Requirement(no_biases, lambda s: (
        f"{s.family}: router, expert and attention biases and attention sinks are mapped to Megatron for gpt-oss "
        "only")),
)
STACKED = MegatronTable(stacked_layer, requires=STACKED_REQUIRES)


def mla_layer(spec: ModelSpec, i: int, family: Any) -> tuple[Entry, ...]:
    """A DeepSeek-V3 layer: MLA (with a query LoRA or one `linear_q_proj`), then a dense MLP or the routed
    experts with the routing bias and the shared experts (all of them one MLP of width shared x M, as HF has)."""
    attn: list[Entry] = [Same(meg, hf) for meg, hf in MLA_LAYER.items() if spec.q_lora_rank or meg not in MLA_Q_LORA]
    if not spec.q_lora_rank:  # one linear_q_proj, where the query LoRA would be (Megatron's module order)
        attn[1:1] = [Same(meg, hf) for meg, hf in MLA_Q_PROJ.items()]
    if not is_moe_layer(spec, i):
        return (*attn, *DENSE_MLP)
    router, gate, up, down = hf_expert_names(family)
    out: list[Entry] = [*attn, Same(ROUTER, router)]
    if spec.routing == "sigmoid_bias":  # DeepSeek's routing bias: HF's e_score_correction_bias
        out.append(Same(EXPERT_BIAS, "mlp.gate.e_score_correction_bias"))
    out += [Experts(EXP_FC1, (gate, up)), Experts(EXP_FC2, (down,))]
    if spec.num_shared_experts:
        out += [GatedPair(SHARED_FC1, ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")),
                Same(SHARED_FC2, "mlp.shared_experts.down_proj.weight")]
    return tuple(out)


def _yarn(spec: ModelSpec) -> dict[str, Any]:
    return dict(spec.rope_scaling or {})


def _yarn_default_off(spec: ModelSpec) -> str | None:
    """The first YaRN setting Megatron-LM cannot set and this model has otherwise (None: all as Megatron's)."""
    yarn = _yarn(spec)
    return next((k for k, d in MEGATRON_YARN_DEFAULTS.items() if float(yarn.get(k, d)) != float(d)), None)


MLA = MegatronTable(mla_layer, per_layer=True, requires=STACKED_REQUIRES[1:], requires_to_write=(
    Requirement(lambda s: str(_yarn(s).get("rope_type", _yarn(s).get("type"))) == "yarn", lambda s: (
        f"{s.family}: Megatron-Core's MLA takes YaRN rope (rope_type 'yarn'); this model has {_yarn(s) or 'none'}")),
    Requirement(lambda s: _yarn_default_off(s) is None, lambda s: (
        f"{s.family}: YaRN {_yarn_default_off(s)}={_yarn(s)[_yarn_default_off(s)]}, but Megatron-LM takes no flag "
        f"for it and Megatron-Core 0.16's MLATransformerConfig fixes it at "
        f"{MEGATRON_YARN_DEFAULTS[_yarn_default_off(s)]}")),
))


# Every entry of the MLA table, to tell dims from a checkpoint's shapes before the model is known.
MLA_READING: tuple[Entry, ...] = (
    *(Same(meg, hf) for meg, hf in {**MLA_LAYER, **MLA_Q_PROJ}.items()),
    Same(ROUTER, "mlp.gate.weight"), Same(EXPERT_BIAS, "mlp.gate.e_score_correction_bias"), *DENSE_MLP,
    Experts(EXP_FC1, ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight")),
    Experts(EXP_FC2, ("mlp.experts.{e}.down_proj.weight",)),
    GatedPair(SHARED_FC1, ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")),
    Same(SHARED_FC2, "mlp.shared_experts.down_proj.weight"),
)
