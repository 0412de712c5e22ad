"""TensorStore settings that not every TensorStore release has, asked for where it has them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorstore as ts


def context_with_mapped_reads(spec: Mapping[str, Any]) -> ts.Context:
    """`ts.Context(spec)` that reads local files through mmap (`file_io_mode: memmap`) where TensorStore can.

    A TensorStore without the setting gets `spec` as it is: plain reads.
    Writes are the same in both modes.
    """
    try:
        return ts.Context({**spec, "file_io_mode": {"mode": "memmap"}})
    except ValueError:
        return ts.Context(dict(spec))
