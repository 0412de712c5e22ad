"""Architecture hyperparameters of MaxText's MoE, MLA and Gemma decoders, as one frozen record.

The reference forward of these families (:mod:`maxckpt.reference.families_forward`)
needs a handful of facts the parameter shapes cannot tell: epsilons, rotary
bases and scalings, softcaps, windows, routing rules. :class:`ArchConfig`
holds them; field names follow the HF `config.json` names where HF has one,
so that a caller holding an HF config or a conversion-side family record can
fill it from a plain mapping (:meth:`ArchConfig.from_mapping`).

:func:`infer_arch` builds one from a MaxText parameter dict and a family name:
dimensions come from the shapes, everything else from the family's preset,
which holds the values MaxText's own model configs use (`mixtral-8x7b`,
`qwen3-30b-a3b`, `gemma2-2b`, `gemma3-4b`, `gpt-oss-20b`, `deepseek3-671b`).
The number of experts per token is not visible in any shape; pass it when
it differs from the full-size model's.

>>> arch = infer_arch("mixtral", params, num_experts_per_tok=2)   # doctest: +SKIP
>>> arch.num_local_experts, arch.layer_types[:2]                   # doctest: +SKIP
(4, ('full_attention', 'full_attention'))
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from maxckpt.errors import ConfigError, CorruptCheckpointError, UnsupportedModelError
from maxckpt.reference.stacks import layer_groups

Kind = Literal["mixtral", "qwen3_moe", "gemma2", "gemma3", "gpt_oss", "deepseek3"]
KINDS: tuple[str, ...] = ("mixtral", "qwen3_moe", "gemma2", "gemma3", "gpt_oss", "deepseek3")

# Names users and the conversion side may give a family, mapped to the kind.
_ALIASES = {
    "mixtral": "mixtral", "mixtral8x7b": "mixtral", "mixtral8x22b": "mixtral",
    "qwen3moe": "qwen3_moe", "qwen330ba3b": "qwen3_moe", "qwen3235ba22b": "qwen3_moe",
    "gemma2": "gemma2", "gemma22b": "gemma2", "gemma29b": "gemma2", "gemma227b": "gemma2",
    "gemma3": "gemma3", "gemma3text": "gemma3", "gemma34b": "gemma3", "gemma312b": "gemma3", "gemma327b": "gemma3",
    "gemma31b": "gemma3",
    "gptoss": "gpt_oss", "gptoss20b": "gpt_oss", "gptoss120b": "gpt_oss",
    "deepseek3": "deepseek3", "deepseekv3": "deepseek3", "deepseek3671b": "deepseek3",
}


def family_kind(name: str) -> str:
    """The reference's kind for a family or MaxText model name (`gpt-oss-20b` -> `gpt_oss`).

    Raises UnsupportedModelError for a name the reference has no forward for.
    """
    key = "".join(c for c in name.lower() if c.isalnum())
    if key in _ALIASES:
        return _ALIASES[key]
    for alias, kind in sorted(_ALIASES.items(), key=lambda kv: -len(kv[0])):
        if key.startswith(alias):
            return kind
    raise UnsupportedModelError(
        f"no reference forward for model family {name!r}; known: {', '.join(KINDS)} "
        "(the Llama family has maxckpt.reference.forward)"
    )


@dataclass(frozen=True)
class ArchConfig:
    """What MaxText's forward of one MoE/MLA/Gemma model needs beyond its parameters.

    Hashable (tuples only), so it can be a static argument of `jax.jit`.
    """

    #: Which decoder: one of KINDS.
    family: str
    #: Model width (MaxText `emb_dim`).
    hidden_size: int
    #: Number of decoder layers counted as HF counts them (a gemma2 MaxText layer is two).
    num_hidden_layers: int
    #: Query heads.
    num_attention_heads: int
    #: Key/value heads (grouped-query attention); MLA has one per query head.
    num_key_value_heads: int
    #: Per-head width of q/k/v (GQA families); unused by MLA.
    head_dim: int
    #: Vocabulary size.
    vocab_size: int
    #: RMSNorm epsilon, for every norm in the model (MaxText `normalization_layer_epsilon`).
    rms_norm_eps: float
    #: Hidden width of the dense (non-expert) MLP; 0 when every layer is MoE.
    intermediate_size: int = 0
    #: Activation of gated MLPs: "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU).
    hidden_act: str = "silu"

    # ---- attention
    #: Per HF layer: "full_attention" or "sliding_attention" (as HF's `layer_types`).
    layer_types: tuple[str, ...] = ()
    #: Window of sliding layers: query i sees keys j with i - j < sliding_window.
    sliding_window: int | None = None
    #: Where 1/sqrt(d) lives: "kernel" means MaxText folded it into `query/kernel`
    #: (mixtral, gemma2); "runtime" means q is multiplied by query_pre_attn_scalar**-0.5
    #: after the q/k norm and RoPE (qwen3-moe, gemma3, gpt-oss); MLA always scales at runtime.
    query_scale: str = "kernel"
    #: The d in the runtime query scale d**-0.5 (HF's `query_pre_attn_scalar`); None = head_dim.
    query_pre_attn_scalar: float | None = None
    #: Per-head RMSNorm of q and k before RoPE (`query_norm`, `key_norm`).
    qk_norm: bool = False
    #: Attention logits become cap*tanh(s/cap) (gemma2: 50); None = off.
    attn_logit_softcapping: float | None = None
    #: q/k/v/out projections carry biases (gpt-oss).
    attention_bias: bool = False
    #: One learned logit per head joins each softmax denominator (gpt-oss `sinks`).
    attention_sinks: bool = False

    # ---- rotary
    #: Rotary base of full-attention layers (and of every layer unless rope_local_base_freq is set).
    rope_theta: float = 10_000.0
    #: Rotary base of sliding layers where it differs (gemma3: 1e4 local vs 1e6 global).
    rope_local_base_freq: float | None = None
    #: HF-style rope_scaling of full-attention layers: None, {"rope_type": "linear", "factor": f}
    #: (positions / f, gemma3 global layers) or {"rope_type": "yarn", "factor", "original_max_position_embeddings",
    #: "beta_fast", "beta_slow", "truncate", "attention_factor"} with HF's meanings (attention_factor multiplies
    #: cos/sin; absent = HF's default, 0.1*ln(factor) + 1, or the mscale/mscale_all_dim ratio when those are
    #: given); stored as sorted (key, value) pairs.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    #: Whether YaRN rotates interleaved pairs (x0,x1),(x2,x3)... (deepseek3) instead of halves.
    rope_interleave: bool = False

    # ---- normalisation and output
    #: Gemma's sandwich: post-attention and post-MLP norms on the branch before each residual add.
    sandwich_norms: bool = False
    #: Logits through the embedding table (no `logits_dense`).
    tie_word_embeddings: bool = False
    #: Tied logits are divided by sqrt(hidden_size) (MaxText `normalize_embedding_logits`, Gemma).
    normalize_embedding_logits: bool = False
    #: Final logits become cap*tanh(l/cap) (gemma2: 30); None = off.
    final_logit_softcapping: float | None = None

    # ---- mixture of experts
    #: Routed experts per MoE layer (0 = dense model).
    num_local_experts: int = 0
    #: Experts each token is routed to (top-k).
    num_experts_per_tok: int = 0
    #: Hidden width of one routed expert.
    moe_intermediate_size: int = 0
    #: "softmax_topk": top-k of the router logits, softmax over those k (mixtral, qwen3-moe, gpt-oss);
    #: "sigmoid_bias": sigmoid scores, top-k of score + routing bias, weights = chosen scores (deepseek3).
    scoring_func: str = "softmax_topk"
    #: deepseek3 group-limited routing (MaxText `n_routing_groups`, -1 there = 1 here = off): experts
    #: split into n_group groups scored by the sum of their top-2 biased scores ...
    n_group: int = 1
    #: ... and only the best topk_group groups (MaxText `topk_routing_group`) may be chosen from.
    topk_group: int = 1
    #: Renormalise the chosen weights to sum 1 (deepseek3; softmax over the top-k already does).
    norm_topk_prob: bool = True
    #: Multiplier of the routed experts' weights (deepseek3: 2.5).
    routed_scaling_factor: float = 1.0
    #: Shared experts added to every token's routed output (deepseek3: 1).
    n_shared_experts: int = 0
    #: Leading dense layers before the MoE layers (deepseek3's `first_num_dense_layers`).
    first_k_dense_replace: int = 0
    #: gpt-oss's clamped SwiGLU: gate <= limit, -limit <= up <= limit; None = plain SwiGLU.
    swiglu_limit: float | None = None
    #: gpt-oss's SwiGLU: gate * sigmoid(alpha * gate) * (up + 1).
    swiglu_alpha: float = 1.702

    # ---- multi-head latent attention (deepseek3)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    #: YaRN's mscale_all_dim: the softmax scale is qk_head_dim**-0.5 * m**2, m = 0.1*mscale*ln(factor) + 1.
    mscale_all_dim: float = 1.0

    # ---------------------------------------------------------------- helpers

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling or ())

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, strict: bool = True) -> "ArchConfig":
        """An ArchConfig from plain fields (e.g. built from a family record or HF config values).

        Lists become tuples and a rope_scaling dict becomes sorted pairs. With
        strict=True an unknown key is a ConfigError (a misspelt field would
        otherwise silently keep its default); strict=False ignores it.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(mapping) - names)
        if unknown and strict:
            raise ConfigError(f"unknown ArchConfig field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        values = {k: v for k, v in mapping.items() if k in names}
        if "family" in values:
            values["family"] = family_kind(str(values["family"]))
        if isinstance(values.get("layer_types"), (list, tuple)):
            values["layer_types"] = tuple(values["layer_types"])
        scaling = values.get("rope_scaling")
        if isinstance(scaling, Mapping):
            values["rope_scaling"] = tuple(sorted(scaling.items()))
        elif isinstance(scaling, (list, tuple)):  # pairs, e.g. asdict() through JSON
            values["rope_scaling"] = tuple(sorted((str(k), v) for k, v in scaling))
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise ConfigError(f"ArchConfig needs {', '.join(missing)}")
        arch = cls(**values)
        arch.check()
        return arch

    def replace(self, **changes: Any) -> "ArchConfig":
        """A copy with some fields changed (same normalisation as from_mapping)."""
        return ArchConfig.from_mapping({**dataclasses.asdict(self), **changes})

    def check(self) -> None:
        """Raise ConfigError when the fields cannot describe a model the forward can run."""
        if self.family not in KINDS:
            raise ConfigError(f"ArchConfig.family {self.family!r} is not one of {', '.join(KINDS)}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"ArchConfig.layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        if self.is_moe and not 0 < self.num_experts_per_tok <= self.num_local_experts:
            raise ConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be between 1 and "
                f"num_local_experts={self.num_local_experts} (no tensor shows it: pass the value the model "
                "was trained with, e.g. infer_arch(..., num_experts_per_tok=2))"
            )
        if self.n_group > 1 and (self.num_local_experts % self.n_group or not 0 < self.topk_group <= self.n_group):
            raise ConfigError(
                f"group-limited routing needs n_group ({self.n_group}) to divide num_local_experts "
                f"({self.num_local_experts}) and 1 <= topk_group ({self.topk_group}) <= n_group"
            )
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ConfigError("sliding_attention layers need ArchConfig.sliding_window")


# ------------------------------------------------------------------ presets

def _yarn(factor: float, original: int, truncate: bool, **extra: Any) -> dict[str, Any]:
    return {
        "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": truncate, **extra,
    }


# Values from MaxText's model configs (src/MaxText/configs/models/<name>.yml), the ones the
# fixtures in shared/fixtures/maxtext were trained with; settled by their logits.
PRESETS: dict[str, dict[str, Any]] = {
    "mixtral": dict(rms_norm_eps=1e-5, rope_theta=1e6, query_scale="kernel", num_experts_per_tok=2),
    "qwen3_moe": dict(rms_norm_eps=1e-6, rope_theta=1e7, query_scale="runtime", qk_norm=True,
                      num_experts_per_tok=8, norm_topk_prob=True),
    "gemma2": dict(rms_norm_eps=1e-6, rope_theta=1e4, query_scale="kernel", hidden_act="gelu_pytorch_tanh",
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
                   sandwich_norms=True, tie_word_embeddings=True, normalize_embedding_logits=True),
    "gemma3": dict(rms_norm_eps=1e-6, rope_theta=1e6, rope_local_base_freq=1e4,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}, query_scale="runtime", qk_norm=True,
                   hidden_act="gelu_pytorch_tanh", sliding_window=1024, sandwich_norms=True,
                   tie_word_embeddings=True, normalize_embedding_logits=True),
    "gpt_oss": dict(rms_norm_eps=1e-5, rope_theta=150_000.0, rope_scaling=_yarn(32.0, 4096, False),
                    query_scale="runtime", attention_bias=True, attention_sinks=True, sliding_window=128,
                    num_experts_per_tok=4, swiglu_limit=7.0, swiglu_alpha=1.702),
    "deepseek3": dict(rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=_yarn(40.0, 4096, True, attention_factor=1.0),
                      rope_interleave=True, query_scale="runtime", num_experts_per_tok=8,
                      scoring_func="sigmoid_bias", norm_topk_prob=True, routed_scaling_factor=2.5, mscale_all_dim=1.0),
}


