"""What a MaxText target can be asked for: the layer layout and the chunk compression."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from maxckpt.formats.fields import Knobs, knob


@dataclass(frozen=True, kw_only=True)
class MaxTextOptions(Knobs):
    """The knobs of a MaxText output (`convert(..., to="maxtext", options=MaxTextOptions(compression="zstd"))`)."""

    scan_layers: bool | None = knob(
        None, "--scan-layers/--no-scan-layers", type=Optional[bool],
        help="MaxText output: layers stacked on axis 1 (default) or layers_{i}.",
    )
    """Layers stacked on axis 1 (True, MaxText's scan) or one `layers_{i}` tree each (False); None: stacked."""

    compression: str = knob(
        "none", "--compression", type=str, choices=("none", "zstd"),
        help="MaxText output: none (fastest; MaxText and Orbax restore it) or zstd (as MaxText writes: typically 8-20% "
             "smaller, 1-3 s more CPU per GB).",
    )
    """Chunk compression: "none" or "zstd" (as MaxText writes; see containers.orbax.OrbaxWriter)."""
