"""Conversion between checkpoint formats, with HF as the hub.

`convert(src, dst, to=...)` streams a checkpoint into another format (the target's knobs in its
options class, :mod:`maxckpt.formats`); `open_checkpoint(path)` opens any supported checkpoint lazily;
`verify(a, b)` / `verify_logits(a, b)` check a conversion. New formats are one package under
:mod:`maxckpt.formats`. Names load on first use, so the CLI can read the options
records (:mod:`maxckpt.conversion.options`) without the pipeline's imports.
"""

from __future__ import annotations

from maxckpt.lazy import lazy_attributes

# Public names -> the module that defines them.
_LAZY: dict[str, str] = {
    "FORMATS": "maxckpt.formats",
    "Checkpoint": "maxckpt.conversion.checkpoint",
    "ConversionOptions": "maxckpt.formats",
    "ConversionReport": "maxckpt.conversion.pipeline",
    "Distributed": "maxckpt.conversion.options",
    "Format": "maxckpt.formats",
    "SourceOptions": "maxckpt.conversion.options",
    "convert": "maxckpt.conversion.pipeline",
    "detect_format": "maxckpt.formats",
    "get_format": "maxckpt.formats",
    "open_checkpoint": "maxckpt.conversion.checkpoint",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = sorted(_LAZY)
