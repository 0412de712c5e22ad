"""The files of a plain `torch.save` checkpoint: one `.pt`/`.pth`/`.bin` file, or a folder of `pytorch_model*.bin` \
shards.

A sharded folder gets HF's config files beside its shards, so `from_pretrained(dir, use_safetensors=False)`
loads it; one file gets none (its config.json, when there is one, lies beside it).

>>> is_torch_checkpoint("/nonexistent")
False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from maxckpt.layouts.base import ModelSpec

if TYPE_CHECKING:
    from maxckpt.containers.torch_file import TorchFileReader, TorchFileWriter


def is_torch_checkpoint(path: str | os.PathLike) -> bool:
    """A torch state-dict file, or a directory holding `pytorch_model*.bin`."""
    from maxckpt.containers.torch_file import is_torch_checkpoint as is_torch_file

    return is_torch_file(path)


def open_reader(path: Path) -> TorchFileReader:
    """The reader of a torch state-dict file or of a folder of shards (read through the restricted unpickler)."""
    from maxckpt.containers.torch_file import TorchFileReader

    return TorchFileReader(path)


def open_writer(path: Path, *, max_shard_size: int | str, single: bool, share: Any = None) -> TorchFileWriter:
    """A writer of one torch file (`single`) or of a folder of shards of at most `max_shard_size` at `path`
    (`share`: this process's part of a multi-process conversion)."""
    from maxckpt.containers.torch_file import TorchFileWriter

    return TorchFileWriter(path, max_shard_size=max_shard_size, single=single, share=share)


def write_sidecars(path: Path, spec: ModelSpec, *, single: bool, dtype: np.dtype | None = None,
                   tokenizer: Path | None = None, assumed: Mapping[str, Any] | None = None) -> None:
    """HF's config files (and the tokenizer) beside a folder of shards; nothing beside one file."""
    if single:
        return
    from maxckpt.formats.hf.files import write_sidecars as write_hf_sidecars

    write_hf_sidecars(path, spec, dtype=dtype, tokenizer=tokenizer, assumed=assumed)
