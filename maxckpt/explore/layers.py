"""Per-layer views of a model checkpoint, for plots: bytes per layer, weight norms across steps.

Both go through the checkpoint's layout into HF names (`model.layers.{i}.*`),
so they work the same on a MaxText step, its HF export or a Megatron or
TorchTitan copy. `layer_bytes` reads metadata only; `layer_norms` reads each
tensor once per step.

>>> rows = layer_norms("maxckpt_demo/demo_run", model="llama3.1")      # doctest: +SKIP
>>> {(r.step, r.layer, r.part): round(r.norm, 2) for r in rows}        # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from maxckpt.conversion.checkpoint import open_checkpoint
from maxckpt.explore.steps import resolve_run_dir

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_GLOBAL = {"model.embed_tokens.weight": "embedding", "model.norm.weight": "final norm", "lm_head.weight": "lm_head"}


def layer_part(hf_name: str) -> tuple[int | None, str]:
    """(layer index or None, part) of an HF tensor name; parts are attention, mlp, norms, or the global ones.

    >>> layer_part("model.layers.3.self_attn.q_proj.weight"), layer_part("lm_head.weight")
    ((3, 'attention'), (None, 'lm_head'))
    """
    m = _LAYER.match(hf_name)
    if m is None:
        return None, _GLOBAL.get(hf_name, hf_name)
    rest = m.group(2)
    part = (
        "attention"
        if rest.startswith("self_attn.") and "norm" not in rest
        else "mlp"
        if rest.startswith("mlp.")
        else "norms"
    )
    return int(m.group(1)), part


@dataclass(frozen=True)
class LayerBytes:
    """Bytes and parameters of one decoder layer (`layer` set) or one global tensor (`layer` None)."""

    label: str
    layer: int | None
    parameters: int
    bytes: int


def layer_bytes(path: str | os.PathLike, *, model: str | None = None, step: int | None = None) -> list[LayerBytes]:
    """Bytes per decoder layer (in stored dtype, HF view), plus embedding, final norm and lm_head; metadata only."""
    with open_checkpoint(path, model=model, step=step) as ckpt:
        tensors = ckpt.hf_tensors()
        per: dict[tuple[int | None, str], list[int]] = {}
        for name, t in tensors.items():
            layer, part = layer_part(name)
            key = (layer, f"layer {layer}" if layer is not None else part)
            acc = per.setdefault(key, [0, 0])
            acc[0] += math.prod(t.shape)
            acc[1] += t.nbytes
    order = sorted(per, key=lambda k: (k[0] is not None, -1 if k[0] is None else k[0], k[1] != "embedding", k[1]))
    return [LayerBytes(label, layer, per[(layer, label)][0], per[(layer, label)][1]) for layer, label in order]


@dataclass(frozen=True)
class LayerNorm:
    """L2 norm of one part (attention, mlp, norms) of one decoder layer at one step."""

    step: int
    layer: int
    part: str
    norm: float


def _norms(path: str | os.PathLike, model: str | None) -> dict[tuple[int, str], float]:
    sq: dict[tuple[int, str], float] = {}
    with open_checkpoint(path, model=model) as ckpt:
        for name, t in ckpt.hf_tensors().items():
            layer, part = layer_part(name)
            if layer is None:
                continue
            x = np.asarray(t.read(), np.float64)
            sq[(layer, part)] = sq.get((layer, part), 0.0) + float(np.sum(x * x))
    return {k: math.sqrt(v) for k, v in sq.items()}


def layer_norms(
    run_dir: str | os.PathLike, *, steps: Iterable[int] | None = None, model: str | None = None
) -> list[LayerNorm]:
    """Per-layer weight norms at each committed step of a run (all, or `steps`), oldest step first."""
    run = resolve_run_dir(run_dir)
    wanted = None if steps is None else set(steps)
    rows = []
    for entry in run.committed:
        if wanted is not None and entry.step not in wanted:
            continue
        for (layer, part), norm in sorted(_norms(os.fspath(entry.path), model).items()):
            rows.append(LayerNorm(entry.step, layer, part, norm))
    return rows
