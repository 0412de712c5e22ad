"""What an HF target can be asked for: shard size, tokenizer files, quantization (torch targets share the first two)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from maxckpt.formats.fields import Knobs, knob
from maxckpt.units import parse_size


def _path(value: str | Path) -> Path:
    return Path(value)


@dataclass(frozen=True, kw_only=True)
class HFModelFiles(Knobs):
    """The knobs of a folder of HF model files, safetensors or torch: how large a shard, which tokenizer."""

    max_shard_size: int | str = knob(
        "5GB", "--max-shard-size", type=str, parse=parse_size,
        help="HF output: largest safetensors shard, e.g. 5GB, 500MB.",
    )
    """Largest shard in bytes (or a size such as "5GB", "500MB", read as bytes)."""

    tokenizer: Path | None = knob(
        None, "--tokenizer", type=Optional[Path], parse=_path,
        help="HF output: copy tokenizer files from this directory.",
    )
    """A directory whose tokenizer files are copied beside the weights (None: none)."""


@dataclass(frozen=True, kw_only=True)
class HFOptions(HFModelFiles):
    """The knobs of an HF output (`convert(..., to="hf", options=HFOptions(quantize="fp8-block"))`)."""

    quantize: str | None = knob(
        None, "--quantize", type=Optional[str], choices=("fp8-block", "mxfp4"),
        refused_elsewhere="writes an HF checkpoint",
        help="HF output, quantized as the Hub releases: fp8-block (DeepSeek-V3/Qwen3-FP8: the layers' linears as "
             "F8_E4M3 with float32 *_scale_inv per 128x128 block, scale = block amax / 448; embeddings, norms, "
             "lm_head, routers, biases stay --dtype) or mxfp4 (gpt-oss: the experts as uint8 *_blocks/*_scales, E8M0 "
             "exponent floor(log2(amax)) - 2 per 32 values). config.json gets the quantization_config.",
    )
    """Store the weights quantized: "fp8-block" or "mxfp4" (see formats.hf.quantization); None: full precision."""
