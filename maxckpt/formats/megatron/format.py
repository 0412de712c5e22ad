"""The Megatron format: Megatron-Core `torch_dist` (DCP) under a checkpoint root with its tracker file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from maxckpt.errors import CorruptCheckpointError
from maxckpt.formats.base import ConversionOptions, Format
from maxckpt.formats.megatron.options import MegatronOptions

if TYPE_CHECKING:
    from maxckpt.layouts.base import ModelSpec
    from maxckpt.tensors import TensorInfo
    from maxckpt.containers.dcp import DcpReader, DcpWriter
    from maxckpt.formats.megatron.layout import MegatronLayout


class MegatronFormat(Format):
    """`iter_NNNNNNN/` (or `release/`) dirs with `metadata.json`, `common.pt` and `maxckpt_model.json`."""

    name = "megatron"
    description = "Megatron-Core torch_dist (a root with latest_checkpointed_iteration.txt, or an iter_N / release dir)"
    records_step = True

    def detect(self, path: Path) -> bool:
        from maxckpt.formats.dcp_detection import is_megatron

        return is_megatron(path)

    def open_reader(self, path: Path, options: ConversionOptions) -> DcpReader:
        from maxckpt.containers.dcp import DcpReader
        from maxckpt.formats.megatron.files import find_megatron_checkpoint

        directory, iteration = find_megatron_checkpoint(path, options.step)
        return DcpReader(directory, step=iteration)

    def layout(self, options: ConversionOptions) -> MegatronLayout:
        from maxckpt.formats.megatron.layout import MegatronLayout

        knobs = options.knobs(MegatronOptions)
        return MegatronLayout(spec=knobs.spec, make_vocab_size_divisible_by=knobs.make_vocab_size_divisible_by)

    def read_hints(self, path: Path, reader: DcpReader, options: ConversionOptions) -> dict[str, Any]:
        """`common.pt` args (checked to describe a Llama-family model), then `maxckpt_model.json`.

        Without a stated vocabulary size the padded one is kept, with a note.
        """
        from maxckpt.formats.megatron.args import spec_fields_from_megatron_args
        from maxckpt.formats.megatron.files import read_megatron_common
        from maxckpt.formats.megatron.support import check_supported_args
        from maxckpt.formats.model_json import read_model_json

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

    def read_step(self, path: Path, reader: DcpReader, options: ConversionOptions) -> int | None:
        return reader.step  # the iteration of iter_NNNNNNN (None for release/)

    def open_writer(self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo],
                    options: ConversionOptions) -> DcpWriter:
        from maxckpt.formats.megatron.files import open_megatron_writer

        return open_megatron_writer(path, spec, self.layout(options), iteration=options.recorded_step,
                                    share=options.share)

    def write_sidecars(self, path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
        from maxckpt.formats.megatron.files import iteration_dir_name, write_megatron_sidecars
        from maxckpt.formats.model_json import write_model_json

        write_model_json(Path(path) / iteration_dir_name(options.recorded_step), spec)
        write_megatron_sidecars(path, spec, self.layout(options), iteration=options.recorded_step,  # tracker file last
                                assumed=options.assumed_settings)
