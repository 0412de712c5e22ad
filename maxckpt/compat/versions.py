"""The one version gate: the releases of each dependency that maxckpt's patches of it were written for.

Why one: a patch that silently keeps running against a release it was never
read against is how a dependency upgrade turns into a wrong result. Every
patch in :mod:`maxckpt.compat` asks :func:`written_for` before it touches its
dependency; the answer is computed once per package, and a release outside
the range is logged once (``maxckpt.compat``), naming what maxckpt does then.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re

logger = logging.getLogger("maxckpt.compat")

# package -> (lowest release, first release not covered; None: no upper bound). The same ranges as pyproject.toml.
WRITTEN_FOR: dict[str, tuple[str, str | None]] = {
    "orbax-checkpoint": ("0.12", "0.13"),  # dependencies: orbax-checkpoint>=0.12,<0.13
    "maxtext": ("0.2.5", "0.2.6"),  # the maxtext extra: maxtext==0.2.5
    "jax": ("0.6", None),  # dependencies: jax>=0.6
}


def installed_version(package: str) -> str | None:
    """The installed release of `package` (a distribution name, e.g. ``orbax-checkpoint``); None when absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"0.12.8.dev1"`` -> ``(0, 12, 8)``."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def in_range(version: str, lowest: str, below: str | None) -> bool:
    """Whether `version` lies in ``[lowest, below)`` (`below` None: no upper bound).

    >>> in_range("0.12.8", "0.12", "0.13"), in_range("0.13.0", "0.12", "0.13")
    (True, False)
    """
    release = _release(version)
    return release >= _release(lowest) and (below is None or release < _release(below))


@functools.cache
def written_for(package: str) -> bool:
    """Whether the installed `package` is a release maxckpt's patches of it were written for (computed once).

    Outside the range (or not installed as a distribution) it logs one warning
    and answers False; each patch then does what the table in :mod:`maxckpt.compat`
    says: an optimisation stands aside, a patch a feature needs still checks the
    code it relies on and fails loudly if that changed.
    """
    lowest, below = WRITTEN_FOR[package]
    version = installed_version(package)
    if version is not None and in_range(version, lowest, below):
        return True
    wanted = f">={lowest}" + (f",<{below}" if below else "")
    logger.warning(
        "maxckpt: its patches of %s were written for %s%s and this is %s; see maxckpt.compat for what that changes",
        package, package, wanted, version or "not an installed distribution",
    )
    return False
