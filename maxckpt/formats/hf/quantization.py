"""Quantized HuggingFace checkpoints: FP8 block and MXFP4 read dequantized and written; every other method refused.

The Hub ships the big models quantized: FP8 block (DeepSeek-V3/R1, Kimi-K2,
Qwen3-*-FP8: `F8_E4M3` weights plus float32 `<weight>_scale_inv` block
scales), MXFP4 (gpt-oss: uint8 `<name>_blocks` plus `<name>_scales`), and the
methods transformers loads through `quantization_config` (awq, gptq,
bitsandbytes, compressed-tensors, nvfp4, ...).

Quantization is recognised from `quantization_config` in config.json (any
`quant_method`) and from the tensors alone (float8 or integer dtypes where
weights belong, scale and packing tensor names), so a checkpoint whose
config.json was stripped is recognised too (:func:`quantization`).
:func:`dequantization_plan` accepts two methods and refuses the rest with one
message naming the method and a tensor:

- FP8 block (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [b0, b1]`):
  `W[i, j] = float32(code[i, j]) * scale_inv[i // b0, j // b1]`, the last blocks
  cropped (DeepSeek-V3's 576-row kv_a_proj_with_mqa is 4.5 blocks);
- MXFP4 (`quant_method: mxfp4`, gpt-oss experts): two FP4 e2m1 codes a byte,
  low nibble first, times 2**(scale - 127) per 32 values, then the last two axes
  swapped (transformers' `convert_moe_packed_tensors`).

Both products are exact in float32 (:class:`DequantizingReader` presents them
under the plain names, one tensor, row range or expert at a time), so casting
to bfloat16 rounds once, as transformers does. FP8 without a block size, codes
without their scales, scales of another shape or dtype, and stray scale
tensors are refused. :func:`quantize_tensors` writes both layouts back (FP8:
scale = block amax / 448; MXFP4: exponent floor(log2(amax)) - 2); values that
came from such a checkpoint unchanged give back its codes. No file I/O here.

>>> import numpy as np, ml_dtypes
>>> from maxckpt.tensors import TensorInfo
>>> infos = {"w.weight": TensorInfo("w.weight", (4, 4), np.dtype(ml_dtypes.float8_e4m3fn))}
>>> quantization(infos, None).method
'FP8: float8_e4m3fn weights; config.json states no quantization_config'
>>> quantization({"w.weight": TensorInfo("w.weight", (4, 4), np.dtype(np.float32))}, {}) is None
True
>>> codes, scale_inv = quantize_fp8_block(np.full((3, 130), 0.5, np.float32))
>>> scale_inv.shape, float(dequantize_fp8(codes, scale_inv, (128, 128))[2, 129])
((1, 2), 0.5)
"""

from __future__ import annotations

from collections.abc import Mapping
import threading
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from maxckpt.errors import UnsupportedModelError
from maxckpt.families import FAMILIES
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


# ------------------------------------------------------------------ reading FP8 block and MXFP4

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FP4 = np.dtype(ml_dtypes.float4_e2m1fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
MX_BLOCK = 32  # values per MXFP4 block (one E8M0 exponent each), 16 bytes of two codes
FP8_SCALE_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), E8M0)  # each converts to float32 exactly
MX_SCALE_DTYPES = (np.dtype(np.uint8), E8M0)
READ = (
    "maxckpt reads FP8 block (quant_method 'fp8' with a weight_block_size, e4m3) and MXFP4 (quant_method 'mxfp4') "
    "checkpoints"
)


@dataclass(frozen=True)
class QuantizedTensor:
    """One weight stored quantized: its plain name and shape, and the stored codes and scales it is computed from."""

    name: str  # the plain (dequantized) name the layouts see
    method: str  # "fp8-block" or "mxfp4"
    codes: str  # stored names
    scales: str
    shape: tuple[int, ...]  # dequantized shape
    block: tuple[int, ...]  # FP8: (rows, cols) per scale; MXFP4: (32,) values per exponent
    stored: TensorInfo  # the codes as stored

    @property
    def label(self) -> str:
        return (
            f"FP8 block {list(self.block)}" if self.method == "fp8-block" else f"MXFP4 (E8M0 scale per {self.block[0]})"
        )


def _way_out() -> str:
    return (
        f"{READ}; dequantize others to bfloat16 first, e.g. with transformers: "
        "AutoModelForCausalLM.from_pretrained(SRC, quantization_config=...) with its quantizer's dequantize option, "
        "then save_pretrained(DIR) and convert DIR"
    )