def layer_types_for(kind: str, num_layers: int) -> tuple[str, ...]:
    """HF-style attention type of each layer, as MaxText alternates them.

    gemma2 and gpt-oss alternate sliding (even HF index) and full (odd);
    gemma3 repeats 5 sliding then 1 full (`GEMMA3_ATTENTION_PATTERN`); the rest are full.
    """
    if kind in ("gemma2", "gpt_oss"):
        return tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers))
    if kind == "gemma3":
        return tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(num_layers))
    return ("full_attention",) * num_layers


def infer_arch(family: str, params: Mapping[str, np.ndarray], **overrides: Any) -> ArchConfig:
    """The ArchConfig of a MaxText parameter dict: dims from shapes, the rest from the family preset.

    `params` are MaxText paths without `params/params/` (scanned or unscanned),
    as :func:`maxckpt.reference.reading.read_maxtext_params` returns them.
    `overrides` replace any field (typically `num_experts_per_tok`, which no
    shape shows, or a preset value a fine-tuned model changed).
    """
    kind = family_kind(family)
    try:
        return _infer(kind, family, params, overrides)
    except KeyError as err:
        raise UnsupportedModelError(
            f"the parameters do not look like a {kind} model in MaxText's layout (no {err.args[0]!r} in a layer); "
            "check the family name"
        ) from err


