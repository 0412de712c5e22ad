"""The MaxText format: Orbax checkpoints of MaxText's parameter tree, read from a run and written as one step.

Its methods import the layout and the files (Orbax, TensorStore) when called, so the registry stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from maxckpt.formats.base import ConversionOptions, Format
from maxckpt.formats.maxtext.options import MaxTextOptions

if TYPE_CHECKING:
    from maxckpt.containers.orbax import OrbaxReader, OrbaxWriter
    from maxckpt.formats.maxtext.layout import MaxTextLayout
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import TensorInfo


class MaxTextFormat(Format):
    """MaxText on Orbax: its layers stacked (scanned) or not, its step the train state's `step` item."""

    name = "maxtext"
    description = "MaxText on Orbax (a run dir, its checkpoints/ dir, a step dir or an items dir)"
    stacked_layers = True

    def detect(self, path: Path) -> bool:
        from maxckpt.formats.maxtext.files import is_maxtext_checkpoint

        return is_maxtext_checkpoint(path)

    def open_reader(self, path: Path, options: ConversionOptions) -> OrbaxReader:
        from maxckpt.formats.maxtext.files import open_reader

        return open_reader(path, options.step)

    def layout(self, options: ConversionOptions) -> MaxTextLayout:
        from maxckpt.formats.maxtext.layout import MaxTextLayout

        return MaxTextLayout(scan_layers=options.knobs(MaxTextOptions).scan_layers, read_budget=options.read_budget)

    def read_step(self, path: Path, reader: OrbaxReader, options: ConversionOptions) -> int | None:
        from maxckpt.formats.maxtext.files import read_step

        return read_step(reader)

    def open_writer(self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo],
                    options: ConversionOptions) -> OrbaxWriter:
        from maxckpt.formats.maxtext.files import open_writer

        knobs = options.knobs(MaxTextOptions)
        return open_writer(path, infos, scanned=knobs.scan_layers is not False, compression=knobs.compression,
                           share=options.share)