def _refuse(where: str, method: str, shown: str, why: str = "") -> UnsupportedModelError:
    why = why or "which maxckpt cannot convert: it would write the quantized codes as weights and drop their scales"
    return UnsupportedModelError(f"{where}: quantized HF checkpoint ({method}; {shown}), {why}. {_way_out()}")


def _shown(name: str, info: TensorInfo) -> str:
    return f"tensor {name} is {np.dtype(info.dtype).name} {list(info.shape)}"


def dequantization_plan(
    infos: Mapping[str, TensorInfo], config: Mapping[str, Any] | None, where: str
) -> dict[str, QuantizedTensor] | None:
    """The quantized weights of a checkpoint maxckpt dequantizes on read (None: it is not quantized).

    Raises UnsupportedModelError (one message naming the method and a tensor) for every other method, for FP8
    without the block size config.json states, and for codes or scales of the wrong dtype or shape.
    """
    q = quantization(infos, config)
    if q is None:
        return None
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    method = qc.get("quant_method") if isinstance(qc, Mapping) else None
    shown = f"tensor {q.tensor} is {q.detail}" if q.tensor else q.detail
    if method == "fp8":
        plan = _fp8_plan(infos, qc, where, q.method)
    elif method == "mxfp4":
        plan = _mxfp4_plan(infos, where, q.method)
    else:
        raise _refuse(where, q.method, shown)
    rest = {n: i for n, i in infos.items() if n not in {t for p in plan.values() for t in (p.codes, p.scales)}}
    left = quantization(rest, None)
    if left is not None and left.tensor is not None:
        raise _refuse(
            where, q.method, _shown(left.tensor, infos[left.tensor]),
            f"but that tensor is none of its codes or scales ({left.method.split(';')[0]})",
        )
    if not plan:
        raise _refuse(where, q.method, shown, "but no tensor holds its codes")
    return plan


