"""The torch format: a plain `torch.save` state dict with HF names (the HF layout, HF's config.json beside it).

Its methods import torch's files (and torch) when called, so the registry stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from maxckpt.formats.base import ConversionOptions
from maxckpt.formats.hf.format import HFFormat
from maxckpt.formats.torch.options import TorchOptions

if TYPE_CHECKING:
    from maxckpt.containers.torch_file import TorchFileReader, TorchFileWriter
    from maxckpt.formats.hf.layout import HFLayout
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import TensorInfo


class TorchFormat(HFFormat):
    """`torch.save` files of HF-named tensors: the HF layout, hints and checks (a config.json in the directory or
    beside the file), another container; written as one file or as shards."""

    name = "torch"
    description = "plain torch.save state dict with HF names (a .pt/.pth/.bin file, or pytorch_model*.bin in a dir)"

    def detect(self, path: Path) -> bool:
        from maxckpt.formats.torch.files import is_torch_checkpoint

        return is_torch_checkpoint(path)

    def layout(self, options: ConversionOptions) -> HFLayout:
        from maxckpt.formats.hf.layout import HFLayout

        return HFLayout(for_transformers=False)  # a state dict, not a model transformers must load

    def open_reader(self, path: Path, options: ConversionOptions) -> TorchFileReader:
        from maxckpt.formats.torch.files import open_reader

        return open_reader(path)

    def open_writer(self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo],
                    options: ConversionOptions) -> TorchFileWriter:
        from maxckpt.formats.torch.files import open_writer

        return open_writer(path, max_shard_size=options.knobs(TorchOptions).max_shard_size,
                           single=bool(options.torch_single_file), share=options.share)

    def write_sidecars(self, path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
        from maxckpt.formats.torch.files import write_sidecars

        write_sidecars(path, spec, single=bool(options.torch_single_file), dtype=options.dtype,
                       tokenizer=options.knobs(TorchOptions).tokenizer, assumed=options.assumed_settings)
