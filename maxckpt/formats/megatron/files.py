"""Megatron-LM run directories: the tracker file, iteration dirs, `common.pt`, `metadata.json`, opening the writer.

A Megatron checkpoint root holds ``latest_checkpointed_iteration.txt`` (the
iteration, or ``release``) and ``iter_NNNNNNN/`` (or ``release/``) folders;
each folder is a torch_dist (DCP) checkpoint plus ``common.pt``, Megatron's
pickled args, and ``metadata.json``, the backend marker. Reading works on local
paths and bucket URLs; ``common.pt`` is read without running code from it.
The tensor names are the layout's (:mod:`maxckpt.formats.megatron.layout`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError
from maxckpt.formats.megatron.args import megatron_args
from maxckpt.formats.megatron.layout import MegatronLayout
from maxckpt.layouts.base import ModelSpec
from maxckpt.storage import objects
from maxckpt.storage.run_dirs import MEGATRON_TRACKER as TRACKER_FILE
from maxckpt.storage.urls import as_path, is_url

if TYPE_CHECKING:
    from maxckpt.containers.dcp import DcpWriter

__all__ = [
    "COMMON_FILE",
    "TRACKER_FILE",
    "OpaqueObject",
    "find_megatron_checkpoint",
    "iteration_dir_name",
    "open_megatron_writer",
    "read_megatron_common",
    "read_tracker",
    "write_megatron_sidecars",
]

COMMON_FILE = "common.pt"
METADATA_JSON = "metadata.json"
# What `dist_checkpointing.save` writes next to a torch_dist checkpoint (core 0.16).
METADATA_JSON_CONTENT = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
# Megatron-LM's `generate_state_dict` stamps this; loaders below 3.0 compare
# `model_parallel_size` and try to reorder legacy QKV.
CHECKPOINT_VERSION = 3.0
def iteration_dir_name(iteration: int | None) -> str:
    """`iter_0000100` (7 digits, Megatron-LM's `get_checkpoint_name`) or `release` for None."""
    return "release" if iteration is None else f"iter_{int(iteration):07d}"


def find_megatron_checkpoint(path: str | os.PathLike, iteration: int | None = None) -> tuple[Path, int | None]:
    """(iteration dir, iteration or None for release) for a run root or an iteration dir.

    A root is resolved through `latest_checkpointed_iteration.txt` unless
    `iteration` picks one; an `iter_NNNNNNN`/`release` dir is taken as is.
    """
    path = as_path(path)
    if (path / ".metadata").is_file():
        m = re.fullmatch(r"iter_(\d+)", path.name)
        return path, (int(m.group(1)) if m else None)
    if iteration is not None:
        it_dir = path / iteration_dir_name(iteration)
    else:
        tracker = path / TRACKER_FILE
        if tracker.exists() and not tracker.is_file():
            raise CorruptCheckpointError(f"{tracker}: is not a file; it should hold an iteration number or 'release'")
        if not tracker.is_file():
            raise CheckpointNotFoundError(
                f"{path}: not a Megatron checkpoint (no {TRACKER_FILE} and no .metadata); "
                "pass the run's checkpoint root or an iter_NNNNNNN directory"
            )
        text = read_tracker(tracker)
        if text == "release":
            iteration = None
        elif text.isdigit():
            iteration = int(text)
        else:
            raise CorruptCheckpointError(f"{tracker}: holds {text[:40]!r}, expected an iteration number or 'release'")
        it_dir = path / iteration_dir_name(iteration)
    if not (it_dir / ".metadata").is_file():
        raise CheckpointNotFoundError(f"{it_dir}: no torch_dist checkpoint here (.metadata is missing)")
    return it_dir, iteration


def read_tracker(tracker: Path) -> str:
    """The stripped text of `latest_checkpointed_iteration.txt` (a few bytes); a clear error when it is not text."""
    try:
        with objects.open_read(tracker) as f:  # a FIFO or device is an error, not a hang
            raw = f.read(256)
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"{tracker}: is not text; expected an iteration number or 'release'") from None
    except OSError as e:
        raise CorruptCheckpointError(
            f"{tracker}: cannot read it ({e.strerror or e}); expected a file holding an iteration number or 'release'"
        ) from None


def read_megatron_common(iter_dir: str | os.PathLike) -> dict[str, Any] | None:
    """`common.pt` of an iteration dir, loaded without running code; None when absent.

    Plain data and `argparse.Namespace` load as they are. Megatron-LM's own
    `common.pt` also pickles objects of its classes (enums in `args`, the
    rerun state machine): those come back as inert :class:`OpaqueObject`
    placeholders - no class from the file is imported or called - so the
    model's args are readable from any Megatron release.
    """

    path = as_path(iter_dir) / COMMON_FILE
    if not path.is_file():
        return None
    source = (lambda: io.BytesIO(objects.read_bytes(path))) if is_url(path) else (lambda: path)  # small file
    from maxckpt.storage.bounded import check_torch_file

    try:
        check_torch_file(source())  # nesting bounded before anything unpickles it
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(
            f"{path}: not a readable torch.save file ({e}); the Megatron checkpoint's common state is damaged"
        ) from None
    from maxckpt.containers.torch_safety import load_weights_only

    try:  # torch's allow-list and Namespace only, whatever the process registered (megatron-core adds more)
        state = load_weights_only(source(), allow=[argparse.Namespace])
    except Exception:  # weights_only refuses other globals: read the pickle with placeholders
        state = _load_common_inert(source())
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"{path}: holds {type(state).__name__}, expected a dict")
    return state


