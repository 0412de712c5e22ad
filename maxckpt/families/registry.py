"""The family registry: every module of :mod:`maxckpt.families` that defines ``FAMILY``, and lookups over them.

A family is found by walking the package's folders (``maxckpt.families.__path__``), so a file dropped
into the folder, or a folder appended to ``__path__``, registers one; :func:`discover` walks them again.
The order is stable: the families maxckpt shipped first in their historical order, then the rest by name.

>>> resolve_model("llama3.1-8b").name
'llama3.1'
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from typing import Any, Iterable

from maxckpt.errors import UnsupportedModelError
from maxckpt.families.base import Family

# Modules of the package that hold machinery, not a family.
_MACHINERY = frozenset({"base", "registry"})
# The order `--model`'s help, `convert --help` and the registry have listed families in since they landed.
_FIRST = ("llama2", "llama3", "llama3.1", "mistral", "qwen3", "mixtral", "qwen3-moe", "deepseek3", "gpt-oss",
          "gemma2", "gemma3")

# Family name -> record, and MaxText model names -> family name, in registry order. Filled (in place, so
# every importer sees a re-discovery) by discover().
FAMILIES: dict[str, Family] = {}
MAXTEXT_MODELS: dict[str, str] = {}


def discover() -> dict[str, Family]:
    """Import every family module on ``maxckpt.families.__path__`` and refill FAMILIES and MAXTEXT_MODELS.

    Why in place: the layouts hold FAMILIES by reference, so a family added later (a new file, a folder
    appended to ``__path__``) is seen by all of them.
    """
    import maxckpt.families as package

    found: dict[str, Family] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in _MACHINERY or info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise UnsupportedModelError(
                f"{module.__file__}: a module of maxckpt.families must define FAMILY = Family(...); "
                "add one, or move the module out of the package"
            )
        if family.name in found:
            raise UnsupportedModelError(f"{module.__file__}: family {family.name!r} is defined twice")
        found[family.name] = family
    ordered = [found[n] for n in _FIRST if n in found] + sorted(
        (f for n, f in found.items() if n not in _FIRST), key=lambda f: f.name)
    FAMILIES.clear()
    FAMILIES.update((f.name, f) for f in ordered)
    MAXTEXT_MODELS.clear()
    MAXTEXT_MODELS.update((model, f.name) for f in ordered for model in f.maxtext_models)
    return FAMILIES


def same_modules(a: Family, b: Family) -> bool:
    """Whether two families' MaxText trees name the same modules (deepseek2, deepseek3, deepseek3.2, kimi-k2),
    so that tensor names tell them apart only by a family's `tree_markers`."""
    def modules(f: Family) -> tuple:
        return (f.maxtext_scan, f.maxtext_moe, f.maxtext_attention, f.attention, f.maxtext_decoder_block)
    return modules(a) == modules(b)


def refine_tree_family(found: str, names: Iterable[str]) -> str:
    """The family tensor names say, given the one the format's own rules read them as (`found`): the first
    family with the same modules whose `tree_markers` match a name, else `found`."""
    names = list(names)
    for family in FAMILIES.values():
        if family.tree_markers and same_modules(family, FAMILIES[found]) and any(
                re.search(m, n) for m in family.tree_markers for n in names):
            return family.name
    return found


def bridge_gap(fmt: str, family: str) -> str | None:
    """Why `family` cannot be converted to or from format `fmt`, or None when it can."""
    record = FAMILIES[family]
    if fmt in record.bridges:
        return None
    return record.bridge_gaps.get(fmt, f"maxckpt has no {fmt} mapping for {family}")


def require_bridge(fmt: str, family: str, direction: str) -> None:
    """Raise UnsupportedModelError, with the registry's reason, when `family` cannot go `direction` ("to" or
    "from") format `fmt`: said before any of its tensors is mapped, so no layout's own refusal comes first."""
    gap = bridge_gap(fmt, family)
    if gap is not None:
        raise UnsupportedModelError(f"{family} cannot be converted {direction} {fmt}: {gap}")


