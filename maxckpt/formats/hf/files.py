"""The files of an HF model directory: its safetensors, config.json, generation_config.json, the tokenizer.

Finding and opening the safetensors (:func:`is_hf_checkpoint`, :func:`open_reader`, :func:`open_writer`),
reading a config.json (:func:`read_config`, :func:`config_hints`, the checkpoint's own found by
:func:`config_file`) and writing a converted model's (:func:`write_sidecars`); what a config.json
holds is :mod:`maxckpt.formats.hf.config`.

>>> config_file("/nonexistent/model.pt").name, is_hf_checkpoint("/nonexistent")
('config.json', False)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from maxckpt.storage.bounded import read_json, special_kind
from maxckpt.errors import CorruptCheckpointError
from maxckpt.formats.hf.config import config_json, generation_config_json, hints_from_config
from maxckpt.layouts.base import ModelSpec
from maxckpt.storage.urls import as_path
from maxckpt.tensors import TensorInfo

if TYPE_CHECKING:
    from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def is_hf_checkpoint(path: str | os.PathLike) -> bool:
    """A `.safetensors` file, or a directory with `model.safetensors.index.json` or `*.safetensors`."""
    path = as_path(path)
    if path.is_file():
        return path.suffix == ".safetensors"
    return path.is_dir() and ((path / "model.safetensors.index.json").is_file() or any(path.glob("*.safetensors")))


def open_reader(path: Path) -> SafetensorsReader:
    """The reader of an HF checkpoint's safetensors (sharded or one file)."""
    from maxckpt.containers.safetensors import SafetensorsReader

    return SafetensorsReader(path)


def open_writer(path: Path, infos: Sequence[TensorInfo], *, max_shard_size: int | str,
                share: Any = None) -> SafetensorsWriter:
    """A safetensors writer of a model directory at `path`, in shards of at most `max_shard_size`."""
    from maxckpt.containers.safetensors import SafetensorsWriter

    return SafetensorsWriter(path, max_shard_size=max_shard_size, plan=infos, share=share)


def config_file(path: str | os.PathLike) -> Path:
    """The config.json of an HF (or torch) checkpoint: in the directory, or beside the file.

    One that is there but no regular file (a FIFO, a device, a folder) is an
    error: skipping it would leave the model's settings to guesses.
    """
    config = as_path(path) / "config.json" if as_path(path).is_dir() else as_path(path).parent / "config.json"
    kind = special_kind(config)
    if kind is not None:
        raise CorruptCheckpointError(
            f"{config} is {kind}, not a regular file; put the model's config.json (a JSON file) there, or remove it "
            "and pass --hf-config"
        )
    return config


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict, with a clear error when it is not a JSON object."""
    try:
        config = read_json(as_path(path))
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(f"{path}: cannot read it as JSON ({err}); pass a valid HF config.json") from None
    if not isinstance(config, dict):
        raise CorruptCheckpointError(
            f"{path}: holds a JSON {type(config).__name__}, not an object; pass a valid HF config.json"
        )
    return config


def config_hints(path: Path) -> dict[str, Any]:
    """The ModelSpec fields (and `family`) an HF config.json file states.

    >>> config_hints("llama-hf/config.json")["rope_theta"]  # doctest: +SKIP
    500000.0
    """
    config = read_config(path)
    try:
        return hints_from_config(config)
    except (AttributeError, TypeError, ValueError) as err:  # a value of the wrong type, e.g. "rope_theta": null
        raise CorruptCheckpointError(
            f"{path}: not a usable HF config ({type(err).__name__}: {err}); fix or replace it"
        ) from None


def checkpoint_config(path: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint's own config.json (in the directory, or beside the file) as a dict; None without one."""
    config = config_file(path)
    return read_config(config) if config.is_file() else None


def checkpoint_hints(path: str | os.PathLike) -> dict[str, Any]:
    """The ModelSpec fields the checkpoint's own config.json states; none without one."""
    config = config_file(path)
    return config_hints(config) if config.is_file() else {}


def write_sidecars(directory: Path, spec: ModelSpec, dtype: np.dtype | None = None, tokenizer: Path | None = None,
                   assumed: Mapping[str, Any] | None = None,
                   quantization: Mapping[str, Any] | None = None) -> list[Path]:
    """Write config.json, generation_config.json and copy tokenizer files; returns what was written.

    `assumed`: a MaxText source's values taken from a preset, recorded in config.json under
    `maxckpt_assumed_settings` (transformers keeps and ignores the key; maxckpt reads no setting from it).
    `quantization`: the `quantization_config` of weights stored quantized (`--quantize`), stated last.
    """
    directory = Path(directory)
    written = []
    config = config_json(spec, dtype)
    if assumed:
        config["maxckpt_assumed_settings"] = dict(assumed)
    if quantization:
        config["quantization_config"] = dict(quantization)
    for name, content in (("config.json", config), ("generation_config.json", generation_config_json(spec))):
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
        written.append(directory / name)
    if tokenizer is not None:
        written += copy_tokenizer(Path(tokenizer), directory)
    return written


def copy_tokenizer(source: Path, directory: Path) -> list[Path]:
    """Copy the tokenizer files HF knows from `source` (a dir) into `directory`."""
    if not source.is_dir():
        raise CorruptCheckpointError(f"--tokenizer {source}: not a directory; pass the folder holding tokenizer.json")
    copied = [shutil.copy2(source / name, directory / name) for name in TOKENIZER_FILES if (source / name).is_file()]
    if not copied:
        raise CorruptCheckpointError(
            f"--tokenizer {source}: none of {', '.join(TOKENIZER_FILES)} found there"
        )
    return [Path(p) for p in copied]
