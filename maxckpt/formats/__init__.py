"""One package per checkpoint format: maxtext, hf, megatron, torchtitan, torch; adding a format is adding one.

Each holds its pure layout (names and shapes, no I/O), its files (the run dir, sidecars, opening its
writer), its options class (the knobs of that target, from which `maxckpt convert` builds its flags)
and its format class (:class:`~maxckpt.formats.base.Format`). :data:`FORMATS` is the registry, in
the order :func:`detect_format` tries them; :data:`TARGET_OPTIONS` names the options classes by format.

>>> [f.name for f in FORMATS]
['maxtext', 'hf', 'megatron', 'torchtitan', 'torch']
>>> TARGET_OPTIONS["megatron"](spec="local").spec
'local'
>>> detect_format("/nonexistent")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
CheckpointNotFoundError: /nonexistent: no such file or directory
"""

from __future__ import annotations

import os

from maxckpt.errors import CheckpointNotFoundError, UnsupportedModelError
from maxckpt.formats.base import ConversionOptions, Format
from maxckpt.formats.hf.format import HFFormat
from maxckpt.formats.hf.options import HFOptions
from maxckpt.formats.maxtext.format import MaxTextFormat
from maxckpt.formats.maxtext.options import MaxTextOptions
from maxckpt.formats.megatron.format import MegatronFormat
from maxckpt.formats.megatron.options import MegatronOptions
from maxckpt.formats.torch.format import TorchFormat
from maxckpt.formats.torch.options import TorchOptions
from maxckpt.formats.torchtitan.format import TorchTitanFormat
from maxckpt.formats.torchtitan.options import TorchTitanOptions

TargetOptions = MaxTextOptions | HFOptions | MegatronOptions | TorchTitanOptions | TorchOptions

# Every format, in the order detect_format tries them.
FORMATS: list[Format] = [MaxTextFormat(), HFFormat(), MegatronFormat(), TorchTitanFormat(), TorchFormat()]

# Format name -> the options class of that target (in the order of FORMATS).
TARGET_OPTIONS: dict[str, type] = {
    "maxtext": MaxTextOptions,
    "hf": HFOptions,
    "megatron": MegatronOptions,
    "torchtitan": TorchTitanOptions,
    "torch": TorchOptions,
}


def get_format(name: str) -> Format:
    """The registered format called `name`.

    >>> get_format("hf").description.split()[0]
    'HuggingFace'
    """
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise UnsupportedModelError(f"unknown format {name!r}; known formats: {', '.join(f.name for f in FORMATS)}")


def detect_format(path: str | os.PathLike) -> Format:
    """The first registered format whose `detect` accepts `path` (an unfinished conversion output is refused)."""
    from maxckpt.storage import outputs
    from maxckpt.storage.urls import as_path

    p = as_path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"{p}: no such file or directory")
    outputs.refuse_partial(p)
    for fmt in FORMATS:
        if fmt.detect(p):
            return fmt
    raise CheckpointNotFoundError(
        f"{p}: not a checkpoint maxckpt can read; tried {', '.join(f.name for f in FORMATS)}. "
        "Pass a MaxText run/step/items dir, an HF model dir with *.safetensors, a Megatron checkpoint root "
        "or iter_N dir, a TorchTitan checkpoint folder or step-N dir, or a torch .pt/.bin file."
    )


__all__ = ["FORMATS", "TARGET_OPTIONS", "ConversionOptions", "Format", "HFFormat", "HFOptions", "MaxTextFormat",
           "MaxTextOptions", "MegatronFormat", "MegatronOptions", "TargetOptions", "TorchFormat", "TorchOptions",
           "TorchTitanFormat", "TorchTitanOptions", "detect_format", "get_format"]
