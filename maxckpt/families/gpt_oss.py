"""gpt-oss: attention biases and sinks, sliding/full layer pairs, YaRN, fused MoE with a clamped SwiGLU."""

from __future__ import annotations

from typing import Any, Mapping

from maxckpt.families.base import MOE_BRIDGES, Family
from maxckpt.families.tables.torchtitan import EXPERT_BIAS, KeyGeneration, TorchTitanLayer, standard_layer
from maxckpt.layouts.base import ModelSpec
from maxckpt.families.tables import megatron as mt
from maxckpt.layouts.mapping import Entry, Interleaved, Requirement, Same, Transposed, ZeroBias

NAME = "gpt-oss"
GPT_OSS_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}

# torchtitan gpt_oss: attention biases and sinks, the router with its bias, the experts' biases ...
TORCHTITAN_EXTRAS = (
    Same("attention.qkv_linear.wq.bias", "self_attn.q_proj.bias"),
    Same("attention.qkv_linear.wk.bias", "self_attn.k_proj.bias"),
    Same("attention.qkv_linear.wv.bias", "self_attn.v_proj.bias"),
    Same("attention.wo.bias", "self_attn.o_proj.bias"),
    Same("attention.sinks", "self_attn.sinks"),
    Same("moe.router.gate.weight", "mlp.router.weight"),
    Same("moe.router.gate.bias", "mlp.router.bias"),
    Same("moe.routed_experts.inner_experts.mlp1_bias_EG", "mlp.experts.gate_up_proj_bias"),
    Same("moe.routed_experts.inner_experts.mlp2_bias_ED", "mlp.experts.down_proj_bias"),
)
# ... and the fused experts [X, out, in], transposed against HF's [X, in, out]; the balancing bias must stay zero.
TORCHTITAN_EXPERTS = (
    Transposed("moe.routed_experts.inner_experts.mlp1_weight_EGD", "mlp.experts.gate_up_proj"),
    Transposed("moe.routed_experts.inner_experts.mlp2_weight_EDF", "mlp.experts.down_proj"),
)


def _torchtitan_layer(spec: ModelSpec, keys: KeyGeneration, moe: bool) -> TorchTitanLayer:
    """The standard attention and norms (no dense MLP: every layer is MoE), then gpt-oss's own entries."""
    base = standard_layer(spec, keys, moe=True)
    balance = ZeroBias(EXPERT_BIAS, "HF gpt-oss", guards="mlp.router.weight")
    return TorchTitanLayer((*base.renames, *TORCHTITAN_EXTRAS), (*TORCHTITAN_EXPERTS, balance))


def _megatron_experts(spec: ModelSpec, family: object) -> list[Entry]:
    """The router, the fused experts ([gate; up] rows, down transposed per expert) and their biases."""
    out: list[Entry] = [Same(mt.ROUTER, "mlp.router.weight"), Interleaved(mt.EXP_FC1, "mlp.experts.gate_up_proj"),
                        Transposed(mt.EXP_FC2, "mlp.experts.down_proj")]
    if spec.router_bias:
        out.append(Same(mt.ROUTER_BIAS, "mlp.router.bias"))
    if spec.expert_bias:
        out += [Interleaved(mt.EXP_FC1_BIAS, "mlp.experts.gate_up_proj_bias", bias=True),
                Same(mt.EXP_FC2_BIAS, "mlp.experts.down_proj_bias")]
    return out


def _gpt_oss_layout(spec: ModelSpec) -> bool:
    return spec.sliding_window_pattern in (0, 2) and str(dict(spec.rope_scaling or {}).get("rope_type")) == "yarn"


SWIGLU_LIMIT = 7.0  # the clamp of gpt-oss's GLU (HF swiglu_limit, Megatron activation_func_clamp_value)


def _megatron_run_args(spec: ModelSpec) -> dict[str, Any]:
    """`common.pt` args of a gpt-oss model, under Megatron-Core 0.16.1's TransformerConfig names.

    The window: HF's `sliding_window` W lets a query see W keys (itself and W - 1 before);
    Megatron's `window_size` (left, right) masks keys more than `left` before, so left = W - 1.
    """
    yarn = mt.yarn_values(spec, factor=1.0)
    return dict(
        position_embedding_type="yarn",
        add_bias_linear=spec.expert_bias or spec.attention_bias,
        add_qkv_bias=spec.attention_bias,
        swiglu=False,
        quick_geglu=True,  # gated, activation x * sigmoid(1.702 x): gpt-oss's alpha
        glu_linear_offset=1.0,  # (up + 1)
        activation_func_clamp_value=SWIGLU_LIMIT,
        softmax_type="learnable",
        window_size=(spec.sliding_window - 1, 0) if spec.sliding_window else None,
        window_attn_skip_freq=spec.sliding_window_pattern or None,
        yarn_rotary_scaling_factor=yarn["factor"],
        **{f"yarn_{k}": yarn[k] for k in ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                          "mscale_all_dim")},
        yarn_correction_range_round_to_int=yarn["truncate"],
    )


