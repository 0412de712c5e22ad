"""Tiny quantized checkpoints in the Hub's own layouts (FORMATS.md section 8), built with maxckpt's quantizers.

- Qwen3-*-FP8 (dense): every linear of the layers as F8_E4M3 plus float32 `<weight>_scale_inv`
  [ceil(out/128), ceil(in/128)]; mlp_dim 160 makes partial last blocks (128 + 32 rows or columns).
- DeepSeek-V3/R1 FP8: MLA, a dense layer then MoE with a shared expert and the routing bias; the
  router gate, norms, embeddings and lm_head unquantized. Every dim is a multiple of 128 or at most
  128, where transformers' dequantizer (block = shape / scale grid) agrees with DeepSeek's definition.
- gpt-oss MXFP4: the experts' gate_up_proj/down_proj as uint8 `_blocks` [E, out, in/32, 16] and
  `_scales` [E, out, in/32], the rest bfloat16.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np

from conversion_models import tiny_spec
from maxckpt.containers.safetensors import SafetensorsWriter
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.config import config_json
from maxckpt.formats.hf.quantization import quantize_fp8_block, quantize_mxfp4

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
MXFP4_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}

QWEN3 = replace(tiny_spec("qwen3"), mlp_dim=160)  # 160 = one full and one partial 128-block
DEEPSEEK3 = replace(
    tiny_spec("deepseek3"), emb_dim=256, mlp_dim=256, num_heads=2, num_kv_heads=2, num_experts=4, num_experts_per_tok=2,
    moe_mlp_dim=32, num_shared_experts=1, first_dense_layers=1, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=16, head_dim=24,
)
GPT_OSS = replace(tiny_spec("gpt-oss"), emb_dim=64, mlp_dim=64, moe_mlp_dim=64, num_experts=4, num_experts_per_tok=2)


def write_hf(root: Path, tensors: dict[str, np.ndarray], config: dict | None) -> Path:
    """One model.safetensors (maxckpt's writer: it stores F8_E4M3, which safetensors.numpy cannot) + config.json."""
    root.mkdir(parents=True)
    w = SafetensorsWriter(root)
    for name, value in tensors.items():
        w.write(name, value)
    w.close()
    if config is not None:
        (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        base = 1.0 if "norm" in name else 0.0
        dtype = np.float32 if name.endswith("e_score_correction_bias") else BF16
        fan_in = shape[1] if len(shape) == 3 and "experts" in name else shape[-1]  # gpt-oss experts are [E, in, out]
        out[name] = (base + rng.standard_normal(shape) / math.sqrt(fan_in)).astype(dtype)
    return out


def fp8_quantized(tensors: dict[str, np.ndarray], keep) -> dict[str, np.ndarray]:
    """Every 2-D weight except those `keep(name)` accepts, as FP8 codes plus `<name>_scale_inv`."""
    out = {}
    for name, value in tensors.items():
        if value.ndim == 2 and name.endswith(".weight") and not keep(name):
            out[name], out[name + "_scale_inv"] = quantize_fp8_block(value.astype(np.float32))
        else:
            out[name] = value
    return out


def qwen3_bf16(root: Path) -> Path:
    return write_hf(root, random_tensors(hfl.expected_tensors(QWEN3)), config_json(QWEN3, BF16))


def qwen3_fp8(root: Path, *, config: bool = True, quantization_config: bool = True) -> Path:
    """Qwen3-*-FP8: every linear of the layers in F8_E4M3 with `_scale_inv`; embeddings and norms not."""
    tensors = fp8_quantized(random_tensors(hfl.expected_tensors(QWEN3)), keep=lambda n: not n.startswith("model.layers."))
    cfg = config_json(QWEN3, BF16)
    if quantization_config:
        cfg["quantization_config"] = dict(FP8_CONFIG)
    return write_hf(root, tensors, cfg if config else None)


def deepseek_v3_fp8(root: Path) -> Path:
    """DeepSeek-V3/R1: MLA, a dense layer then MoE with a shared expert; the router gate and norms stay unquantized."""
    tensors = fp8_quantized(
        random_tensors(hfl.expected_tensors(DEEPSEEK3)),
        keep=lambda n: n in ("model.embed_tokens.weight", "lm_head.weight") or n.endswith("mlp.gate.weight"),
    )
    cfg = config_json(DEEPSEEK3, BF16)
    cfg["quantization_config"] = dict(FP8_CONFIG)
    return write_hf(root, tensors, cfg)


def gpt_oss_mxfp4(root: Path) -> Path:
    """gpt-oss: experts' gate_up_proj [E, H, 2I] and down_proj [E, I, H] as MXFP4 `_blocks`/`_scales`, the rest bf16."""
    tensors = {}
    for name, value in random_tensors(hfl.expected_tensors(GPT_OSS)).items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(value.astype(np.float32))
        else:
            tensors[name] = value
    cfg = config_json(GPT_OSS, BF16)
    cfg["quantization_config"] = dict(MXFP4_CONFIG)
    return write_hf(root, tensors, cfg)
