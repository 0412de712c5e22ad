"""Megatron-LM run directories: which iteration to read, and its `common.pt`, read without running code.

A Megatron checkpoint root holds ``latest_checkpointed_iteration.txt`` (the
iteration, or ``release``) and ``iter_NNNNNNN/`` (or ``release/``) folders;
each folder is a torch_dist (DCP) checkpoint plus ``common.pt``, Megatron's
pickled args. This is storage knowledge, kept out of the tensor layout
(:mod:`maxckpt.layouts.megatron`), and works on local paths and bucket URLs.
"""

from __future__ import annotations

import argparse
import io
import os
import re
from pathlib import Path
from typing import Any

from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError
from maxckpt.storage import objects
from maxckpt.storage.run_dirs import MEGATRON_TRACKER as TRACKER_FILE
from maxckpt.storage.urls import as_path, is_url

COMMON_FILE = "common.pt"


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
    from maxckpt.bounded import check_torch_file

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