class OpaqueObject:
    """Stands in for an object of a class maxckpt does not import (read from a pickle, inert)."""

    _qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<opaque {self._qualname}{self.args!r}>"


def _opaque_class(module: str, name: str) -> type:
    return type(name, (OpaqueObject,), {"_qualname": f"{module}.{name}"})


def _reconstruct(cls: type, base: type, state: Any) -> Any:
    # copyreg._reconstructor (pickle protocols 0/1), restricted to classes we admit: no foreign code runs.
    if cls is argparse.Namespace:
        return argparse.Namespace(**(state if isinstance(state, dict) else {}))
    obj = OpaqueObject.__new__(cls) if isinstance(cls, type) and issubclass(cls, OpaqueObject) else OpaqueObject()
    if state is not None:
        obj.state = state
    return obj


def _load_common_inert(path: Path) -> Any:
    """Unpickle a torch zip file's `data.pkl` admitting only plain data; everything else is a placeholder."""
    import pickle
    import zipfile

    from maxckpt.containers.dcp import PLAIN_DATA_GLOBALS, torch_enum_value

    safe: dict[tuple[str, str], Any] = {
        **PLAIN_DATA_GLOBALS,
        ("argparse", "Namespace"): argparse.Namespace,
        ("builtins", "object"): object,
        ("copyreg", "_reconstructor"): _reconstruct,
    }

    class Inert(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            value = safe.get((module, name)) or (torch_enum_value(name) if module == "torch" else None)
            return value if value is not None else _opaque_class(module, name)

        def persistent_load(self, pid: Any) -> Any:
            return None  # tensor storages: common.pt's model args need none

    try:
        with zipfile.ZipFile(path) as archive:
            pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            with archive.open(pkl) as f:
                return Inert(f).load()
    except Exception as e:  # nothing from the file can run here, so any failure means a damaged file
        raise CorruptCheckpointError(
            f"{path}: not a readable torch.save file ({type(e).__name__}: {str(e)[:200]}); the Megatron "
            "checkpoint's common state is damaged"
        ) from None


def write_megatron_sidecars(
    root: str | os.PathLike,
    spec: ModelSpec,
    layout: MegatronLayout,
    iteration: int | None = None,
    *,
    common: bool = True,
    assumed: Mapping[str, Any] | None = None,
) -> Path:
    """Write what Megatron-LM expects around the DCP files; returns the iteration dir.

    `<root>/latest_checkpointed_iteration.txt` (the iteration, or `release`),
    `<iter dir>/metadata.json` (the torch_dist backend marker that
    `dist_checkpointing.check_is_distributed_checkpoint` looks for), and, for
    core releases that keep the common state in a file (0.16 does),
    `<iter dir>/common.pt`: `args`, `checkpoint_version` 3.0, `iteration`,
    `num_floating_point_operations_so_far`, `content_metadata`. Call it after
    the DCP files are in place: the tracker file is written last.

    `iteration=None` writes a `release/` checkpoint, which Megatron-LM loads
    with iteration 0 and without looking for optimizer or RNG state.
    """
    import torch

    root = Path(root)
    it_dir = root / iteration_dir_name(iteration)
    it_dir.mkdir(parents=True, exist_ok=True)
    (it_dir / METADATA_JSON).write_text(json.dumps(METADATA_JSON_CONTENT))
    if common:
        args = megatron_args(spec, layout)
        if assumed:  # a MaxText source's values taken from a preset; no Megatron argument, read by no loader
            args.maxckpt_assumed_settings = dict(assumed)
        state = {
            "args": args,
            "checkpoint_version": CHECKPOINT_VERSION,
            "iteration": 0 if iteration is None else int(iteration),
            "num_floating_point_operations_so_far": 0,
            # Stacked (not per-layer) sharded keys; read by Megatron-LM's loader.
            "content_metadata": {"singleton_local_shards": False},
        }
        torch.save(state, it_dir / COMMON_FILE)
    tmp = root / (TRACKER_FILE + ".tmp")
    tmp.write_text("release" if iteration is None else str(int(iteration)))
    os.replace(tmp, root / TRACKER_FILE)
    return it_dir


def open_megatron_writer(
    root: str | os.PathLike, spec: ModelSpec, layout: MegatronLayout, iteration: int | None = None, share: Any = None
) -> "DcpWriter":
    """A DcpWriter for `<root>/iter_NNNNNNN` (or `release`) with the `_extra_state` items already in.

    Stream the tensors of `layout.from_hf(...)` into it, close it, then call
    :func:`write_megatron_sidecars` with the same arguments.
    """
    from maxckpt.containers.dcp import DcpWriter

    writer = DcpWriter(Path(root) / iteration_dir_name(iteration), share=share)
    if share is None or share.rank == 0:  # a multi-process conversion: process 0 writes the non-tensor items
        for name, obj in layout.extra_state(spec).items():
            writer.write_object(name, obj)
    return writer