def known_models() -> list[str]:
    """Every name `--model` accepts: family names and MaxText model names."""
    return sorted(FAMILIES) + sorted(MAXTEXT_MODELS)


def model_help() -> str:
    """The `--model` help text, from the registry: every family and every MaxText model name.

    >>> "llama3.1-8b" in model_help() and "gpt-oss" in model_help()
    True
    """
    families = ", ".join(FAMILIES)
    models = ", ".join(MAXTEXT_MODELS)
    return (
        f"Model family ({families}) or MaxText model name ({models}). Decides what shapes cannot tell "
        "(rotary layout, routing top-k, softcaps, windows): pass it for MaxText sources."
    )


def impossible_pairs_text() -> str:
    """The "pairs that are not possible" paragraph of `convert --help`, from each family's bridges.

    One line per format some family cannot reach, naming those families and why;
    the heading names the formats every family converts between.

    >>> print(impossible_pairs_text().splitlines()[0])
    Pairs that are not possible (every family converts between maxtext, hf and torch):
    """
    formats = list(dict.fromkeys(fmt for f in FAMILIES.values() for fmt in f.bridges))
    everywhere = [fmt for fmt in formats if all(fmt in f.bridges for f in FAMILIES.values())]
    lines = [f"Pairs that are not possible (every family converts between {_listed(everywhere)}):"]
    for fmt in formats:
        reasons: dict[str, list[str]] = {}
        for family in FAMILIES.values():
            gap = bridge_gap(fmt, family.name)
            if gap is not None:
                reasons.setdefault(gap, []).append(family.name)
        for reason, names in reasons.items():
            lines.append(f"{fmt}: {', '.join(names)} ({reason}).")
    return "\n\n".join(lines)


def family_table() -> str:
    """README's family table (Markdown), from the registry: each family, its MaxText model names, the formats
    it converts between, and the formats it cannot reach with the reason.

    >>> family_table().splitlines()[0]
    '| family | HF model type | MaxText model names | converts between | not possible, and why |'
    """
    rows = ["| family | HF model type | MaxText model names | converts between | not possible, and why |",
            "|---|---|---|---|---|"]
    formats = list(dict.fromkeys(fmt for f in FAMILIES.values() for fmt in f.bridges))
    for family in FAMILIES.values():
        gaps = [f"{fmt}: {bridge_gap(fmt, family.name)}" for fmt in formats if fmt not in family.bridges]
        models = ", ".join(f"`{m}`" for m in family.maxtext_models) or "-"
        rows.append(f"| {family.name} | `{family.hf_model_type}` | {models} | {', '.join(family.bridges)} | "
                    f"{'; '.join(gaps) or '-'} |")
    return "\n".join(rows)


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def model_settings(name: str | None) -> dict[str, Any]:
    """The ModelSpec settings a MaxText model name adds to its family's (e.g. gemma2-27b's query scalar)."""
    if not name:
        return {}
    key = name.strip().lower()
    if key in MAXTEXT_MODELS:
        return dict(FAMILIES[MAXTEXT_MODELS[key]].model_settings.get(key, {}))
    return {}


def resolve_model(name: str) -> Family:
    """The family for a family name (`llama3.1`) or a MaxText model name (`llama3.1-8b`)."""
    key = name.strip().lower()
    if key in FAMILIES:
        return FAMILIES[key]
    if key in MAXTEXT_MODELS:
        return FAMILIES[MAXTEXT_MODELS[key]]
    close = difflib.get_close_matches(key, known_models(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UnsupportedModelError(
        f"unknown model {name!r}.{hint} Supported families: {', '.join(sorted(FAMILIES))}; "
        f"MaxText model names: {', '.join(sorted(MAXTEXT_MODELS))}."
    )
