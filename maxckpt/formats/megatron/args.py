"""The Megatron-LM arguments of a model, both ways: the `args` of `common.pt`, the hand-off flags, and back.

Megatron-LM takes a model's architecture from its command line (or, under `--use-checkpoint-args`, from
the `args` namespace saved in `common.pt`), not from the tensors; a converted checkpoint is only loadable
with the same settings, so writing states them and reading takes the settings shapes cannot tell from
them. Pure: no I/O (the files module writes `common.pt`).

>>> from maxckpt.formats.megatron.layout import MegatronLayout
>>> megatron_args(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250), MegatronLayout()).padded_vocab_size
256
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from maxckpt.errors import UnsupportedModelError
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.megatron.layout import MegatronLayout
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES, LLAMA3_ROPE_SCALING
from maxckpt.families.tables.megatron import yarn_values

__all__ = ["megatron_args", "megatron_cli_flags", "spec_fields_from_megatron_args"]


def megatron_args(spec: ModelSpec, layout: MegatronLayout, *, seq_length: int | None = None) -> argparse.Namespace:
    """The `args` namespace Megatron-LM stores in `common.pt`, with this model's dimensions.

    Megatron-LM reads it to check the run's model flags (`check_checkpoint_args`:
    num_layers, hidden_size, num_attention_heads, add_position_embedding) and
    fills the run's args from it under `--use-checkpoint-args`.
    `no_save_optim`/`no_save_rng` are True because the checkpoint holds neither,
    which tells the loader not to look for RNG state.
    """
    rope = dict(spec.rope_scaling or {})
    rope_type = rope.get("rope_type", rope.get("type"))
    args = argparse.Namespace(
        num_layers=spec.num_layers,
        hidden_size=spec.emb_dim,
        ffn_hidden_size=spec.mlp_dim,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        group_query_attention=spec.num_kv_heads != spec.num_heads,
        kv_channels=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        seq_length=seq_length or spec.max_position_embeddings,
        position_embedding_type="rope",
        add_position_embedding=False,
        use_rotary_position_embeddings=True,
        rotary_base=int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        rotary_percent=1.0,
        rotary_interleaved=False,
        use_rope_scaling=rope_type == "llama3",
        rope_scaling_factor=float(rope.get("factor", 8.0)) if rope_type == "llama3" else 8.0,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,  # qwen2.5's q/k/v biases (gpt-oss's below)
        swiglu=True,
        squared_relu=False,
        untie_embeddings_and_output_weights=not spec.tie_word_embeddings,
        normalization="RMSNorm",
        norm_epsilon=spec.rms_norm_eps,
        apply_layernorm_1p=False,
        qk_layernorm=spec.qk_norm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by,
        vocab_size=spec.vocab_size,  # the true size (Megatron's --vocab-size); the padding is dropped on reading
        padded_vocab_size=layout.padded_vocab_size(spec.vocab_size),
        transformer_impl="transformer_engine" if layout.spec == "te" else "local",
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=1,
        num_experts=spec.num_experts or None,
        moe_router_topk=spec.num_experts_per_tok or 2,
        moe_ffn_hidden_size=spec.moe_mlp_dim or None,
        moe_grouped_gemm=bool(spec.num_experts) and layout.spec == "te",  # the flags below; same keys either way
        moe_router_pre_softmax=False,
        ckpt_format="torch_dist",
        use_dist_ckpt=True,
        no_save_optim=True,
        no_save_rng=True,
        consumed_train_samples=0,
        skipped_train_samples=0,
        consumed_valid_samples=0,
    )
    vars(args).update(_mla_moe_args(spec))  # DeepSeek-V3: MLA, YaRN, dense/MoE pattern, routing
    vars(args).update(_family_args(spec))  # a family's own (gpt-oss: biases, sinks, windows, clamped GLU, YaRN)
    return args


def _family_args(spec: ModelSpec) -> dict[str, Any]:
    """The args the family's Megatron table states for its model (`MegatronTable.run_args`)."""
    run_args = FAMILIES[spec.family].megatron_table.run_args
    return run_args(spec) if run_args else {}


def _moe_layer_freq(spec: ModelSpec) -> list[int]:
    """Megatron's `moe_layer_freq` list: 0 for a dense layer, 1 for a MoE layer."""
    return [int(hfl.is_moe_layer(spec, i)) for i in range(spec.num_layers)]