def _fp8_plan(
    infos: Mapping[str, TensorInfo], qc: Mapping[str, Any], where: str, method: str
) -> dict[str, QuantizedTensor]:
    block = qc.get("weight_block_size")
    fmt = qc.get("fmt", "e4m3")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise _refuse(
            where, method, f"weight_block_size {block!r}", "but maxckpt reads FP8 with [rows, cols] block scales only"
        )
    if fmt != "e4m3":
        raise _refuse(where, method, f"fmt {fmt!r}", "but maxckpt reads e4m3 FP8 codes only")
    plan = {}
    for name in sorted(infos):
        info = infos[name]
        if name.endswith("_scale_inv"):
            codes = name[: -len("_scale_inv")]
            if codes not in infos or np.dtype(infos[codes].dtype) != FP8:
                held = _shown(codes, infos[codes]) if codes in infos else f"tensor {codes} is missing"
                raise _refuse(
                    where, method, f"{held}, scales {name}", "but FP8 block scales belong to float8_e4m3fn codes"
                )
            continue
        if np.dtype(info.dtype) != FP8:
            continue
        scale = name + "_scale_inv"
        if scale not in infos:
            raise _refuse(where, method, _shown(name, info), f"but its block scales {scale} are missing")
        s = infos[scale]
        if len(info.shape) != 2:
            raise _refuse(where, method, _shown(name, info), "but maxckpt reads 2-D FP8 block weights only")
        want = tuple(-(-d // b) for d, b in zip(info.shape, block))
        if tuple(s.shape) != want:
            raise _refuse(
                where,
                method,
                _shown(name, info),
                f"but its scales {scale} have shape {list(s.shape)}, not {list(want)} (ceil of the shape over "
                f"weight_block_size {list(block)})",
            )
        if np.dtype(s.dtype) not in FP8_SCALE_DTYPES:
            raise _refuse(
                where, method, _shown(name, info),
                f"but its scales {scale} are {np.dtype(s.dtype).name}, not float32 (or bfloat16, float8_e8m0fnu)",
            )
        plan[name] = QuantizedTensor(name, "fp8-block", name, scale, tuple(info.shape), tuple(block), info)
    return plan


def _mxfp4_plan(infos: Mapping[str, TensorInfo], where: str, method: str) -> dict[str, QuantizedTensor]:
    plan = {}
    for name in sorted(infos):
        info = infos[name]
        if name.endswith("_scales") and name[: -len("_scales")] + "_blocks" not in infos:
            raise _refuse(
                where, method, _shown(name, info), f"but its codes {name[: -len('_scales')]}_blocks are missing"
            )
        if not name.endswith("_blocks"):
            continue
        base = name[: -len("_blocks")]
        scale = base + "_scales"
        if scale not in infos:
            raise _refuse(where, method, _shown(name, info), f"but its scales {scale} are missing")
        s = infos[scale]
        if np.dtype(info.dtype) != np.uint8 or len(info.shape) != 4 or info.shape[-1] != MX_BLOCK // 2:
            raise _refuse(
                where, method, _shown(name, info),
                "but MXFP4 expert codes are uint8 [experts, out, in/32, 16] (two FP4 codes a byte)",
            )
        if tuple(s.shape) != tuple(info.shape[:-1]):
            raise _refuse(
                where,
                method,
                _shown(name, info),
                f"but its scales {scale} have shape {list(s.shape)}, not {list(info.shape[:-1])}",
            )
        if np.dtype(s.dtype) not in MX_SCALE_DTYPES:
            raise _refuse(
                where,
                method,
                _shown(name, info),
                f"but its scales {scale} are {np.dtype(s.dtype).name}, not uint8 E8M0 exponents",
            )
        experts, out, groups, _ = info.shape
        plan[base] = QuantizedTensor(base, "mxfp4", name, scale, (experts, groups * MX_BLOCK, out), (MX_BLOCK,), info)
    return plan


def dequantize_fp8(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], row0: int = 0) -> np.ndarray:
    """float32 `codes * scale_inv` with each scale repeated over its block, the last blocks cropped (DeepSeek-V3).

    `codes` are rows `row0:row0 + len(codes)` of the weight and `scale_inv` the scale rows they fall in.
    """
    b0, b1 = block
    rows, cols = codes.shape
    out = np.empty((rows, cols), np.float32)
    scale = np.asarray(scale_inv).astype(np.float32)
    first = row0 // b0
    for i in range(first, -(-(row0 + rows) // b0)):
        lo, hi = max(i * b0, row0) - row0, min((i + 1) * b0, row0 + rows) - row0
        row_scale = np.repeat(scale[i - first], b1)[:cols]
        np.multiply(codes[lo:hi].astype(np.float32), row_scale, out=out[lo:hi])
    return out


_FP4_VALUES = np.arange(16, dtype=np.uint8).view(FP4).astype(np.float32)  # e2m1: code k -> its value


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 experts [.., in, out] from gpt-oss `_blocks` [.., out, G, 16] and `_scales` [.., out, G].

    Two FP4 e2m1 codes a byte, the low nibble first; each block of 32 times 2**(scale - 127); then the last two
    axes swapped, as transformers' `convert_moe_packed_tensors` does.
    """
    blocks = np.asarray(blocks, np.uint8)
    values = np.empty(blocks.shape[:-1] + (blocks.shape[-1] * 2,), np.float32)
    values[..., 0::2] = _FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = _FP4_VALUES[blocks >> 4]
    exponent = np.asarray(scales).view(np.uint8).view(E8M0).astype(np.float32)  # 2**(s - 127)
    values *= exponent[..., None]
    values = values.reshape(blocks.shape[:-2] + (-1,))
    return np.ascontiguousarray(np.swapaxes(values, -1, -2))


class DequantizingReader:
    """A reader presenting a quantized checkpoint's weights dequantized (float32) under their plain names.

    Other tensors pass through. Reads are streamed: one tensor, or the rows (FP8) or experts (MXFP4) asked for.
    """

    def __init__(self, reader, plan: Mapping[str, QuantizedTensor]):
        self.stored, self.plan = reader, dict(plan)
        hidden = {t for p in self.plan.values() for t in (p.codes, p.scales)}
        infos = reader.tensors()
        self._infos = {n: i for n, i in infos.items() if n not in hidden}
        for p in self.plan.values():
            self._infos[p.name] = TensorInfo(p.name, p.shape, np.dtype(np.float32))

    def tensors(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    def read(self, name: str, index=None) -> np.ndarray:
        p = self.plan.get(name)
        if p is None:
            return self.stored.read(name, index)
        lead = index[0] if index else slice(None)
        rest = tuple(index[1:]) if index else ()
        if isinstance(lead, (int, np.integer)):
            got = self._read(p, slice(int(lead) % p.shape[0], int(lead) % p.shape[0] + 1))[0]
            return got[rest] if rest else got
        if not isinstance(lead, slice):
            got = self._read(p, slice(None))
            return got[index]
        lo, hi, step = lead.indices(p.shape[0])
        if step != 1:
            return self._read(p, slice(None))[(lead,) + rest]
        got = self._read(p, slice(lo, max(lo, hi)))
        return got[(slice(None),) + rest] if rest else got

    def _read(self, p: QuantizedTensor, rows: slice) -> np.ndarray:
        if p.method == "mxfp4":  # rows are experts
            return dequantize_mxfp4(self.stored.read(p.codes, (rows,)), self.stored.read(p.scales, (rows,)))
        lo, hi, _ = rows.indices(p.shape[0])
        if hi <= lo:
            return np.empty((0, p.shape[1]), np.float32)
        b0 = p.block[0]
        codes = self.stored.read(p.codes, (slice(lo, hi),))
        scales = self.stored.read(p.scales, (slice(lo // b0, -(-hi // b0)),))
        return dequantize_fp8(codes, scales, p.block, lo)

    def close(self) -> None:
        self.stored.close()

    def __getattr__(self, attr: str):  # objects(), items_dir, path, ... of the stored reader
        return getattr(self.stored, attr)


# ------------------------------------------------------------------ writing FP8 block and MXFP4

QUANTIZE_METHODS = ("fp8-block", "mxfp4")
FP8_BLOCK = (128, 128)
# routers stay full precision
_UNQUANTIZED_LINEARS = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight")


def quantize_fp8_block(w: np.ndarray, block: tuple[int, int] = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn codes, float32 scale_inv [ceil(rows/b0), ceil(cols/b1)]) of a 2-D weight, DeepSeek-V3's way.

    Per block: scale = amax / 448 (the stored `scale_inv`; 1 for an all-zero block), codes = x / scale rounded
    to nearest e4m3. `dequantize_fp8(codes, scale_inv)` gives the weight back to FP8's precision.
    """
    w = np.asarray(w, np.float32)
    b0, b1 = block
    rows, cols = w.shape
    scale = np.empty((-(-rows // b0), -(-cols // b1)), np.float32)
    codes = np.empty(w.shape, FP8)
    for i in range(scale.shape[0]):
        part = w[i * b0 : (i + 1) * b0]
        pad = np.pad(np.abs(part), ((0, 0), (0, scale.shape[1] * b1 - cols)))
        amax = pad.reshape(part.shape[0], scale.shape[1], b1).max(axis=(0, 2))
        scale[i] = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
        x = part / np.repeat(scale[i], b1)[:cols]
        codes[i * b0 : (i + 1) * b0] = np.clip(x, -FP8_MAX, FP8_MAX).astype(FP8)
    return codes, scale


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 `_blocks` [.., out, in/32, 16], uint8 `_scales` [.., out, in/32]) of gpt-oss experts [.., in, out].

    Per block of 32 along the input axis: shared exponent e = floor(log2(amax)) - 2 (E8M0 byte e + 127; 0 for an
    all-zero block), codes = x / 2**e rounded to nearest FP4 e2m1 (saturating at 6), two a byte, low nibble first.
    """
    w = np.swapaxes(np.asarray(w, np.float32), -1, -2)  # [.., out, in]
    if w.shape[-1] % MX_BLOCK:
        raise ValueError(f"the input axis ({w.shape[-1]}) is no multiple of {MX_BLOCK}")
    x = w.reshape(w.shape[:-1] + (w.shape[-1] // MX_BLOCK, MX_BLOCK))
    amax = np.abs(x).max(axis=-1)
    exp = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127)
    exp = np.clip(exp, -127, 127).astype(np.int32)
    scales = (exp + 127).astype(np.uint8)
    scaled = x / np.ldexp(np.float32(1), exp)[..., None].astype(np.float32)
    fp4 = np.clip(scaled, -6.0, 6.0).astype(FP4).view(np.uint8) & 0x0F  # ml_dtypes rounds to nearest (even)
    blocks = (fp4[..., 0::2] | (fp4[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(scales)


def quantized_names(tensors: Mapping[str, Any], family: str, method: str) -> list[str]:
    """The HF tensors `--quantize method` stores quantized (what DeepSeek/Qwen3-FP8 and gpt-oss releases do)."""
    fused = FAMILIES[family].hf_experts == "fused_interleaved" if family in FAMILIES else False
    if method == "fp8-block":
        if fused:
            raise UnsupportedModelError(
                "--quantize fp8-block: gpt-oss's experts are 3-D tensors, not the 2-D linears FP8 block releases "
                "quantize; use --quantize mxfp4 (how OpenAI ships gpt-oss)"
            )
        return [
            n for n, t in tensors.items()
            if n.startswith("model.layers.") and n.endswith(".weight") and len(t.shape) == 2
            and "norm" not in n.rsplit(".", 2)[-2] and not n.endswith(_UNQUANTIZED_LINEARS)
        ]
    if method == "mxfp4":
        if not fused:
            raise UnsupportedModelError(
                f"--quantize mxfp4 writes gpt-oss's experts as OpenAI ships them; {family} has no such experts "
                "(use --quantize fp8-block)"
            )
        names = [
            n
            for n, t in tensors.items()
            if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) and len(t.shape) == 3
        ]
        for n in names:
            if tensors[n].shape[1] % MX_BLOCK:
                raise UnsupportedModelError(
                    f"--quantize mxfp4: {n}'s input axis ({tensors[n].shape[1]}) is no multiple of {MX_BLOCK}"
                )
        return names
    raise UnsupportedModelError(f"--quantize must be one of {', '.join(QUANTIZE_METHODS)}, got {method!r}")


def quantization_config(method: str, family: str = "") -> dict[str, Any]:
    """config.json's quantization_config for an output `--quantize method` wrote (as the releases state it)."""
    if method == "mxfp4":
        return {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        }
    config: dict[str, Any] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(FP8_BLOCK),
    }
    router = FAMILIES[family].hf_linear_router if family in FAMILIES else None
    if router is not None:  # its router stays full precision: said so, as Qwen3-*-FP8 do (DeepSeek's is no Linear)
        config["modules_to_not_convert"] = ["lm_head", router]
    return config


class _Pair:
    """Codes and scales of one tensor (or piece), computed once for both: whichever is asked first computes them."""

    def __init__(self, compute):
        self.compute, self.lock, self.held = compute, threading.Lock(), {}

    def get(self, which: int, key) -> np.ndarray:
        with self.lock:
            if (key, which) in self.held:
                return self.held.pop((key, which))
            both = self.compute(key)
            self.held[(key, 1 - which)] = both[1 - which]
            return both[which]


def _axis0_pieces(t) -> bool:
    return bool(t.pieces) and all(all(i == slice(None) for i in index[1:]) for index, _ in t.pieces)


def quantize_tensors(tensors: Mapping[str, Any], family: str, method: str) -> tuple[dict[str, Any], set[str]]:
    """`tensors` (HF names, lazy) with the weights `--quantize method` quantizes replaced by their codes and scales.

    Returns the new mapping, in the same order (scales right after their codes), and the names it produced (not to
    be cast to the export dtype). Each tensor (each expert, when the source streams experts) is quantized once.
    """
    from maxckpt.tensors import LazyTensor

    chosen = set(quantized_names(tensors, family, method))
    out: dict[str, Any] = {}
    made: set[str] = set()
    for name, t in tensors.items():
        if name not in chosen:
            out[name] = t
            continue
        if method == "fp8-block":
            rows, cols = t.shape
            shapes = ((rows, cols), tuple(-(-d // b) for d, b in zip(t.shape, FP8_BLOCK)))
            names, dtypes, fn = (name, name + "_scale_inv"), (FP8, np.dtype(np.float32)), quantize_fp8_block
        else:
            experts, inp, outd = t.shape
            shapes = ((experts, outd, inp // MX_BLOCK, MX_BLOCK // 2), (experts, outd, inp // MX_BLOCK))
            names, dtypes, fn = (
                (name + "_blocks", name + "_scales"),
                (np.dtype(np.uint8), np.dtype(np.uint8)),
                quantize_mxfp4,
            )
        pieced = method == "mxfp4" and _axis0_pieces(t)
        pair = _Pair(lambda key, t=t, fn=fn: fn(t.read() if key is None else t.pieces[key][1]()))
        for which in (0, 1):
            shape = shapes[which]
            pieces = None
            if pieced:
                pieces = tuple(
                    ((index[0],) + (slice(None),) * (len(shape) - 1), (lambda k=k, w=which, p=pair: p.get(w, k)))
                    for k, (index, _) in enumerate(t.pieces)
                )

            def whole(index, w=which, p=pair):
                got = p.get(w, None)
                return got if index is None else got[index]

            out[names[which]] = LazyTensor(names[which], shape, dtypes[which], whole, pieces=pieces)
            made.add(names[which])
    return out, made


def read_compared(ckpt, name: str, t, other_dtype) -> np.ndarray:
    """`t` (tensor `name` of checkpoint `ckpt`, HF view) as float32 for verify and diff.

    A weight read dequantized (float32, exact) that is compared with a narrower float copy (a bfloat16 export)
    is rounded to that dtype first, as `convert` rounds it once: the export then compares equal.
    """
    x = np.asarray(t.read())
    plan = getattr(ckpt, "quantization", None)
    other = np.dtype(other_dtype)
    from maxckpt.layouts.transforms import is_float

    if plan and name in plan and is_float(other) and other.itemsize < x.dtype.itemsize:
        x = x.astype(other)
    return np.asarray(x, np.float32)
