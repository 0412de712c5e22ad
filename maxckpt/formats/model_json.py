"""`maxckpt_model.json`: the model record maxckpt writes beside tensors whose format cannot state it.

Megatron and TorchTitan checkpoints say nothing of the family, the true vocabulary size, rope settings
or token ids; this sidecar (the whole ModelSpec) does, so a round trip needs no flags. DCP loaders ignore it.

>>> from maxckpt.layouts.base import ModelSpec
>>> spec_to_json(ModelSpec("llama2", 2, 8, 2, 1, 4, 16, 32))["model_spec"]["family"]
'llama2'
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from maxckpt.storage.bounded import read_json_object
from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.storage.urls import as_path

_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSpec))

MODEL_JSON = "maxckpt_model.json"


def spec_to_json(spec: ModelSpec) -> dict[str, Any]:
    """The ModelSpec as plain JSON data (what `maxckpt_model.json` holds)."""
    data = dataclasses.asdict(spec)
    data["rope_scaling"] = dict(spec.rope_scaling) if spec.rope_scaling else None
    data["extra"] = dict(spec.extra)
    return {"format": "maxckpt model spec", "version": 1, "model_spec": data}


def write_model_json(directory: str | os.PathLike, spec: ModelSpec) -> Path:
    """Write `maxckpt_model.json` next to tensors whose format cannot state what shapes cannot tell.

    DCP loaders (Megatron, TorchTitan) ignore the file; maxckpt reads it back
    so a round trip keeps the family, the true vocabulary size, rope settings
    and token ids without flags.
    """
    path = Path(directory) / MODEL_JSON
    path.write_text(json.dumps(spec_to_json(spec), indent=2, sort_keys=True) + "\n")
    return path


def read_model_json(directory: str | os.PathLike) -> dict[str, Any]:
    """ModelSpec fields (and `family`) from a `maxckpt_model.json` in `directory`; {} when absent."""
    path = as_path(directory) / MODEL_JSON
    if not path.is_file():
        return {}
    try:
        data = read_json_object(path)["model_spec"]
        if not isinstance(data, dict):
            raise TypeError("model_spec is not an object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpointError(f"{path}: not a valid maxckpt model file ({err}); delete it or fix it") from None
    family = data.get("family")
    if family is not None and family not in FAMILIES:
        raise UnsupportedModelError(f"{path}: names family {family!r}; maxckpt knows {', '.join(sorted(FAMILIES))}")
    return {k: v for k, v in data.items() if k in _SPEC_FIELDS}