def _mla_moe_args(spec: ModelSpec) -> dict[str, Any]:
    """`common.pt` args of a DeepSeek-V3 model: MLA dims, YaRN, dense/MoE layer pattern, sigmoid routing."""
    if not spec.kv_lora_rank:
        return {}
    yarn = yarn_values(spec, factor=40.0)
    return dict(
        multi_latent_attention=True,
        q_lora_rank=spec.q_lora_rank or None,  # None: one linear_q_proj (DeepSeek-V2-Lite)
        kv_lora_rank=spec.kv_lora_rank,
        qk_head_dim=spec.qk_nope_head_dim,
        qk_pos_emb_head_dim=spec.qk_rope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_channels=spec.v_head_dim,  # the local core attention's output width per head
        qk_layernorm=True,  # MLA's q_a / kv_a layernorms
        rope_type="yarn",
        rotary_scaling_factor=yarn["factor"],
        **{k: yarn[k] for k in ("mscale", "mscale_all_dim", "original_max_position_embeddings", "beta_fast",
                                "beta_slow")},
        moe_layer_freq=_moe_layer_freq(spec),
        moe_shared_expert_intermediate_size=spec.num_shared_experts * spec.moe_mlp_dim or None,
        moe_router_score_function="sigmoid" if spec.routing == "sigmoid_bias" else "softmax",
        moe_router_enable_expert_bias=spec.routing == "sigmoid_bias",
        moe_router_pre_softmax=spec.routing == "softmax_greedy",  # DeepSeek-V2: top-k of the softmax, not renormalised
        moe_router_topk_scaling_factor=spec.routed_scaling_factor,
        moe_router_num_groups=_router_groups(spec)[0],  # group-limited routing (DeepSeek)
        moe_router_group_topk=_router_groups(spec)[1],
    )


def megatron_cli_flags(spec: ModelSpec, layout: MegatronLayout) -> list[str]:
    """The Megatron-LM command-line flags that build the model this checkpoint holds.

    Megatron-LM takes the architecture from its command line (or from
    `common.pt` under `--use-checkpoint-args`, which does not cover rope
    scaling or q/k layernorm), so the hand-off prints these.

    >>> " ".join(megatron_cli_flags(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250), MegatronLayout(spec="local")))[:60]
    '--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-'
    """
    rope = dict(spec.rope_scaling or {})
    flags = [
        f"--num-layers {spec.num_layers}",
        f"--hidden-size {spec.emb_dim}",
        f"--ffn-hidden-size {spec.mlp_dim}",
        f"--num-attention-heads {spec.num_heads}",
    ]
    if spec.num_kv_heads != spec.num_heads:
        flags += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
    theta = int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta
    flags += [
        f"--kv-channels {spec.v_head_dim if spec.kv_lora_rank else spec.head_dim}",
        f"--max-position-embeddings {spec.max_position_embeddings}",
        f"--position-embedding-type {_family_args(spec).get('position_embedding_type', 'rope')}",
        f"--rotary-base {theta}",
        "--normalization RMSNorm",
        f"--norm-epsilon {spec.rms_norm_eps:g}",
    ]
    run_flags = FAMILIES[spec.family].megatron_table.run_flags
    if run_flags:
        flags += run_flags(spec)
    else:
        flags += ["--swiglu", "--disable-bias-linear"]
        if spec.qkv_bias:
            flags.append("--add-qkv-bias")
    if rope.get("rope_type", rope.get("type")) == "llama3":
        flags += ["--use-rope-scaling", f"--rope-scaling-factor {float(rope.get('factor', 8.0)):g}"]
    if spec.qk_norm:
        flags.append("--qk-layernorm")
    mla = _mla_moe_args(spec)
    if mla:
        flags += [
            "--multi-latent-attention", *([f"--q-lora-rank {spec.q_lora_rank}"] if spec.q_lora_rank else []),
            f"--kv-lora-rank {spec.kv_lora_rank}",
            f"--qk-head-dim {spec.qk_nope_head_dim}", f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}",
            f"--v-head-dim {spec.v_head_dim}", "--qk-layernorm", "--rope-type yarn",
            f"--rotary-scaling-factor {mla['rotary_scaling_factor']:g}", f"--mscale {mla['mscale']:g}",
            f"--mscale-all-dim {mla['mscale_all_dim']:g}",
        ]
    if spec.num_experts:
        flags += [f"--num-experts {spec.num_experts}", f"--moe-router-topk {spec.num_experts_per_tok}",
                  f"--moe-ffn-hidden-size {spec.moe_mlp_dim}"]
        if layout.spec == "te":  # TEGroupedMLP reads SequentialMLP's keys; it runs every family here (bias, GLU clamp)
            flags.append("--moe-grouped-gemm")
        if mla:
            k = spec.first_dense_layers
            flags += [f"--moe-layer-freq '([0]*{k}+[1]*{spec.num_layers - k})'",
                      f"--moe-router-score-function {mla['moe_router_score_function']}",
                      f"--moe-router-topk-scaling-factor {spec.routed_scaling_factor:g}"]
            if mla["moe_router_enable_expert_bias"]:
                flags.append("--moe-router-enable-expert-bias")
            if mla["moe_router_pre_softmax"]:
                flags.append("--moe-router-pre-softmax")
            if spec.n_group > 1:
                flags += [f"--moe-router-num-groups {spec.n_group}", f"--moe-router-group-topk {spec.topk_group}"]
            if spec.num_shared_experts:
                flags.append(f"--moe-shared-expert-intermediate-size {mla['moe_shared_expert_intermediate_size']}")
        else:
            flags.append("--moe-router-score-function softmax")
    if not spec.tie_word_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    flags += [
        f"--make-vocab-size-divisible-by {layout.make_vocab_size_divisible_by}",
        f"--transformer-impl {'transformer_engine' if layout.spec == 'te' else 'local'}",
        "--ckpt-format torch_dist",
    ]
    return flags


