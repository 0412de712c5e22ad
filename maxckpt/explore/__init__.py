"""Looking inside checkpoints: step tables, tensor trees, statistics, diffs, per-layer views.

Everything returns plain dataclasses (with `to_dict()` for JSON and
`table()` for a rich table), so the CLI (`maxckpt ls / inspect / diff`) and
notebooks render the same data.

>>> from maxckpt.explore import list_steps, inspect_checkpoint, diff_checkpoints   # doctest: +SKIP
>>> list_steps("runs/llama", keep=3).delete_next                                   # doctest: +SKIP
>>> inspect_checkpoint("runs/llama/checkpoints").totals().parameters               # doctest: +SKIP
>>> diff_checkpoints("runs/llama/checkpoints/100", "llama-hf", model="llama3.1").summary()  # doctest: +SKIP
"""

from maxckpt.explore.diff import DiffReport, TensorChange, diff_checkpoints
from maxckpt.explore.layers import LayerBytes, LayerNorm, layer_bytes, layer_norms
from maxckpt.explore.stats import TensorStats, array_stats
from maxckpt.explore.steps import StepRow, StepTable, list_steps, resolve_run_dir
from maxckpt.explore.tree import Subtree, TensorEntry, TensorTree, Totals, inspect_checkpoint

__all__ = [
    "DiffReport",
    "LayerBytes",
    "LayerNorm",
    "StepRow",
    "StepTable",
    "Subtree",
    "TensorChange",
    "TensorEntry",
    "TensorStats",
    "TensorTree",
    "Totals",
    "array_stats",
    "diff_checkpoints",
    "inspect_checkpoint",
    "layer_bytes",
    "layer_norms",
    "list_steps",
    "resolve_run_dir",
]
