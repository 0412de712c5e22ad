"""Test helpers for the Orbax <-> HF bridge: tiny random MaxText models, saved the way MaxText saves them.

`save_maxtext_run` writes through Orbax's own `CheckpointManager` with an
`items` item holding `{"params": {"params": ...}}` (zarr3 + OCDBT, as MaxText
does), so the tests read checkpoints no maxckpt code wrote.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import ml_dtypes
import numpy as np

from maxckpt.conversion.spec import family_defaults
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.formats.maxtext.layout import as_tree
from maxckpt.formats.maxtext.params import global_params, layer_params

TOKENS = [[1, 5, 9, 13, 17, 21, 25, 29]]
FAMILY_NAMES = ("llama2", "llama3", "llama3.1", "mistral", "qwen3")


def tiny_spec(family: str = "llama2", *, tied: bool | None = None, layers: int = 2, head_dim: int = 16, vocab: int = 128) -> ModelSpec:
    """Tiny dimensions; head_dim 16 makes MaxText's query scaling (x4) exact in every dtype."""
    fam = FAMILIES[family]
    values = family_defaults(fam)
    values["tie_word_embeddings"] = (family == "qwen3") if tied is None else tied
    values["max_position_embeddings"] = max(values["max_position_embeddings"], 64)
    return ModelSpec(
        family=family,
        num_layers=layers,
        emb_dim=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=head_dim,
        mlp_dim=64,
        vocab_size=vocab,
        **values,
    )


def random_maxtext_params(spec: ModelSpec, *, scanned: bool = True, dtype=np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical MaxText path -> random array (norm scales near 1, kernels ~ 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    from maxckpt.layouts.dims import shape_of

    def sample(param, shape):
        if not param.form.in_dims:  # norms and the embedding
            base = 1.0 if param.key.endswith("scale") else 0.0
            return base + 0.5 * rng.standard_normal(shape)
        fan_in = math.prod(shape_of(param.form.in_dims, spec))
        return rng.standard_normal(shape) / math.sqrt(fan_in)

    out: dict[str, np.ndarray] = {}
    for p in global_params(spec):
        out[p.key] = sample(p, p.framework_shape(spec)).astype(dtype)
    for p in layer_params(spec, moe=False):
        shape = p.framework_shape(spec)
        if scanned:
            stacked = np.stack([sample(p, shape) for _ in range(spec.num_layers)], axis=1)
            out[f"decoder/layers/{p.key}"] = stacked.astype(dtype)
        else:
            for i in range(spec.num_layers):
                out[f"decoder/layers_{i}/{p.key}"] = sample(p, shape).astype(dtype)
    return out


def nest(flat: Mapping[str, np.ndarray]) -> dict:
    return as_tree(flat)


def save_maxtext_run(run_dir: Path, params: Mapping[str, np.ndarray], *, step: int = 0, scan_layers: bool = True) -> Path:
    """Save `params` as MaxText does: `<run_dir>/checkpoints/<step>/items` with params/params and a step."""
    import orbax.checkpoint as ocp

    checkpoints = Path(run_dir) / "checkpoints"
    manager = ocp.CheckpointManager(
        checkpoints,
        item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
    )
    state = {"params": {"params": nest(params)}, "step": np.int32(step + 1)}
    manager.save(step, args=ocp.args.Composite(items=ocp.args.PyTreeSave(state)), custom_metadata={"scan_layers": scan_layers})
    manager.wait_until_finished()
    manager.close()
    return checkpoints


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(ml_dtypes.bfloat16)
