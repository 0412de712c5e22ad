"""Where each decoder layer's parameters live in a MaxText tree, scanned or not, per family.

MaxText groups layers differently per decoder block, and differently again
with `scan_layers=true` (one stacked array per leaf, layer axis at position 1)
and `scan_layers=false` (one subtree per layer):

| family | scanned | unscanned |
|---|---|---|
| mixtral, qwen3-moe | `decoder/layers/...` | `decoder/layers_{i}/...` |
| gemma2 | `decoder/layers/..._{local,global}`: one MaxText layer is a (sliding, full) pair of HF layers | \
`decoder/layers_{i}/..._{local,global}` |
| gemma3 | `decoder/layers/layers_{j}/...`, j < 6, stacked over blocks of 6, plus \
`decoder/layers_remainder/layers_{r}/...` | `decoder/layers_{i}/...` |
| gpt-oss | `decoder/layers/layers_{j}/...`, j < 2 (sliding, full), stacked over pairs | `decoder/layers_{i}/...` |
| deepseek3 | `decoder/dense_layers/...` then `decoder/moe_layers/...` | `decoder/dense_layers_{i}/...`, \
`decoder/moe_layers_{i}/...` (i restarts at 0) |

Non-parameter state MaxText keeps under `nnx_aux/model/<same path>` (the
deepseek routing bias, an NNX `MoEBiasVar`) is stacked with the layer axis
*first*; :meth:`LayerRef.params` slices it accordingly. Its RNG state is skipped.

A :class:`LayerRef` names one HF-numbered layer; :func:`layer_groups` lists them in order,
by the family record's stacking style (`Family.maxtext_scan`: "layers", "pairs", "blocks", "dense_moe").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError
from maxckpt.families import Family

AUX_PREFIX = "nnx_aux/model/"


@dataclass(frozen=True)
class LayerRef:
    """One decoder layer, numbered as HF numbers it, and where its parameters are."""

    #: HF layer index.
    index: int
    #: Subtree holding the layer ("decoder/layers/", "decoder/moe_layers_1/", ...).
    prefix: str
    #: Position on the stacked axis, or None for an unscanned subtree.
    stacked_at: int | None
    #: gemma2 only: "local" or "global", the half of the pair subtree this layer is.
    half: str | None = None
    #: deepseek3: the layer is an MoE layer.
    moe: bool = False

    def params(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The layer's parameters by their path inside the layer, without the layer axis.

        gemma2's `*_local` / `*_global` names lose their suffix, so both
        halves read like one gemma3 layer (`self_attention/query/kernel`, ...).
        """
        out: dict[str, np.ndarray] = {}
        for root, axis in ((self.prefix, 1), (AUX_PREFIX + self.prefix, 0)):
            for name, array in params.items():
                if not name.startswith(root):
                    continue
                sub = name[len(root):]
                if root.startswith(AUX_PREFIX) and ("rngs/" in sub or sub.startswith("rngs")):
                    continue
                if self.half is not None:
                    head, _, rest = sub.partition("/")
                    if not head.endswith("_" + self.half):
                        continue
                    sub = head[: -len(self.half) - 1] + "/" + rest
                out[sub] = np.take(array, self.stacked_at, axis=axis) if self.stacked_at is not None else array
        if not out:
            raise CorruptCheckpointError(f"no parameters under {self.prefix} for layer {self.index}")
        return out


def _stack_length(params: Mapping[str, np.ndarray], prefix: str) -> int:
    for name, array in params.items():
        if name.startswith(prefix):
            shape = np.shape(array)
            if len(shape) < 2:
                raise CorruptCheckpointError(f"{name}: stacked leaf of shape {shape} has no layer axis at position 1")
            return int(shape[1])
    return 0


def _indices(params: Mapping[str, np.ndarray], pattern: str) -> list[int]:
    regex = re.compile(pattern)
    found = {int(m.group(1)) for n in params if (m := regex.match(n))}
    if found and found != set(range(len(found))):
        raise CorruptCheckpointError(
            f"layer subtrees matching {pattern} are not numbered 0..{len(found) - 1}: {sorted(found)}"
        )
    return sorted(found)


def layer_groups(family: Family, params: Mapping[str, np.ndarray]) -> list[LayerRef]:
    """Every decoder layer of a `family` model in HF order, found by the family's `maxtext_scan` style.

    >>> [r.half for r in layer_groups(FAMILIES["gemma2"], gemma2_params)][:2]   # doctest: +SKIP
    ['local', 'global']
    """
    scan = family.maxtext_scan
    names = list(params)
    scanned = any(
        n.startswith(("decoder/layers/", "decoder/dense_layers/", "decoder/moe_layers/", "decoder/layers_remainder/"))
        for n in names
    )
    refs: list[LayerRef] = []
    if scan == "dense_moe":
        for group, moe in (("dense_layers", False), ("moe_layers", True)):
            if scanned:
                prefix = f"decoder/{group}/"
                for i in range(_stack_length(params, prefix)):
                    refs.append(LayerRef(len(refs), prefix, i, moe=moe))
            else:
                for i in _indices(params, rf"^decoder/{group}_(\d+)/"):
                    refs.append(LayerRef(len(refs), f"decoder/{group}_{i}/", None, moe=moe))
    elif scan in ("blocks", "cycle") and scanned:  # cycle (llama4): layers_{j} with no remainder
        pattern = _indices(params, r"^decoder/layers/layers_(\d+)/")
        blocks = _stack_length(params, "decoder/layers/layers_0/")
        for b in range(blocks):
            for j in pattern:
                refs.append(LayerRef(len(refs), f"decoder/layers/layers_{j}/", b))
        for r in _indices(params, r"^decoder/layers_remainder/layers_(\d+)/"):
            refs.append(LayerRef(len(refs), f"decoder/layers_remainder/layers_{r}/", None))
    else:
        if scanned:
            slots = [("decoder/layers/", i) for i in range(_stack_length(params, "decoder/layers/"))]
        else:
            slots = [(f"decoder/layers_{i}/", None) for i in _indices(params, r"^decoder/layers_(\d+)/")]
        for prefix, at in slots:
            if scan == "pairs":
                refs.append(LayerRef(len(refs), prefix, at, half="local"))
                refs.append(LayerRef(len(refs), prefix, at, half="global"))
            else:
                refs.append(LayerRef(len(refs), prefix, at))
    if not refs:
        raise CorruptCheckpointError(
            f"no decoder layers found for a {family.name} model (expected decoder/layers... subtrees)"
        )
    return refs


__all__ = ["AUX_PREFIX", "LayerRef", "layer_groups"]
