"""Which Megatron models maxckpt maps: refuse the keys and the saved args of any other, with the reason.

A checkpoint's names (biases, position embeddings, expert layouts) and its run's `common.pt` args
(normalization, activation, rotary) can describe a model HF's Llama family cannot hold; converting it
would silently give wrong logits, so these checks end in an :class:`UnsupportedModelError` instead.

>>> check_supported_args({"normalization": "RMSNorm", "swiglu": True})
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Mapping

from maxckpt.errors import UnsupportedModelError
from maxckpt.families.tables.megatron import SINKS
from maxckpt.families import FAMILIES

__all__ = ["check_supported_args", "check_supported_keys"]


def check_supported_keys(names: Mapping[str, Any]) -> None:
    """Refuse Megatron models outside what maxckpt maps (Llama family, mixtral/qwen3-moe, DeepSeek-V3)."""
    mla = any(n.endswith("self_attention.linear_kv_down_proj.weight") for n in names)
    sinks = any(n.endswith(SINKS) for n in names)  # gpt-oss: its biases are mapped too
    oss_biases = re.compile(
        r"decoder\.layers\.(\d+\.)?(self_attention\.linear_(qkv|proj)|mlp\.router|mlp\.experts\.experts\.linear_fc[12])"
        r"\.bias$"
    )
    per_layer_moe = re.compile(r"decoder\.layers\.(\d+\.)?mlp\.(router\.weight|experts\.experts\.linear_fc[12]\.)")
    deepseek_only = re.compile(r"decoder\.layers\.(\d+\.)?mlp\.(router\.expert_bias|shared_experts\.linear_fc[12]\.)")
    qkv_bias = re.compile(r"decoder\.layers\.(\d+\.)?self_attention\.linear_qkv\.bias$")  # qwen2.5's alone
    for name in names:
        if sinks and oss_biases.match(name):
            continue
        if not sinks and not mla and qkv_bias.match(name):
            continue
        moe_ok = bool(per_layer_moe.match(name)) or (mla and bool(deepseek_only.match(name)))
        if (".mlp.experts." in name or ".mlp.router." in name or ".mlp.shared_experts." in name) and not moe_ok:
            raise UnsupportedModelError(
                f"{name!r}: a Mixture-of-Experts Megatron layout maxckpt does not read (grouped-GEMM experts "
                "outside torch_dist's sharded keys, shared experts or a routing bias outside an MLA model, a "
                "shared-expert gate); it reads the torch_dist expert keys of SequentialMLP, GroupedMLP and "
                "TEGroupedMLP (decoder.layers[.i].mlp.experts.experts.*) of mixtral, qwen3-moe, DeepSeek-V3 and gpt-oss"
            )
        if name.startswith(("decoder.", "output_layer.")) and name.endswith(".bias"):
            raise UnsupportedModelError(
                f"{name!r}: linear biases (--add-bias-linear / --add-qkv-bias) have no place in the "
                "Llama-family models maxckpt converts"
            )
        if name.startswith("embedding.position_embeddings."):
            raise UnsupportedModelError(
                f"{name!r}: learned absolute position embeddings (GPT-2 style); maxckpt converts RoPE models only"
            )


# Megatron args that must have these values for a Llama-family model (None: unset is fine).
_REQUIRED_ARGS: dict[str, tuple[Any, ...]] = {
    "normalization": ("RMSNorm",),
    "swiglu": (True,),
    "position_embedding_type": ("rope",),
    "add_bias_linear": (False,),
    "add_qkv_bias": (False,),
    "rotary_interleaved": (False,),
    "apply_layernorm_1p": (False,),
    "moe_shared_expert_intermediate_size": (None, 0),
}


_GPT_OSS_ARGS = ("swiglu", "position_embedding_type", "add_bias_linear", "add_qkv_bias")


def check_supported_args(args: argparse.Namespace | Mapping[str, Any], where: str = "common.pt") -> None:
    """Refuse a Megatron run whose saved args describe a model outside the Llama family."""
    a = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    for key, allowed in _REQUIRED_ARGS.items():
        if key == "moe_shared_expert_intermediate_size" and a.get("multi_latent_attention"):
            continue  # DeepSeek-V3's shared experts are mapped
        if a.get("softmax_type") == "learnable" and key in _GPT_OSS_ARGS:
            continue  # gpt-oss: biases, quick-GeGLU with offset and clamp, YaRN positions
        if key == "add_qkv_bias" and not a.get("add_bias_linear") and not a.get("multi_latent_attention"):
            continue  # q/k/v biases alone: qwen2.5's
        if key in a and a[key] not in allowed:
            raise UnsupportedModelError(
                f"{where}: the run was trained with {key}={a[key]!r}; maxckpt converts Llama-family models "
                f"({key}={allowed[0]!r}) only"
            )
    rotary_percent = a.get("rotary_percent")
    if rotary_percent not in (None, 1.0, 1):
        raise UnsupportedModelError(
            f"{where}: rotary_percent={rotary_percent}; only full-width RoPE (1.0) is supported"
        )
    if a.get("multi_latent_attention"):
        _check_family_args(a, where, "DeepSeek-V3 (MLA)", {
            "moe_shared_expert_gate": (None, False),
            "moe_router_score_function": ("sigmoid", "softmax"),
            "rope_type": (None, "yarn"),
        })
        if a.get("moe_router_score_function") == "softmax" and not a.get("moe_router_pre_softmax"):
            raise UnsupportedModelError(
                f"{where}: MLA with softmax routing after the top-k (no moe_router_pre_softmax) is not mapped; "
                "DeepSeek-V2 takes the top-k of the softmax over every expert (--moe-router-pre-softmax)"
            )
    if a.get("softmax_type") == "learnable":
        limit = float(FAMILIES["gpt-oss"].hf_config_extra["swiglu_limit"])
        _check_family_args(a, where, "gpt-oss", {
            "quick_geglu": (True,), "glu_linear_offset": (1.0, 1), "activation_func_clamp_value": (limit,),
            "position_embedding_type": ("yarn",),
        })
        window = a.get("window_size")
        if window is not None and tuple(window)[1:] != (0,):
            raise UnsupportedModelError(f"{where}: window_size={window}; gpt-oss's windows look back only (right 0)")


def _check_family_args(a: Mapping[str, Any], where: str, what: str, allowed: Mapping[str, tuple[Any, ...]]) -> None:
    """Refuse a run whose args leave the family maxckpt maps (the HF side could not say it)."""
    for key, values in allowed.items():
        if key in a and a[key] not in values:
            raise UnsupportedModelError(
                f"{where}: the run was trained with {key}={a[key]!r}; maxckpt maps {what} with "
                f"{key}={values[-1]!r} (HF's config cannot state anything else)"
            )