def _megatron_run_flags(spec: ModelSpec) -> list[str]:
    """The Megatron-LM flags of those args: the clamped quick-GeGLU, sinks, biases, windows, YaRN."""
    oss = _megatron_run_args(spec)
    flags = ["--quick-geglu", "--glu-linear-offset 1",
             f"--activation-func-clamp-value {oss['activation_func_clamp_value']:g}", "--softmax-type learnable",
             "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion"]
    if oss["add_qkv_bias"]:
        flags.append("--add-qkv-bias")
    if not oss["add_bias_linear"]:
        flags.append("--disable-bias-linear")
    if oss["window_size"]:
        flags += [f"--window-size {oss['window_size'][0]},0",
                  f"--window-attn-skip-freq {oss['window_attn_skip_freq']}"]
    flags += [f"--yarn-rotary-scaling-factor {oss['yarn_rotary_scaling_factor']:g}",
              f"--yarn-original-max-position-embeddings {oss['yarn_original_max_position_embeddings']}",
              f"--yarn-beta-fast {oss['yarn_beta_fast']:g}", f"--yarn-beta-slow {oss['yarn_beta_slow']:g}",
              f"--yarn-mscale {oss['yarn_mscale']:g}", f"--yarn-mscale-all-dim {oss['yarn_mscale_all_dim']:g}"]
    if not oss["yarn_correction_range_round_to_int"]:
        flags.append("--no-yarn-correction-range-round-to-int")
    return flags


def _megatron_run_fields(a: Mapping[str, Any]) -> dict[str, Any] | None:
    """gpt-oss's fields from a run's args (learnable softmax offsets, i.e. sinks, with experts): biases,
    windows, YaRN. None: not a gpt-oss run."""
    if a.get("softmax_type") != "learnable" or not a.get("num_experts"):
        return None
    out: dict[str, Any] = {
        "family": NAME, "attention_sinks": True, "attention_bias": bool(a.get("add_qkv_bias")),
        "router_bias": bool(a.get("add_bias_linear")), "expert_bias": bool(a.get("add_bias_linear")),
        "num_experts": int(a["num_experts"]),
    }
    if a.get("moe_router_topk"):
        out["num_experts_per_tok"] = int(a["moe_router_topk"])
    if a.get("moe_ffn_hidden_size"):
        out["moe_mlp_dim"] = out["mlp_dim"] = int(a["moe_ffn_hidden_size"])
    window = a.get("window_size")
    if window:
        out["sliding_window"] = int(window[0]) + 1
        out["sliding_window_pattern"] = int(a.get("window_attn_skip_freq") or 0)
    if a.get("position_embedding_type") == "yarn":
        out["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(a.get("yarn_rotary_scaling_factor") or 1.0),
            "original_max_position_embeddings": int(a.get("yarn_original_max_position_embeddings") or 4096),
            "beta_fast": float(a.get("yarn_beta_fast") or 32.0), "beta_slow": float(a.get("yarn_beta_slow") or 1.0),
            "truncate": bool(a.get("yarn_correction_range_round_to_int", True)),
        }
    return out


MEGATRON = mt.MegatronTable(
    lambda spec, i, family: mt.stacked_layer(spec, i, family, _megatron_experts),
    requires=mt.STACKED_REQUIRES[:1],
    requires_to_write=(Requirement(_gpt_oss_layout, lambda s: (
        f"{s.family}: maxckpt's Megatron mapping takes gpt-oss's layout (sliding window on every other layer, "
        "YaRN rope)")),),
    run_args=_megatron_run_args,
    run_flags=_megatron_run_flags,
    run_fields=_megatron_run_fields,
)

FAMILY = Family(
    name=NAME,
    hf_model_type="gpt_oss",
    hf_architecture="GptOssForCausalLM",
    rope_theta=150_000.0,
    rope_scaling=GPT_OSS_YARN,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    bos_token_id=None,
    eos_token_id=200002,
    maxtext_models=("gpt-oss-20b", "gpt-oss-120b"),
    hf_config_extra={"swiglu_limit": SWIGLU_LIMIT, "router_aux_loss_coef": 0.9, "output_router_logits": False,
                     "initial_context_length": 4096, "pad_token_id": 199999},
    hf_layer_types=True,
    maxtext_scan="blocks",
    maxtext_attention="GptOssAttention",
    maxtext_moe="GptOssMlp",
    hf_experts="fused_interleaved",
    bridges=MOE_BRIDGES + ("megatron", "torchtitan"),
    settings={"routing": "softmax_topk", "num_experts_per_tok": 4, "norm_topk_prob": True,
              "router_bias": True, "expert_bias": True, "attention_bias": True, "attention_sinks": True,
              "sliding_window": 128, "sliding_window_pattern": 2, "activation": "swiglu_oai"},
    hf_num_experts_key="num_local_experts",
    hf_intermediate_size="expert",
    torchtitan_rotary="half",
    torchtitan_model="gpt_oss",
    torchtitan_table=_torchtitan_layer,
    megatron_table=MEGATRON,
    torchtitan_reading=(*TORCHTITAN_EXTRAS, *TORCHTITAN_EXPERTS),
    maxtext_decoder_block="gpt_oss",
    maxtext_settings={"sliding_window_size": ("sliding_window", 0)},
    unshown_settings=("num_experts_per_tok", "sliding_window"),
)
