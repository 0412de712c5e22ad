"""The TorchTitan format: DCP `step-N` folders (the model, and `train_state` when N > 0)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from maxckpt.formats.base import ConversionOptions, Format
from maxckpt.formats.torchtitan.options import TorchTitanOptions

if TYPE_CHECKING:
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import TensorInfo
    from maxckpt.containers.dcp import DcpReader, DcpWriter
    from maxckpt.formats.torchtitan.layout import TorchTitanLayout


class TorchTitanFormat(Format):
    """`<folder>/step-N/` with `maxckpt_model.json`; the step is `train_state.step`, else the folder's N."""

    name = "torchtitan"
    description = "TorchTitan DCP (a checkpoint folder holding step-N dirs, or one step-N dir)"
    records_step = True

    def detect(self, path: Path) -> bool:
        from maxckpt.formats.dcp_detection import is_torchtitan

        return is_torchtitan(path)

    def open_reader(self, path: Path, options: ConversionOptions) -> DcpReader:
        from maxckpt.containers.dcp import DcpReader
        from maxckpt.formats.torchtitan.files import find_step_dir

        directory, step = find_step_dir(path, options.step)
        return DcpReader(directory, step=step)

    def layout(self, options: ConversionOptions) -> TorchTitanLayout:
        from maxckpt.formats.torchtitan.layout import TorchTitanLayout

        return TorchTitanLayout(keys=options.knobs(TorchTitanOptions).keys)  # type: ignore[arg-type]

    def read_hints(self, path: Path, reader: DcpReader, options: ConversionOptions) -> dict[str, Any]:
        # TorchTitan keeps model settings in its job config, not the checkpoint: only our own sidecar states them.
        from maxckpt.formats.model_json import read_model_json

        return read_model_json(reader.path)

    def read_step(self, path: Path, reader: DcpReader, options: ConversionOptions) -> int | None:
        from maxckpt.formats.torchtitan.files import read_train_step

        step = read_train_step(reader)
        return reader.step if step is None else step  # train_state.step, else the step-N dir name

    def open_writer(self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo],
                    options: ConversionOptions) -> DcpWriter:
        from maxckpt.formats.torchtitan.files import open_torchtitan_writer

        step = options.recorded_step or 0
        # train_state only with a step: TorchTitan loads step-0 model-only and treats step > 0 as a resume.
        return open_torchtitan_writer(path, step, train_state=step > 0, share=options.share)

    def write_sidecars(self, path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
        from maxckpt.formats.model_json import write_model_json
        from maxckpt.formats.torchtitan.files import step_dir_name

        write_model_json(Path(path) / step_dir_name(options.recorded_step or 0), spec)
