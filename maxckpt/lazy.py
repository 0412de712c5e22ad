"""Lazy package attributes: `import maxckpt` stays light (no JAX, torch or transformers until a name is used)."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable, Mapping


def lazy_attributes(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `table[name]` (a module path) on first use of `name`."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module), name)

    return __getattr__
