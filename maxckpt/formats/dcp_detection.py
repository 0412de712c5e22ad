"""Which framework a PyTorch DCP folder belongs to: Megatron-Core `torch_dist` or TorchTitan.

Both store tensors in DCP (a `.metadata` file plus `*.distcp` shards); they differ in the folders
around it and in their key names:

- Megatron: `<root>/latest_checkpointed_iteration.txt` + `iter_NNNNNNN/` (or `release/`), each with
  `metadata.json` and `common.pt`; keys `embedding.word_embeddings.weight`, `decoder.layers.*`;
- TorchTitan: `<folder>/step-N/`; keys `tok_embeddings.weight` (or under `model.`).

Names decide first; the keys (read from `.metadata` through the restricted unpickler) only for a bare DCP dir.

>>> is_megatron("/nonexistent"), is_torchtitan("/nonexistent")
(False, False)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from maxckpt.storage.run_dirs import MEGATRON_TRACKER
from maxckpt.storage.urls import as_path

_ITER_RE = re.compile(r"iter_\d+|release")
_STEP_RE = re.compile(r"step-\d+")
_METADATA = ".metadata"


def _dcp_keys(path: Path) -> set[str]:
    """Item names of a DCP dir, from its `.metadata` (through the restricted unpickler)."""
    from maxckpt.containers.dcp import load_metadata

    return set(load_metadata(path).state_dict_metadata)


def _megatron_keys(keys: set[str]) -> bool:
    return "embedding.word_embeddings.weight" in keys or any(k.startswith("decoder.layers.") for k in keys)


def _torchtitan_keys(keys: set[str]) -> bool:
    return "tok_embeddings.weight" in keys or "model.tok_embeddings.weight" in keys


def _subdirs_with_metadata(path: Path, pattern: re.Pattern) -> bool:
    return path.is_dir() and any(pattern.fullmatch(c.name) and (c / _METADATA).is_file() for c in path.iterdir())


def is_megatron(path: str | os.PathLike) -> bool:
    """A Megatron checkpoint root (tracker file or iter_N/release dirs) or one iteration dir."""
    path = as_path(path)
    if not path.is_dir():
        return False
    if (path / MEGATRON_TRACKER).is_file() or _subdirs_with_metadata(path, _ITER_RE):
        return True
    if not (path / _METADATA).is_file():
        return False
    if _ITER_RE.fullmatch(path.name) or (path / "metadata.json").is_file() or (path / "common.pt").is_file():
        return True
    return not _STEP_RE.fullmatch(path.name) and _megatron_keys(_dcp_keys(path))


def is_torchtitan(path: str | os.PathLike) -> bool:
    """A TorchTitan checkpoint folder (step-N dirs) or one step dir."""
    path = as_path(path)
    if not path.is_dir():
        return False
    if _subdirs_with_metadata(path, _STEP_RE):
        return True
    if not (path / _METADATA).is_file():
        return False
    return bool(_STEP_RE.fullmatch(path.name)) or _torchtitan_keys(_dcp_keys(path))
