"""Replace one attribute of a dependency's module for as long as any caller needs it.

Why shared: restores may run in several threads at once (the two tiers, a
user's own threads), and each enters and leaves on its own. Only the last one
out may put the original back, or a restore still running would lose the
replacement halfway (or keep it forever, if the first one out restored what
the second had saved).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

from maxckpt.compat.versions import written_for


class SharedPatch:
    """`module.<name> = replacement` while at least one caller is inside :meth:`applied`."""

    def __init__(self, name: str, replacement: Any) -> None:
        self.name = name
        self.replacement = replacement
        self.original: Any = None  # what module.<name> was; kept once known (a replacement may call it late)
        self._lock = threading.Lock()
        self._users = 0
        self._module: Any = None

    @contextlib.contextmanager
    def applied(self, module: Any) -> Iterator[bool]:
        """Within this block `module.<name>` is the replacement; yields False (and changes nothing) for module None."""
        if module is None:  # the attribute is missing, or not what the replacement was written for
            yield False
            return
        with self._lock:
            if self._users == 0:
                self._module, self.original = module, getattr(module, self.name)
                setattr(module, self.name, self.replacement)
            self._users += 1
        try:
            yield True
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    setattr(self._module, self.name, self.original)
                    self._module = None


def orbax_module_with(module: str, name: str, parameters: list[str], *, coroutine: bool = False) -> Any:
    """Orbax's `module` if its function `name` takes exactly `parameters` (async if `coroutine`), else None.

    None too for another Orbax release than the patches were written for: the caller then patches nothing.
    """
    if not written_for("orbax-checkpoint"):
        return None
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    fn = getattr(found, name, None)
    if fn is None or (coroutine and not inspect.iscoroutinefunction(fn)):
        return None
    return found if list(inspect.signature(fn).parameters) == parameters else None
