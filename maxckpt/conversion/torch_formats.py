"""Format hooks for the PyTorch side: Megatron-Core `torch_dist`, TorchTitan DCP, plain `torch.save`.

The registry in :mod:`maxckpt.conversion.formats` names these functions by
import string, so torch is only imported when one of these formats is used.
Each hook is the glue between a container (DCP, torch file), a layout
(Megatron, TorchTitan, HF names) and the files around the tensors:

- Megatron: `<root>/latest_checkpointed_iteration.txt` + `iter_NNNNNNN/` (or
  `release/`) with `metadata.json`, `common.pt` and `maxckpt_model.json`;
- TorchTitan: `<folder>/step-N/` with `maxckpt_model.json` (and
  `train_state.step` inside the DCP when N > 0);
- torch: one `.pt`/`.bin` file, or a directory of `pytorch_model*.bin`
  shards with HF's `config.json`.

`maxckpt_model.json` states what shapes cannot (family, true vocabulary size,
rope settings, tying); DCP loaders ignore it. Checkpoints written elsewhere
lack it: then Megatron's `common.pt` args, `--hf-config` or `--set` tell.

>>> is_megatron("/nonexistent"), is_torchtitan("/nonexistent")
(False, False)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from maxckpt.conversion.formats import ConversionOptions
from maxckpt.formats import MegatronOptions, TorchOptions, TorchTitanOptions
from maxckpt.conversion.spec import read_model_json, write_model_json
from maxckpt.errors import CorruptCheckpointError
from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import TensorInfo
from maxckpt.storage.run_dirs import MEGATRON_TRACKER
from maxckpt.storage.urls import as_path

if TYPE_CHECKING:
    from maxckpt.containers.dcp import DcpReader, DcpWriter
    from maxckpt.containers.torch_file import TorchFileReader, TorchFileWriter
    from maxckpt.formats.megatron.layout import MegatronLayout
    from maxckpt.formats.torchtitan.layout import TorchTitanLayout

_ITER_RE = re.compile(r"iter_\d+|release")
_STEP_RE = re.compile(r"step-\d+")
_METADATA = ".metadata"
_TRACKER = MEGATRON_TRACKER


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


# ------------------------------------------------------------------ megatron


def is_megatron(path: Path) -> bool:
    """A Megatron checkpoint root (tracker file or iter_N/release dirs) or one iteration dir."""
    path = as_path(path)
    if not path.is_dir():
        return False
    if (path / _TRACKER).is_file() or _subdirs_with_metadata(path, _ITER_RE):
        return True
    if not (path / _METADATA).is_file():
        return False
    if _ITER_RE.fullmatch(path.name) or (path / "metadata.json").is_file() or (path / "common.pt").is_file():
        return True
    return not _STEP_RE.fullmatch(path.name) and _megatron_keys(_dcp_keys(path))


def megatron_reader(path: Path, options: ConversionOptions) -> "DcpReader":
    from maxckpt.containers.dcp import DcpReader
    from maxckpt.formats.megatron.files import find_megatron_checkpoint

    directory, iteration = find_megatron_checkpoint(path, options.step)
    return DcpReader(directory, step=iteration)


def megatron_layout(options: ConversionOptions) -> "MegatronLayout":
    from maxckpt.formats.megatron.layout import MegatronLayout

    knobs = options.knobs(MegatronOptions)
    return MegatronLayout(spec=knobs.spec, make_vocab_size_divisible_by=knobs.make_vocab_size_divisible_by)


def megatron_hints(path: Path, reader: "DcpReader", options: ConversionOptions) -> dict[str, Any]:
    """`common.pt` args (checked to describe a Llama-family model), then `maxckpt_model.json`.

    Without a stated vocabulary size the padded one is kept, with a note.
    """
    from maxckpt.formats.megatron.files import read_megatron_common
    from maxckpt.formats.megatron.args import spec_fields_from_megatron_args
    from maxckpt.formats.megatron.support import check_supported_args

    hints: dict[str, Any] = {}
    common = read_megatron_common(reader.path)
    args = (common or {}).get("args")
    if args is not None and not isinstance(args, dict):
        args = vars(args) if hasattr(args, "__dict__") else None
    if args:
        where = str(reader.path / "common.pt")
        check_supported_args(args, where)
        try:
            hints.update(spec_fields_from_megatron_args(args))
        except (TypeError, ValueError) as err:  # an arg of the wrong type, e.g. hidden_size='wide'
            raise CorruptCheckpointError(
                f"{where}: its saved args do not describe a model ({type(err).__name__}: {err}); "
                "pass --hf-config or --set the model settings"
            ) from None
    hints.update(read_model_json(reader.path))
    notes: list[str] = []
    embedding = reader.tensors().get("embedding.word_embeddings.weight")
    stated = "vocab_size" in hints or options.hf_config is not None or "vocab_size" in options.overrides
    if embedding is not None and not stated:
        padded = hints["vocab_size"] = embedding.shape[0]
        notes.append(
            f"the Megatron checkpoint does not state its true vocabulary size; keeping all {padded} "
            "(padded) rows. Pass --set vocab_size=N (or --hf-config) to drop the padding."
        )
    if notes:
        hints["notes"] = notes
    return hints


def megatron_step(path: Path, reader: "DcpReader", options: ConversionOptions) -> int | None:
    return reader.step  # the iteration of iter_NNNNNNN (None for release/)


def megatron_writer(path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions) -> "DcpWriter":
    from maxckpt.formats.megatron.files import open_megatron_writer

    layout = megatron_layout(options)
    return open_megatron_writer(path, spec, layout, iteration=options.recorded_step, share=options.share)


def megatron_sidecars(path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
    from maxckpt.formats.megatron.files import iteration_dir_name, write_megatron_sidecars

    write_model_json(Path(path) / iteration_dir_name(options.recorded_step), spec)
    write_megatron_sidecars(path, spec, megatron_layout(options), iteration=options.recorded_step,  # tracker file last
                            assumed=options.assumed_settings)


# ---------------------------------------------------------------- torchtitan


def is_torchtitan(path: Path) -> bool:
    """A TorchTitan checkpoint folder (step-N dirs) or one step dir."""
    path = as_path(path)
    if not path.is_dir():
        return False
    if _subdirs_with_metadata(path, _STEP_RE):
        return True
    if not (path / _METADATA).is_file():
        return False
    return bool(_STEP_RE.fullmatch(path.name)) or _torchtitan_keys(_dcp_keys(path))


def torchtitan_reader(path: Path, options: ConversionOptions) -> "DcpReader":
    from maxckpt.containers.dcp import DcpReader
    from maxckpt.formats.torchtitan.files import find_step_dir

    directory, step = find_step_dir(path, options.step)
    return DcpReader(directory, step=step)


def torchtitan_layout(options: ConversionOptions) -> "TorchTitanLayout":
    from maxckpt.formats.torchtitan.layout import TorchTitanLayout

    return TorchTitanLayout(keys=options.knobs(TorchTitanOptions).keys)  # type: ignore[arg-type]


def torchtitan_hints(path: Path, reader: "DcpReader", options: ConversionOptions) -> dict[str, Any]:
    # TorchTitan keeps model settings in its job config, not the checkpoint: only our own sidecar states them.
    return read_model_json(reader.path)


def torchtitan_step(path: Path, reader: "DcpReader", options: ConversionOptions) -> int | None:
    from maxckpt.formats.torchtitan.files import read_train_step

    step = read_train_step(reader)
    return reader.step if step is None else step  # train_state.step, else the step-N dir name


def torchtitan_writer(path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions) -> "DcpWriter":
    from maxckpt.formats.torchtitan.files import open_torchtitan_writer

    step = options.recorded_step or 0
    # train_state only with a step: TorchTitan loads step-0 model-only and treats step > 0 as a resume.
    return open_torchtitan_writer(path, step, train_state=step > 0, share=options.share)


def torchtitan_sidecars(path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
    from maxckpt.formats.torchtitan.files import step_dir_name

    write_model_json(Path(path) / step_dir_name(options.recorded_step or 0), spec)


# --------------------------------------------------------------------- torch


def is_torch(path: Path) -> bool:
    from maxckpt.containers.torch_file import is_torch_checkpoint

    return is_torch_checkpoint(path)


def torch_reader(path: Path, options: ConversionOptions) -> "TorchFileReader":
    from maxckpt.containers.torch_file import TorchFileReader

    return TorchFileReader(path)


def torch_writer(path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions) -> "TorchFileWriter":
    from maxckpt.containers.torch_file import TorchFileWriter

    size = options.knobs(TorchOptions).max_shard_size
    return TorchFileWriter(path, max_shard_size=size, single=bool(options.torch_single_file))


def torch_sidecars(path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
    """A sharded directory gets HF's config files, so `from_pretrained(dir, use_safetensors=False)` loads it."""
    if options.torch_single_file:
        return
    from maxckpt.formats.hf.files import write_sidecars

    tokenizer = options.knobs(TorchOptions).tokenizer
    write_sidecars(path, spec, dtype=options.dtype, tokenizer=tokenizer, assumed=options.assumed_settings)
