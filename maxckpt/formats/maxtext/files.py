"""The files of a MaxText checkpoint: finding it in a run dir, its recorded step, opening its Orbax writer.

A MaxText source is a run dir, its `checkpoints/` dir, a step dir or an items dir (:func:`open_reader`
finds the committed step asked for); the train state's `step` item is the step it records. A written
checkpoint is one Orbax step 0 whose custom metadata says whether its layers are scanned.

>>> is_maxtext_checkpoint("/nonexistent")
False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from maxckpt.tensors import TensorInfo

if TYPE_CHECKING:
    from maxckpt.containers.orbax import OrbaxReader, OrbaxWriter


def is_maxtext_checkpoint(path: str | os.PathLike) -> bool:
    """`path` resolves to an Orbax items dir: a run dir, `checkpoints/`, a step dir or the items dir itself."""
    from maxckpt.containers.orbax import is_orbax_checkpoint

    return is_orbax_checkpoint(path)


def open_reader(path: Path, step: int | None = None) -> OrbaxReader:
    """The reader of committed step `step` of the run at `path` (None: the newest), or of the step dir `path`."""
    from maxckpt.containers.orbax import OrbaxReader

    return OrbaxReader(path, step=step)


def read_step(reader: Any) -> int | None:
    """The train state's `step` item: the number of completed steps (step dir N holds N + 1); None without one."""
    if "step" not in reader.tensors():
        return None
    return int(reader.read("step").reshape(()).item())


def open_writer(path: Path, infos: Sequence[TensorInfo], *, scanned: bool, compression: Any = None,
                share: Any = None) -> OrbaxWriter:
    """An Orbax writer of one checkpoint (step 0) at `path`, recording `scan_layers` in its custom metadata."""
    from maxckpt.containers.orbax import OrbaxWriter

    return OrbaxWriter(path, step=0, custom_metadata={"scan_layers": scanned}, compression=compression, share=share,
                       plan=infos)
