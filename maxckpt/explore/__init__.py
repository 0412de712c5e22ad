"""Looking inside checkpoints: step tables, tensor trees, statistics, diffs, per-layer views.

Everything returns plain dataclasses (with `to_dict()` for JSON and
`table()` for a rich table), so the CLI (`maxckpt ls / inspect / diff`) and
notebooks render the same data.

>>> from maxckpt.explore import list_steps, inspect_checkpoint, diff_checkpoints   # doctest: +SKIP
>>> list_steps("runs/llama", keep=3).delete_next                                   # doctest: +SKIP
>>> inspect_checkpoint("runs/llama/checkpoints").totals().parameters               # doctest: +SKIP
>>> diff_checkpoints("runs/llama/checkpoints/100", "llama-hf", model="llama3.1").summary()  # doctest: +SKIP
"""

from __future__ import annotations

from maxckpt.lazy import lazy_attributes

# name -> module. Loaded on first use, so `maxckpt ls` (steps only) does not import the
# conversion stack that inspect and diff need.
_LAZY: dict[str, str] = {
    "DiffReport": "maxckpt.explore.diff",
    "TensorChange": "maxckpt.explore.diff",
    "diff_checkpoints": "maxckpt.explore.diff",
    "LayerBytes": "maxckpt.explore.layers",
    "LayerNorm": "maxckpt.explore.layers",
    "layer_bytes": "maxckpt.explore.layers",
    "layer_norms": "maxckpt.explore.layers",
    "TensorStats": "maxckpt.explore.stats",
    "array_stats": "maxckpt.explore.stats",
    "StepRow": "maxckpt.explore.steps",
    "StepTable": "maxckpt.explore.steps",
    "list_steps": "maxckpt.explore.steps",
    "resolve_run_dir": "maxckpt.explore.steps",
    "Subtree": "maxckpt.explore.tree",
    "TensorEntry": "maxckpt.explore.tree",
    "TensorTree": "maxckpt.explore.tree",
    "Totals": "maxckpt.explore.tree",
    "inspect_checkpoint": "maxckpt.explore.tree",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = sorted(_LAZY)
