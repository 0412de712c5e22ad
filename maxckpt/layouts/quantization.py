"""Recognise quantized HuggingFace checkpoints, which maxckpt refuses until it can dequantize them.

The Hub ships the big models quantized: FP8 block (DeepSeek-V3/R1, Kimi-K2,
Qwen3-*-FP8: `F8_E4M3` weights plus float32 `<weight>_scale_inv` block
scales), MXFP4 (gpt-oss: uint8 `<name>_blocks` plus `<name>_scales`), and the
methods transformers loads through `quantization_config` (awq, gptq,
bitsandbytes, compressed-tensors, nvfp4, ...). Read as they are, their codes
would pass through as weights (FP8 codes are thousands of times too large)
and the scales would be dropped, so every converting command refuses them.

Quantization is recognised from `quantization_config` in config.json (any
`quant_method`) and from the tensors alone (float8 or integer dtypes where
weights belong, scale and packing tensor names), so a checkpoint whose
config.json was stripped is refused too. No file I/O here: callers pass the
tensor infos and the parsed config.json.

>>> import numpy as np, ml_dtypes
>>> from maxckpt.tensors import TensorInfo
>>> infos = {"w.weight": TensorInfo("w.weight", (4, 4), np.dtype(ml_dtypes.float8_e4m3fn))}
>>> quantization(infos, None).method
'FP8: float8_e4m3fn weights; config.json states no quantization_config'
>>> quantization({"w.weight": TensorInfo("w.weight", (4, 4), np.dtype(np.float32))}, {}) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from maxckpt.errors import UnsupportedModelError
from maxckpt.tensors import TensorInfo

# Tensors only quantized checkpoints hold, by name ending: what each tells.
_SCALE_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_scale_inv", "FP8 block"),  # DeepSeek-V3 / Qwen3-FP8: W_f32 = W_fp8 * scale_inv[i // 128, j // 128]
    (".weight_scale", "scaled (compressed-tensors / modelopt)"),
    (".weight_scale_2", "NVFP4"),
    (".weight_global_scale", "NVFP4 (compressed-tensors)"),
    (".input_scale", "scaled (compressed-tensors / modelopt)"),
    (".weight_packed", "packed integer (compressed-tensors)"),
    (".weight_zero_point", "integer (compressed-tensors)"),
    (".qweight", "GPTQ/AWQ"),
    (".qzeros", "GPTQ/AWQ"),
    (".g_idx", "GPTQ"),
    (".SCB", "bitsandbytes int8"),
    (".weight_format", "bitsandbytes int8"),
    (".absmax", "bitsandbytes 4-bit"),
    (".quant_map", "bitsandbytes 4-bit"),
)
_BNB_STATE = ".weight.quant_state."  # bitsandbytes 4-bit: `<weight>.quant_state.bitsandbytes__nf4`


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint is quantized: a readable method and one tensor that shows it (None: none does)."""

    method: str
    tensor: str | None = None
    detail: str = ""  # the tensor's dtype and shape, or why no tensor is named


_LOW_PRECISION = ("float8", "float6", "float4", "int4", "uint4", "int2", "uint2")  # ml_dtypes' code types


def _is_low_precision(dtype: np.dtype) -> bool:
    return np.dtype(dtype).name.startswith(_LOW_PRECISION)


def _weight_like(name: str) -> bool:
    """A name where a model's weight lives (`...proj.weight`, `...bias`, gpt-oss's `experts.gate_up_proj`, codes)."""
    last = name.rsplit(".", 1)[-1]
    return "weight" in last or last == "bias" or last.endswith(("_proj", "_blocks", "_scales"))


def _config_method(config: Mapping[str, Any]) -> str | None:
    """The method config.json's `quantization_config` (or compressed-tensors' older `compression_config`) states."""
    for key in ("quantization_config", "compression_config"):
        qc = config.get(key)
        if qc is None or qc == {}:
            continue
        method = qc.get("quant_method") if isinstance(qc, Mapping) else None
        if not isinstance(method, str) or not method:
            return f"config.json has a {key} without a quant_method"
        if method == "fp8":
            fmt, block = qc.get("fmt", "e4m3"), qc.get("weight_block_size")
            if block:
                return f"FP8 block, quant_method 'fp8', {fmt}, weight_block_size {block}"
            return f"FP8, quant_method 'fp8', {fmt}"
        if method == "mxfp4":
            return "MXFP4, quant_method 'mxfp4'"
        return f"quant_method {method!r}"
    return None


def _code_method(name: str, info: TensorInfo, infos: Mapping[str, TensorInfo]) -> str | None:
    """The method a tensor of quantized codes shows (None: `name` holds no codes)."""
    dtype = np.dtype(info.dtype)
    if name.endswith("_blocks") and name[: -len("_blocks")] + "_scales" in infos:
        return "MXFP4: uint8 *_blocks with *_scales"
    if _is_low_precision(dtype) and not name.endswith(tuple(s for s, _ in _SCALE_SUFFIXES)):
        if name + "_scale_inv" in infos:
            return f"FP8 block: {dtype.name} weights with *_scale_inv block scales"
        return f"FP8: {dtype.name} weights" if dtype.name.startswith("float8") else f"{dtype.name} weights"
    if dtype.kind in "iu" and _weight_like(name):
        return f"integer: {dtype.name} weights"
    return None


def _scale_method(name: str) -> str | None:
    """The method a scale or packing tensor shows (None: `name` is none)."""
    if _BNB_STATE in name:
        return "bitsandbytes 4-bit"
    return next((method for suffix, method in _SCALE_SUFFIXES if name.endswith(suffix)), None)


def quantization(infos: Mapping[str, TensorInfo], config: Mapping[str, Any] | None) -> Quantization | None:
    """How the checkpoint with tensors `infos` and parsed config.json `config` is quantized, or None when it is not.

    The tensor named is the first (by name) holding quantized codes, else the first scale or packing tensor.
    """
    stated = _config_method(config) if isinstance(config, Mapping) else None
    names = sorted(infos)
    found = next(((n, m) for n in names if (m := _code_method(n, infos[n], infos)) is not None), None)
    if found is None:
        found = next(((n, m) for n in names if (m := _scale_method(n)) is not None), None)
    if found is None:
        if stated is None:
            return None
        return Quantization(stated, None, "no tensor looks quantized, but config.json says it is")
    name, seen = found
    info = infos[name]
    shown = f"{np.dtype(info.dtype).name} {list(info.shape)}"
    if stated is None:
        return Quantization(f"{seen}; config.json states no quantization_config", name, shown)
    return Quantization(stated, name, shown)


def refuse_quantized(infos: Mapping[str, TensorInfo], config: Mapping[str, Any] | None, where: str) -> None:
    """Raise UnsupportedModelError when the checkpoint at `where` is quantized (see :func:`quantization`)."""
    q = quantization(infos, config)
    if q is None:
        return
    shown = f"tensor {q.tensor} is {q.detail}" if q.tensor else q.detail
    raise UnsupportedModelError(
        f"{where}: quantized HF checkpoint ({q.method}; {shown}), which maxckpt cannot convert yet: it would write the "
        "quantized codes as weights and drop their scales. Dequantize it to bfloat16 first, e.g. with transformers: "
        "AutoModelForCausalLM.from_pretrained(SRC, quantization_config=FineGrainedFP8Config(dequantize=True)) for FP8, "
        "Mxfp4Config(dequantize=True) for MXFP4 (other methods: their quantizer's dequantize option), then "
        "save_pretrained(DIR) and convert DIR; reading FP8 and MXFP4 checkpoints directly is planned"
    )
