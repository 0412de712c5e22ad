"""Where each format's conversion output keeps its integrity manifest (maxckpt-manifest.json)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def manifest_dir(tmp: str | os.PathLike, target: str, options: Any) -> Path | None:
    """Where a conversion output written at `tmp` keeps its manifest (None: a single torch file, see sidecar)."""
    from maxckpt.storage.urls import as_path

    tmp = as_path(tmp)  # a local path, or an epath of a gs:// or s3:// URL
    if target == "maxtext":
        return tmp / "0"  # type: ignore[operator]
    if target == "megatron":
        from maxckpt.formats.megatron.files import iteration_dir_name

        return tmp / iteration_dir_name(options.recorded_step)  # type: ignore[operator]
    if target == "torchtitan":
        from maxckpt.formats.torchtitan.files import step_dir_name

        return tmp / step_dir_name(options.recorded_step or 0)  # type: ignore[operator]
    if target == "torch" and options.torch_single_file:
        return None
    return tmp  # type: ignore[return-value]