def _infer(kind: str, family: str, params: Mapping[str, np.ndarray], overrides: Mapping[str, Any]) -> ArchConfig:
    shapes = {n: tuple(np.shape(a)) for n, a in params.items()}
    if "token_embedder/embedding" not in shapes:
        raise CorruptCheckpointError("no token_embedder/embedding among the parameters: not a MaxText decoder")
    vocab, emb = shapes["token_embedder/embedding"]
    groups = layer_groups(kind, params)
    first = groups[0].params(params)
    values: dict[str, Any] = dict(PRESETS[kind])
    values.update(family=kind, hidden_size=emb, vocab_size=vocab, num_hidden_layers=len(groups))
    values["tie_word_embeddings"] = "decoder/logits_dense/kernel" not in shapes

    def dense_width(layer: Mapping[str, np.ndarray]) -> int:
        return int(layer["mlp/wi_0/kernel"].shape[-1])

    if kind == "deepseek3":
        att = first
        q_lora, heads, qk = att["self_attention/wq_b/kernel"].shape
        kv_lora = att["self_attention/kv_norm/scale"].shape[0]
        rope = att["self_attention/wkv_a/kernel"].shape[-1] - kv_lora
        v_dim = att["self_attention/wkv_b/kernel"].shape[-1] - (qk - rope)
        dense = [g for g in groups if not g.moe]
        moe = [g for g in groups if g.moe]
        values.update(
            num_attention_heads=heads, num_key_value_heads=heads, head_dim=qk, q_lora_rank=q_lora,
            kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope, v_head_dim=v_dim,
            first_k_dense_replace=len(dense),
            intermediate_size=dense_width(dense[0].params(params)) if dense else 0,
        )
        if moe:
            m = moe[0].params(params)
            values.update(
                num_local_experts=m["DeepSeekMoeBlock_0/MoeBlock_0/wi_0"].shape[0],
                moe_intermediate_size=m["DeepSeekMoeBlock_0/MoeBlock_0/wi_0"].shape[-1],
                n_shared_experts=m["DeepSeekMoeBlock_0/shared_experts/wi_0/kernel"].shape[-1]
                // m["DeepSeekMoeBlock_0/MoeBlock_0/wi_0"].shape[-1],
            )
    else:
        att_prefix = "GptOssAttention" if kind == "gpt_oss" else "self_attention"
        _, heads, head_dim = first[f"{att_prefix}/query/kernel"].shape
        values.update(
            num_attention_heads=heads,
            num_key_value_heads=first[f"{att_prefix}/key/kernel"].shape[1],
            head_dim=head_dim,
        )
        moe_prefix = {"mixtral": "MoeBlock_0", "qwen3_moe": "moe_block", "gpt_oss": "GptOssMlp"}.get(kind)
        if moe_prefix:
            values.update(
                num_local_experts=first[f"{moe_prefix}/wi_0"].shape[0],
                moe_intermediate_size=first[f"{moe_prefix}/wi_0"].shape[-1],
            )
        else:
            values["intermediate_size"] = dense_width(first)
    if kind == "gemma3" and "27b" in family.lower():
        # MaxText's get_query_pre_attn_scalar: gemma3-27b scales q by (emb // heads)**-0.5, not head_dim.
        values["query_pre_attn_scalar"] = emb // values["num_attention_heads"]
    values["layer_types"] = layer_types_for(kind, values["num_hidden_layers"])
    values.update(overrides)
    return ArchConfig.from_mapping(values)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


__all__ = ["ArchConfig", "KINDS", "PRESETS", "family_kind", "infer_arch", "layer_types_for", "yarn_mscale"]