def spec_fields_from_megatron_args(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields Megatron's saved args tell (dims, heads, tie, rope, eps, qk norm), plus `family`.

    The true vocabulary size is there only when the run set `--vocab-size`
    (maxckpt's own output does); otherwise take it from an HF config or a flag.
    The family is stated when the args pin it: q/k layernorm means qwen3,
    llama3 rope scaling means llama3.1.
    """
    a = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    out: dict[str, Any] = {}

    def put(field: str, key: str, fn=lambda v: v) -> None:
        if a.get(key) is not None:
            out[field] = fn(a[key])

    put("num_layers", "num_layers", int)
    put("vocab_size", "vocab_size", int)
    put("emb_dim", "hidden_size", int)
    put("mlp_dim", "ffn_hidden_size", int)
    put("num_heads", "num_attention_heads", int)
    if a.get("group_query_attention") and a.get("num_query_groups"):
        out["num_kv_heads"] = int(a["num_query_groups"])
    elif "num_heads" in out:
        out["num_kv_heads"] = out["num_heads"]
    if a.get("kv_channels"):
        out["head_dim"] = int(a["kv_channels"])
    elif "emb_dim" in out and "num_heads" in out:
        out["head_dim"] = out["emb_dim"] // out["num_heads"]
    if "untie_embeddings_and_output_weights" in a:
        out["tie_word_embeddings"] = not a["untie_embeddings_and_output_weights"]
    put("rope_theta", "rotary_base", float)
    put("rms_norm_eps", "norm_epsilon", float)
    put("max_position_embeddings", "max_position_embeddings", int)
    if "qk_layernorm" in a:
        out["qk_norm"] = bool(a["qk_layernorm"])
    if a.get("use_rope_scaling"):
        out["rope_scaling"] = {**LLAMA3_ROPE_SCALING, "factor": float(a.get("rope_scaling_factor") or 8.0)}
        out["family"] = "llama3.1"
    if out.get("qk_norm"):
        out["family"] = "qwen3"
    biased = next((f.name for f in FAMILIES.values() if f.settings.get("qkv_bias")), None)
    if a.get("add_qkv_bias") and not a.get("add_bias_linear") and a.get("softmax_type") != "learnable" and biased:
        out.update(qkv_bias=True, family=biased)  # q/k/v biases alone: qwen2.5
    if a.get("multi_latent_attention"):
        return {**out, **_mla_spec_fields(a)}
    for family in FAMILIES.values():  # a family's own settings (gpt-oss: learnable softmax offsets with experts)
        run_fields = family.megatron_table.run_fields
        fields = run_fields(a) if run_fields else None
        if fields is not None:
            return {**out, **fields}
    if a.get("num_experts"):
        out["num_experts"] = int(a["num_experts"])
        put("num_experts_per_tok", "moe_router_topk", int)
        put("moe_mlp_dim", "moe_ffn_hidden_size", int)
        if "moe_mlp_dim" in out:
            out["mlp_dim"] = out["moe_mlp_dim"]
        out["family"] = "qwen3-moe" if out.get("qk_norm") else "mixtral"
    return out


def _mla_spec_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3 fields from a multi-latent-attention run's args (qk_layernorm there is MLA's, not qwen3's)."""
    heads = int(a["num_attention_heads"])
    out: dict[str, Any] = {
        "family": "deepseek3", "qk_norm": False, "num_kv_heads": heads,
        "q_lora_rank": int(a.get("q_lora_rank") or 0), "kv_lora_rank": int(a["kv_lora_rank"]),
        "qk_nope_head_dim": int(a["qk_head_dim"]), "qk_rope_head_dim": int(a["qk_pos_emb_head_dim"]),
        "v_head_dim": int(a["v_head_dim"]), "head_dim": int(a["qk_pos_emb_head_dim"]),
    }
    if a.get("rope_type", "yarn") == "yarn":
        out["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(a.get("rotary_scaling_factor") or 40.0),
            "original_max_position_embeddings": int(a.get("original_max_position_embeddings") or 4096),
            "beta_fast": float(a.get("beta_fast") or 32.0), "beta_slow": float(a.get("beta_slow") or 1.0),
            "mscale": float(a.get("mscale") or 1.0), "mscale_all_dim": float(a.get("mscale_all_dim") or 0.0),
            "truncate": True,
        }
    if a.get("num_experts"):
        out["num_experts"] = int(a["num_experts"])
        if a.get("moe_router_topk"):
            out["num_experts_per_tok"] = int(a["moe_router_topk"])
        moe = int(a.get("moe_ffn_hidden_size") or 0)
        if moe:
            out["moe_mlp_dim"] = moe
            out["num_shared_experts"] = int(a.get("moe_shared_expert_intermediate_size") or 0) // moe
        freq = a.get("moe_layer_freq")
        if isinstance(freq, (list, tuple)):
            out["first_dense_layers"] = next((i for i, f in enumerate(freq) if f), len(freq))
        if a.get("moe_router_score_function") == "sigmoid" and a.get("moe_router_enable_expert_bias"):
            out["routing"] = "sigmoid_bias"
        if a.get("moe_router_score_function") == "softmax" and a.get("moe_router_pre_softmax"):
            greedy = next((f.name for f in FAMILIES.values()
                           if f.attention == "mla" and f.settings.get("routing") == "softmax_greedy"), None)
            out.update(routing="softmax_greedy", norm_topk_prob=False, **({"family": greedy} if greedy else {}))
        if a.get("moe_router_topk_scaling_factor") is not None:
            out["routed_scaling_factor"] = float(a["moe_router_topk_scaling_factor"])
        if (a.get("moe_router_num_groups") or 1) > 1:
            out["n_group"] = int(a["moe_router_num_groups"])
            out["topk_group"] = int(a.get("moe_router_group_topk") or 1)
            if int(a.get("moe_router_topk") or 0) != 2 * out["topk_group"]:
                raise UnsupportedModelError(
                    f"the run routes with moe_router_num_groups={out['n_group']}, moe_router_group_topk="
                    f"{out['topk_group']} and moe_router_topk={a.get('moe_router_topk')}: Megatron scores each group "
                    "by its top topk // group_topk experts, DeepSeek (HF, MaxText) by its top 2, which agree only "
                    "when moe_router_topk = 2 * moe_router_group_topk; this run's routing has no HF equivalent"
                )
    return out


def _router_groups(spec: ModelSpec) -> tuple[int | None, int | None]:
    """Megatron's moe_router_num_groups / moe_router_group_topk for the spec's group-limited routing.

    Megatron scores a group by the sum of its top (topk // group_topk) expert scores, DeepSeek (HF,
    MaxText) by its top 2: the two route alike only when top-k = 2 * topk_group (DeepSeek-V3: 8 = 2 * 4).
    """
    if spec.n_group <= 1:
        return None, None
    if spec.num_experts_per_tok != 2 * spec.topk_group:
        raise UnsupportedModelError(
            f"group-limited routing with n_group={spec.n_group}, topk_group={spec.topk_group} and top-k "
            f"{spec.num_experts_per_tok}: Megatron-Core scores each group by its top {spec.num_experts_per_tok} // "
            f"{spec.topk_group} experts, DeepSeek by its top 2, so Megatron would route this model differently; "
            "they agree only when top-k = 2 * topk_group. Convert to hf, torch or maxtext instead"
        )
    return spec.n_group, spec.topk_group

