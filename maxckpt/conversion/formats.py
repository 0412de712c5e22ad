"""The registry of checkpoint formats: adding a format is adding one :class:`Format` entry.

A format ties a container (how bytes are stored) to a layout (how tensors are
named and shaped) plus the files a usable checkpoint needs beside the tensors.
Every callable may be given as an import string `"module:attribute"`, so the
registry stays importable without torch, JAX or transformers; heavy modules
load only when a format is used.

The hooks, with the signatures the pipeline calls them with:

- `detect(path) -> bool`: is `path` a checkpoint of this format? (cheap: file names, small metadata)
- `open_reader(path, options) -> TensorReader`
- `layout(options) -> Layout`
- `read_hints(path, reader, options) -> dict`: ModelSpec fields stated by files
  next to the tensors (an HF config.json, saved training args); `family` may be
  one of them, and `notes` a list of lines for the user. Optional.
- `check_source(path, infos, options) -> dict | None`: raise when the stored
  tensors (`infos`, native names) cannot be converted (a quantized HF checkpoint
  of a method maxckpt does not read); return the plan of quantized weights to
  read dequantized (FP8 block, MXFP4), or None. Runs before the model spec is
  settled. Optional.
- `read_step(path, reader, options) -> int | None`: the training step the
  checkpoint records (MaxText's `step` item, TorchTitan's `train_state.step`,
  Megatron's iteration), carried over to targets that record one. Optional.
- `open_writer(path, spec, infos, options) -> TensorWriter`: `path` does not
  exist yet (it is a temporary sibling of the destination, renamed on
  success); create a directory or a file there. `infos` lists every tensor
  that will be written, in order. Optional: formats without it are read-only.
- `write_sidecars(path, spec, options)`: config files, tracker files, ... after
  the writer closed. Optional.

`records_step` marks targets whose output carries a training step
(`options.recorded_step`: Megatron's `iter_N`, TorchTitan's `step-N`).

>>> [f.name for f in FORMATS]
['maxtext', 'hf', 'megatron', 'torchtitan', 'torch']
>>> detect_format("/nonexistent")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
CheckpointNotFoundError: /nonexistent: no such file or directory
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from maxckpt.bounded import special_kind
from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, UnsupportedModelError
from maxckpt.formats import HFOptions, MaxTextOptions
from maxckpt.storage import outputs
from maxckpt.storage.urls import as_path
from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import TensorInfo

Hook = Callable[..., Any] | str | None
T = TypeVar("T")


@dataclass(frozen=True)
class ConversionOptions:
    """What a conversion was asked for, as the format hooks see it: how to read the source, and the target's knobs.

    A target's own knobs live only in its options class (:mod:`maxckpt.formats`), held in `target`;
    a hook reads them with :meth:`knobs`.
    """

    model: str | None = None  # family or MaxText model name
    step: int | None = None  # which committed step of a run to read
    dtype: np.dtype | None = None  # export dtype for floating tensors (None: keep)
    hf_config: Path | None = None  # an HF config.json stating what shapes cannot
    read_budget: int | None = None  # bytes of stacked layers read at once (None: a quarter of RAM)
    overrides: Mapping[str, Any] = field(default_factory=dict)  # ModelSpec fields (--set)
    maxtext_config: Path | None = None  # the MaxText config a MaxText source's run was trained with
    target: Any = None  # the target format's options (maxckpt.formats.TARGET_OPTIONS); None when only reading
    # Targets that record a training step: the step to write (None: none, Megatron `release/`,
    # TorchTitan `step-0` model only). `convert` settles it from the source and the target's knobs.
    recorded_step: int | None = None
    torch_single_file: bool | None = None  # torch target: one file (True) or a sharded dir (None: by suffix)
    # Set by the pipeline for the sidecars: a MaxText source's values assumed from a preset (recorded), else None.
    assumed_settings: Mapping[str, Any] | None = None
    # A multi-process conversion: this process's share (maxckpt.conversion.distributed.Share), else None.
    share: Any = None

    def knobs(self, cls: type[T]) -> T:
        """The target's options when they are a `cls`, else `cls`'s defaults (a source, or another target).

        >>> from maxckpt.formats import MegatronOptions
        >>> ConversionOptions(target=MegatronOptions(spec="local")).knobs(MegatronOptions).spec
        'local'
        """
        return self.target if isinstance(self.target, cls) else cls()


@dataclass(frozen=True)
class Format:
    """One checkpoint format (see the module docstring for each hook's signature)."""

    name: str
    description: str
    detect: Hook
    open_reader: Hook
    layout: Hook
    read_hints: Hook = None
    open_writer: Hook = None
    write_sidecars: Hook = None
    read_step: Hook = None
    check_source: Hook = None
    records_step: bool = False
    # Stores each weight of all layers as one stacked array (MaxText): a conversion then reads it
    # tensor by tensor (a group of layers at once); other sources are read layer by layer.
    stacked_layers: bool = False

    def hook(self, attr: str) -> Callable[..., Any] | None:
        value = getattr(self, attr)
        if isinstance(value, str):
            module, _, name = value.partition(":")
            value = getattr(importlib.import_module(module), name)
        return value

    @property
    def writable(self) -> bool:
        return self.open_writer is not None


# --------------------------------------------------------------- maxtext hooks


def _maxtext_reader(path: Path, options: ConversionOptions):
    from maxckpt.containers.orbax import OrbaxReader

    return OrbaxReader(path, step=options.step)


def _maxtext_layout(options: ConversionOptions):
    from maxckpt.formats.maxtext.layout import MaxTextLayout

    return MaxTextLayout(scan_layers=options.knobs(MaxTextOptions).scan_layers, read_budget=options.read_budget)


def _maxtext_step(path: Path, reader, options: ConversionOptions) -> int | None:
    # MaxText's train state stores the number of completed steps (step dir N holds N + 1).
    if "step" not in reader.tensors():
        return None
    return int(reader.read("step").reshape(()).item())


def _maxtext_writer(path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions):
    from maxckpt.containers.orbax import OrbaxWriter

    knobs = options.knobs(MaxTextOptions)
    scanned = knobs.scan_layers is not False
    return OrbaxWriter(
        path, step=0, custom_metadata={"scan_layers": scanned}, compression=knobs.compression, share=options.share, plan=infos
    )


# -------------------------------------------------------------------- hf hooks


def _is_safetensors(path: Path) -> bool:
    path = as_path(path)
    if path.is_file():
        return path.suffix == ".safetensors"
    return path.is_dir() and ((path / "model.safetensors.index.json").is_file() or any(path.glob("*.safetensors")))


def _hf_reader(path: Path, options: ConversionOptions):
    from maxckpt.containers.safetensors import SafetensorsReader

    return SafetensorsReader(path)


def _hf_layout(options: ConversionOptions):
    from maxckpt.formats.hf.layout import HFLayout

    return HFLayout()


def _hf_config_file(path: Path) -> Path:
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


def _hf_hints(path: Path, reader, options: ConversionOptions) -> dict[str, Any]:
    from maxckpt.formats.hf.files import config_hints

    config = _hf_config_file(path)
    return config_hints(config) if config.is_file() else {}


def _hf_check_source(path: Path, infos: Mapping[str, TensorInfo], options: ConversionOptions):
    from maxckpt.formats.hf.files import read_config
    from maxckpt.formats.hf.quantization import dequantization_plan

    # Quantized checkpoints are recognised by the tensors alone, or by the quantization_config of the
    # checkpoint's own config.json (a --hf-config describes a model, not these tensors): FP8 block and
    # MXFP4 are read dequantized, every other method is refused.
    config = _hf_config_file(path)
    return dequantization_plan(infos, read_config(config) if config.is_file() else None, str(path))


def _hf_writer(path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions):
    from maxckpt.containers.safetensors import SafetensorsWriter

    size = options.knobs(HFOptions).max_shard_size
    return SafetensorsWriter(path, max_shard_size=size, plan=infos, share=options.share)


def _hf_sidecars(path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
    from maxckpt.formats.hf.files import write_sidecars

    # The pipeline resolves options.dtype to the dtype it wrote, for config.json's torch_dtype.
    knobs = options.knobs(HFOptions)
    write_sidecars(path, spec, dtype=options.dtype, tokenizer=knobs.tokenizer, assumed=options.assumed_settings)
    if knobs.quantize:  # --quantize: the quantization_config the releases of that layout state
        import json

        from maxckpt.formats.hf.quantization import quantization_config

        config = json.loads((path / "config.json").read_text())
        config["quantization_config"] = quantization_config(knobs.quantize, spec.family)
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


# ------------------------------------------------------------------- registry

FORMATS: list[Format] = [
    Format(
        name="maxtext",
        description="MaxText on Orbax (a run dir, its checkpoints/ dir, a step dir or an items dir)",
        detect="maxckpt.containers.orbax:is_orbax_checkpoint",
        open_reader=_maxtext_reader,
        layout=_maxtext_layout,
        open_writer=_maxtext_writer,
        read_step=_maxtext_step,
        stacked_layers=True,
    ),
    Format(
        name="hf",
        description="HuggingFace safetensors model directory (sharded or single file) with config.json",
        detect=_is_safetensors,
        open_reader=_hf_reader,
        layout=_hf_layout,
        read_hints=_hf_hints,
        check_source=_hf_check_source,
        open_writer=_hf_writer,
        write_sidecars=_hf_sidecars,
    ),
    Format(
        name="megatron",
        description="Megatron-Core torch_dist (a root with latest_checkpointed_iteration.txt, or an iter_N / release dir)",
        detect="maxckpt.conversion.torch_formats:is_megatron",
        open_reader="maxckpt.conversion.torch_formats:megatron_reader",
        layout="maxckpt.conversion.torch_formats:megatron_layout",
        read_hints="maxckpt.conversion.torch_formats:megatron_hints",
        open_writer="maxckpt.conversion.torch_formats:megatron_writer",
        write_sidecars="maxckpt.conversion.torch_formats:megatron_sidecars",
        read_step="maxckpt.conversion.torch_formats:megatron_step",
        records_step=True,
    ),
    Format(
        name="torchtitan",
        description="TorchTitan DCP (a checkpoint folder holding step-N dirs, or one step-N dir)",
        detect="maxckpt.conversion.torch_formats:is_torchtitan",
        open_reader="maxckpt.conversion.torch_formats:torchtitan_reader",
        layout="maxckpt.conversion.torch_formats:torchtitan_layout",
        read_hints="maxckpt.conversion.torch_formats:torchtitan_hints",
        open_writer="maxckpt.conversion.torch_formats:torchtitan_writer",
        write_sidecars="maxckpt.conversion.torch_formats:torchtitan_sidecars",
        read_step="maxckpt.conversion.torch_formats:torchtitan_step",
        records_step=True,
    ),
    Format(
        name="torch",
        description="plain torch.save state dict with HF names (a .pt/.pth/.bin file, or pytorch_model*.bin in a dir)",
        detect="maxckpt.conversion.torch_formats:is_torch",
        open_reader="maxckpt.conversion.torch_formats:torch_reader",
        layout=_hf_layout,
        read_hints=_hf_hints,  # config.json in the directory or beside the file
        check_source=_hf_check_source,
        open_writer="maxckpt.conversion.torch_formats:torch_writer",
        write_sidecars="maxckpt.conversion.torch_formats:torch_sidecars",
    ),
]


def get_format(name: str) -> Format:
    """The registered format called `name`."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise UnsupportedModelError(f"unknown format {name!r}; known formats: {', '.join(f.name for f in FORMATS)}")


def detect_format(path: str | os.PathLike) -> Format:
    """The first registered format whose `detect` accepts `path`."""
    p = as_path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"{p}: no such file or directory")
    outputs.refuse_partial(p)
    for fmt in FORMATS:
        if fmt.hook("detect")(p):
            return fmt
    raise CheckpointNotFoundError(
        f"{p}: not a checkpoint maxckpt can read; tried {', '.join(f.name for f in FORMATS)}. "
        "Pass a MaxText run/step/items dir, an HF model dir with *.safetensors, a Megatron checkpoint root "
        "or iter_N dir, a TorchTitan checkpoint folder or step-N dir, or a torch .pt/.bin file."
    )
