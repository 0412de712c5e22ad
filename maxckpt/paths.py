"""Every path a user hands maxckpt is normalised once, here, at the boundary.

Layers below (TensorStore above all, which refuses `..` in a file path) then
only ever see absolute paths with `..` resolved. `~` is expanded. Symlinks are
left as they are (resolving them would change what a user sees in messages);
code that must compare locations uses :func:`same_or_inside`, which checks
both the spelled and the resolved form.

URLs (`gs://bucket/run`, `s3://...`) are returned unchanged as strings: they
are not local paths and normalising them would break them.

>>> import os
>>> str(normalize("/a/b/../c"))
'/a/c'
>>> normalize("gs://bucket/run/../x")
'gs://bucket/run/../x'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
    """True for `scheme://...` paths (object stores), which are never rewritten."""
    return bool(_URL.match(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else False


def normalize(path: str | os.PathLike) -> Path:
    """An absolute local Path with `~` expanded and `..` resolved (URLs come back unchanged).

    >>> normalize("x").is_absolute()
    True
    """
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if is_url(raw):
        return raw  # type: ignore[return-value]  # left alone on purpose (see module docstring)
    from maxckpt.storage.urls import as_path

    return as_path(raw)  # the one place local paths are made absolute


def normalize_optional(path: str | os.PathLike | None) -> Path | None:
    """:func:`normalize`, passing None through."""
    return None if path is None else normalize(path)


def forms(path: Path) -> tuple[Path, ...]:
    """The spelled (absolute) and resolved (symlinks followed) forms of `path`, without duplicates."""
    spelled = Path(os.path.abspath(path))
    try:
        real = spelled.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return (spelled,)
    return (spelled,) if real == spelled else (spelled, real)


def same_or_inside(inner: Path, outer: Path) -> bool:
    """True when `inner` is `outer` or lies inside it, spelled or resolved."""
    for a in forms(inner):
        for b in forms(outer):
            if a == b or b in a.parents:
                return True
    return False
