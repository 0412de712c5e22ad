"""Sizes and counts: parsed from what users type, formatted for tables.

Formatting uses binary units (sizes on disk and in memory); parsing follows
HF's convention (`5GB` is 10**9-based, `512MiB` binary).
"""

from __future__ import annotations

import re

from maxckpt.errors import ConversionError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(size: int | str) -> int:
    """`"5GB"` -> 5_000_000_000, `"512MiB"` -> 536_870_912, ints pass through (HF's convention)."""
    if isinstance(size, int):
        return size
    match = _SIZE_RE.match(str(size))
    if not match or match.group(2) is not None and match.group(2).upper() not in _SIZE_UNITS:
        raise ConversionError(f"cannot read size {size!r}; write it like 5GB, 500MB or 512MiB")
    return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()])


def human_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`.

    >>> human_bytes(0), human_bytes(1536), human_bytes(3 * 2**30)
    ('0 B', '1.5 KiB', '3.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int) -> str:
    """`1_234_567` -> `'1.23M'` (parameter counts).

    >>> human_count(999), human_count(181_504), human_count(8_030_261_248)
    ('999', '181.5K', '8.03B')
    """
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            digits = 1 if unit == "K" else 2
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def check_tolerance(name: str, value: float) -> float:
    """A comparison tolerance (`atol`, `rtol`): a finite number >= 0, else a ConfigError.

    NaN would make every comparison pass silently (`diff <= nan` is False,
    `not diff > nan` is True), and a negative tolerance fails identical tensors.
    """
    import math

    from maxckpt.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)
