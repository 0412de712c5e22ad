"""Conversion between checkpoint formats, with HF as the hub.

`convert(src, dst, to=...)` streams a checkpoint into another format;
`open_checkpoint(path)` opens any supported checkpoint lazily;
`verify(a, b)` / `verify_logits(a, b)` check a conversion. New formats are
one entry in :mod:`maxckpt.conversion.formats`.
"""

from maxckpt.conversion.checkpoint import Checkpoint, open_checkpoint
from maxckpt.conversion.formats import FORMATS, ConversionOptions, Format, detect_format, get_format
from maxckpt.conversion.pipeline import ConversionReport, convert

__all__ = [
    "FORMATS",
    "Checkpoint",
    "ConversionOptions",
    "ConversionReport",
    "Format",
    "convert",
    "detect_format",
    "get_format",
    "open_checkpoint",
]
