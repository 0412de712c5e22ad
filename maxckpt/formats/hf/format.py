"""The HF format: a safetensors model directory (sharded or one file) with config.json; FP8 block and MXFP4 read.

Its methods import the layout and the files when called, so the registry stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from maxckpt.formats.base import ConversionOptions, Format
from maxckpt.formats.hf.options import HFOptions

if TYPE_CHECKING:
    from maxckpt.containers.base import TensorReader
    from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter
    from maxckpt.formats.hf.layout import HFLayout
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import TensorInfo


class HFFormat(Format):
    """HuggingFace safetensors: the hub's names, config.json and generation_config.json beside them.

    Its reading side (layout, config.json hints, the quantization check) is also the torch format's.
    """

    name = "hf"
    description = "HuggingFace safetensors model directory (sharded or single file) with config.json"

    def detect(self, path: Path) -> bool:
        from maxckpt.formats.hf.files import is_hf_checkpoint

        return is_hf_checkpoint(path)

    def open_reader(self, path: Path, options: ConversionOptions) -> SafetensorsReader:
        from maxckpt.formats.hf.files import open_reader

        return open_reader(path)

    def layout(self, options: ConversionOptions) -> HFLayout:
        from maxckpt.formats.hf.layout import HFLayout

        return HFLayout()

    def read_hints(self, path: Path, reader: TensorReader, options: ConversionOptions) -> dict[str, Any]:
        """What the checkpoint's own config.json (in the directory, or beside the file) states."""
        from maxckpt.formats.hf.files import checkpoint_hints

        return checkpoint_hints(path)

    def check_source(self, path: Path, infos: Mapping[str, TensorInfo],
                     options: ConversionOptions) -> dict[str, Any] | None:
        """The plan of quantized weights to read dequantized (FP8 block, MXFP4), None when none; other methods refused.

        Quantized checkpoints are recognised by the tensors alone, or by the quantization_config of the
        checkpoint's own config.json (a --hf-config describes a model, not these tensors).
        """
        from maxckpt.formats.hf.files import checkpoint_config
        from maxckpt.formats.hf.quantization import dequantization_plan

        return dequantization_plan(infos, checkpoint_config(path), str(path))

    def open_writer(self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo],
                    options: ConversionOptions) -> SafetensorsWriter:
        from maxckpt.formats.hf.files import open_writer

        return open_writer(path, infos, max_shard_size=options.knobs(HFOptions).max_shard_size, share=options.share)

    def write_sidecars(self, path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
        from maxckpt.formats.hf.files import write_sidecars

        # The pipeline resolves options.dtype to the dtype it wrote, for config.json's torch_dtype.
        knobs = options.knobs(HFOptions)
        quantization = None
        if knobs.quantize:  # --quantize: the quantization_config the releases of that layout state
            from maxckpt.formats.hf.quantization import quantization_config

            quantization = quantization_config(knobs.quantize, spec.family)
        write_sidecars(path, spec, dtype=options.dtype, tokenizer=knobs.tokenizer, assumed=options.assumed_settings,
                       quantization=quantization)
