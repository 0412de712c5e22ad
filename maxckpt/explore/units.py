"""Human-readable sizes and counts for tables (binary units: sizes on disk and in memory)."""

from __future__ import annotations


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
