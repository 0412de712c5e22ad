"""What a checkpoint format is to the conversion pipeline: the :class:`Format` methods and what they are given.

A format ties a container (how bytes are stored) to a layout (how tensors are named and shaped) plus
the files a usable checkpoint needs beside the tensors. Each format is one subclass, in
`maxckpt/formats/<name>/format.py`; the registry is :data:`maxckpt.formats.FORMATS`. Its methods
import containers and layouts when called, so the registry stays importable without torch, JAX or
transformers. Every method gets the :class:`ConversionOptions` of the conversion (or of the opening).

>>> from maxckpt.formats import get_format
>>> fmt = get_format("megatron")
>>> fmt.records_step, fmt.writable, fmt.layout(ConversionOptions()).name
(True, True, 'megatron')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence, TypeVar

from maxckpt.errors import ConversionError

if TYPE_CHECKING:  # annotations only: the registry imports no numpy, ml_dtypes or containers
    import numpy as np

    from maxckpt.containers.base import TensorReader, TensorWriter
    from maxckpt.layouts.base import Layout, ModelSpec
    from maxckpt.tensors import TensorInfo

T = TypeVar("T")


@dataclass(frozen=True)
class ConversionOptions:
    """What a conversion was asked for, as the format methods see it: how to read the source, and the target's knobs.

    A target's own knobs live only in its options class (:mod:`maxckpt.formats`), held in `target`;
    a method reads them with :meth:`knobs`.
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


class Format:
    """One checkpoint format. Subclasses set `name` and `description` and implement the methods they support.

    `detect`, `open_reader` and `layout` are required; the others have a default meaning "this format
    has none" (no hint files, nothing refused, no step, no sidecars). A format without `open_writer`
    is read-only (:attr:`writable`).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    # The output carries a training step (`options.recorded_step`: Megatron's `iter_N`, TorchTitan's `step-N`).
    records_step: ClassVar[bool] = False
    # Stores each weight of all layers as one stacked array (MaxText): a conversion then reads it
    # tensor by tensor (a group of layers at once); other sources are read layer by layer.
    stacked_layers: ClassVar[bool] = False

    def detect(self, path: Path) -> bool:
        """Is `path` a checkpoint of this format? Cheap: file names, small metadata."""
        raise NotImplementedError

    def open_reader(self, path: Path, options: ConversionOptions) -> TensorReader:
        """The reader of the checkpoint at `path` (the step `options.step` of a run)."""
        raise NotImplementedError

    def layout(self, options: ConversionOptions) -> Layout:
        """The layout this format's tensors are named and shaped in."""
        raise NotImplementedError

    def read_hints(self, path: Path, reader: TensorReader, options: ConversionOptions) -> dict[str, Any] | None:
        """ModelSpec fields stated by files next to the tensors (an HF config.json, saved training args).

        `family` may be one of them, and `notes` a list of lines for the user. None: this format keeps
        no such files (then the settings come from flags, a config or a preset).
        """
        return None

    def check_source(
        self, path: Path, infos: Mapping[str, TensorInfo], options: ConversionOptions
    ) -> dict[str, Any] | None:
        """Raise when the stored tensors (`infos`, native names) cannot be converted; return the plan of quantized
        weights to read dequantized, or None. Runs before the model spec is settled."""
        return None

    def read_step(self, path: Path, reader: TensorReader, options: ConversionOptions) -> int | None:
        """The training step the checkpoint records, carried over to targets that record one (None: none)."""
        return None

    def open_writer(
        self, path: Path, spec: ModelSpec, infos: Sequence[TensorInfo], options: ConversionOptions
    ) -> TensorWriter:
        """A writer creating the checkpoint at `path`, which does not exist yet (a temporary sibling of the
        destination, renamed on success). `infos` lists every tensor that will be written, in order."""
        raise ConversionError(f"format {self.name!r} can be read but not written")

    def write_sidecars(self, path: Path, spec: ModelSpec, options: ConversionOptions) -> None:
        """Config files, tracker files, ... written after the writer closed."""

    @property
    def writable(self) -> bool:
        """This format can be a conversion's target (it has its own :meth:`open_writer`)."""
        return type(self).open_writer is not Format.open_writer

    def __repr__(self) -> str:
        return f"<format {self.name}>"
