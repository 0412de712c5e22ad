"""HF MoE checkpoints saved with transformers 5's fused expert tensors, read as the per-expert ones.

transformers 5 holds a Qwen-style MoE layer's experts as `mlp.experts.gate_up_proj [X, 2M, E]` (each
expert's gate rows, then its up rows) and `mlp.experts.down_proj [X, E, M]`; checkpoints are saved either
way (the hub's Qwen3.5 MoE ones fused). maxckpt's HF hub form is per-expert (`mlp.experts.{e}.gate_proj`,
...): a fused checkpoint of a per-expert family is read through per-expert views, one slice each, no copy.

>>> import numpy as np
>>> gu = LazyTensor.from_array("model.layers.0.mlp.experts.gate_up_proj", np.arange(2 * 4 * 3).reshape(2, 4, 3))
>>> views = per_expert_views({gu.name: gu}, "mlp", ("gate_proj", "up_proj", "down_proj"))
>>> views["model.layers.0.mlp.experts.1.up_proj.weight"].read().tolist()
[[18, 19, 20], [21, 22, 23]]
"""

from __future__ import annotations

import re
from typing import Mapping

from maxckpt.tensors import LazyTensor

_FUSED_RE = re.compile(r"^(model\.layers\.\d+\.)(.+)\.experts\.(gate_up_proj|down_proj)$")


def has_fused_experts(names, block: str) -> bool:
    """Whether these HF names hold transformers 5's fused expert tensors under `block` (3D, not gpt-oss's)."""
    return any((m := _FUSED_RE.match(n)) and m.group(2) == block for n in names)


def per_expert_views(tensors: Mapping[str, LazyTensor], block: str,
                     projections: tuple[str, str, str]) -> dict[str, LazyTensor]:
    """`tensors` with each fused `{block}.experts.gate_up_proj` / `down_proj` replaced by per-expert views."""
    out: dict[str, LazyTensor] = {}
    gate, up, down = projections
    for name, t in tensors.items():
        m = _FUSED_RE.match(name)
        if not m or m.group(2) != block or len(t.shape) != 3:
            out[name] = t
            continue
        layer, kind = m.group(1), m.group(3)
        experts = t.shape[0]
        if kind == "gate_up_proj":
            width = t.shape[1] // 2
            for e in range(experts):
                for proj, rows in ((gate, slice(0, width)), (up, slice(width, 2 * width))):
                    key = f"{layer}{block}.experts.{e}.{proj}.weight"
                    out[key] = _view(t, e, rows, key)
        else:
            for e in range(experts):
                key = f"{layer}{block}.experts.{e}.{down}.weight"
                out[key] = _view(t, e, slice(None), key)
    return out


def _view(t: LazyTensor, e: int, rows: slice, name: str) -> LazyTensor:
    shape = (len(range(*rows.indices(t.shape[1]))), t.shape[2])

    def fn(index):
        whole = t.read((e, rows))
        return whole if index is None else whole[index]

    return LazyTensor(name, shape, t.dtype, fn)
