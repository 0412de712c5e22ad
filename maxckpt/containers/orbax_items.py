"""What an Orbax items folder is: the one rule for finding it in a step and for telling whether it uses OCDBT.

An Orbax PyTree checkpoint item (MaxText's ``<step>/items``) is a folder
holding ``_METADATA`` (the tree) and the arrays: in one OCDBT database
(``manifest.ocdbt`` plus ``d/``) or, in older saves, one zarr folder per
array. The reader (:mod:`maxckpt.containers.orbax`), the manager's restore
(:mod:`maxckpt.manager.pytree_io`) and the codec check
(:mod:`maxckpt.containers.orbax_codecs`) all ask here.

>>> uses_ocdbt("/nonexistent/items", {"use_ocdbt": True})
True
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from etils import epath

from maxckpt.storage.urls import as_path

ITEM_METADATA = "_METADATA"
OCDBT_MANIFEST = "manifest.ocdbt"
ITEMS = "items"  # MaxText's item name: <checkpoint_dir>/<step>/items/


def is_items_dir(path: str | os.PathLike, *, damaged: bool = False) -> bool:
    """Whether `path` is an Orbax items folder: it holds `_METADATA`.

    `damaged=True` also takes a folder whose `_METADATA` is gone but whose
    OCDBT manifest is there, so that reading it can say what is missing
    rather than "not a checkpoint".
    """
    p = as_path(path)
    if damaged:
        return (p / ITEM_METADATA).exists() or (p / OCDBT_MANIFEST).exists()
    return (p / ITEM_METADATA).is_file()


def items_dir_of(step_dir: str | os.PathLike, *, damaged: bool = False) -> epath.Path | None:
    """The items folder of a step folder: `items/`, else its only sub-folder that is one; None when there is none.

    `damaged` as for :func:`is_items_dir`.
    """
    step = as_path(step_dir)
    if is_items_dir(step / ITEMS, damaged=damaged):
        return step / ITEMS
    found = [d for d in sorted(step.iterdir()) if d.is_dir() and is_items_dir(d, damaged=damaged)]
    return found[0] if len(found) == 1 else None


def items_dir_at(path: str | os.PathLike, *, damaged: bool = False) -> epath.Path | None:
    """The items folder `path` names: itself when it is one, else its own (as a step folder); None otherwise.

    The one rule for where a step's arrays are, shared by conversion (which also walks run folders) and the
    manager's restore (which also insists on the step's commit file).
    """
    p = as_path(path)
    if is_items_dir(p, damaged=damaged):
        return p
    return items_dir_of(p, damaged=damaged) if p.is_dir() else None


def uses_ocdbt(
    items_dir: str | os.PathLike, metadata: Mapping[str, Any] | None = None, *, unstated: bool | None = None
) -> bool:
    """Whether `items_dir` stores its arrays in one OCDBT database.

    What its `_METADATA` says (`use_ocdbt`; pass `metadata` when it is read
    already), else `unstated`, else whether `manifest.ocdbt` is there.
    """
    if metadata is None:
        from maxckpt.storage.bounded import read_json_object

        try:
            metadata = read_json_object(os.fspath(as_path(items_dir) / ITEM_METADATA))
        except (OSError, ValueError):
            metadata = {}
    stated = metadata.get("use_ocdbt") if isinstance(metadata, Mapping) else None
    if stated is not None:
        return bool(stated)
    if unstated is not None:
        return unstated
    return (as_path(items_dir) / OCDBT_MANIFEST).exists()
