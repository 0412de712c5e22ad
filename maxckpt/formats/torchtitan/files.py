"""TorchTitan checkpoint folders: which `step-N` to read, the `train_state` step in it, opening the writer.

TorchTitan's checkpointer writes ``<folder>/step-<N>/`` DCP checkpoints; the
newest committed one (its ``.metadata`` is written last) is what it resumes
from. Reading works on local paths and bucket URLs; the tensor names are the
layout's (:mod:`maxckpt.formats.torchtitan.layout`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError
from maxckpt.storage.run_dirs import scan_run_dir
from maxckpt.storage.urls import as_path

if TYPE_CHECKING:
    from maxckpt.containers.dcp import DcpWriter

__all__ = ["TRAIN_STATE", "find_step_dir", "open_torchtitan_writer", "read_train_step", "step_dir_name",
           "write_train_state"]

TRAIN_STATE = "train_state"


def step_dir_name(step: int) -> str:
    """`step-<N>`, the directory name TorchTitan's checkpointer writes and looks for."""
    return f"step-{int(step)}"


def find_step_dir(path: str | os.PathLike, step: int | None = None) -> tuple[Path, int | None]:
    """(DCP dir, step) for a `step-N` dir or a checkpoint folder holding several.

    Like TorchTitan's `_find_load_step`, only `step-N` dirs with a `.metadata`
    count; the highest wins unless `step` picks one.
    """
    path = as_path(path)
    if (path / ".metadata").is_file():
        m = re.search(r"step-(\d+)", path.name)
        return path, (int(m.group(1)) if m else None)
    # The run-dir scanner's rule (committed = `.metadata`, written last), plus: DCP only.
    committed = scan_run_dir(path, "torchtitan").committed if path.is_dir() else ()
    steps = {e.step: d for e in committed if ((d := as_path(os.fspath(e.path))) / ".metadata").is_file()}
    if step is not None:
        if step not in steps:
            raise CheckpointNotFoundError(f"{path}: no committed {step_dir_name(step)} (found steps {sorted(steps)})")
        return steps[step], step
    if not steps:
        raise CheckpointNotFoundError(
            f"{path}: no TorchTitan checkpoint here (no step-N directory with a .metadata file)"
        )
    best = max(steps)
    return steps[best], best


def write_train_state(writer: Any, step: int, ntokens_seen: int = 0) -> None:
    """Write `train_state.step` (and `.ntokens_seen`) as TorchTitan 0.3.0's Trainer stores them.

    Its `Trainer.state_dict()` is `{"step": int, "ntokens_seen": int}` under the
    `train_state` key, so both are bytes items holding a `torch.save`d int.
    `ntokens_seen` is unknown after a conversion and defaults to 0; it only
    feeds logging. `writer` is a `DcpWriter`.
    """
    writer.write_object(f"{TRAIN_STATE}.step", int(step), path=(TRAIN_STATE, "step"))
    writer.write_object(f"{TRAIN_STATE}.ntokens_seen", int(ntokens_seen), path=(TRAIN_STATE, "ntokens_seen"))


def read_train_step(reader: Any) -> int | None:
    """`train_state.step` of a TorchTitan checkpoint (int bytes item or tensor), or None.

    `reader` is a `DcpReader`; older TorchTitan stored the step as a tensor.
    """
    name = f"{TRAIN_STATE}.step"
    if name in reader.objects():
        value = reader.read_object(name)
    elif name in reader.tensors():
        value = reader.read(name)
    else:
        return None
    try:
        return int(np.asarray(value).reshape(()).item())
    except (TypeError, ValueError) as err:
        raise CorruptCheckpointError(
            f"{reader.path}: {name} holds {value!r}, not a step number ({err}); pass --iteration N or --release"
        ) from None


def open_torchtitan_writer(
    folder: str | os.PathLike, step: int, *, train_state: bool = False, share: Any = None
) -> "DcpWriter":
    """A DcpWriter for `<folder>/step-<step>`; with `train_state`, `train_state.step` is already in.

    Model only by default: TorchTitan's `initial_load_model_only` loads just
    the model keys, and a model-only `step-0` needs nothing else.
    """
    from maxckpt.containers.dcp import DcpWriter

    writer = DcpWriter(Path(folder) / step_dir_name(step), share=share)
    if train_state and (share is None or share.rank == 0):  # multi-process: process 0 writes it
        write_train_state(writer, step)
    return writer
