"""Checkpoints for the explore, demo and notebook tests: one tiny model in every format, and small runs.

`model_in_every_format` saves a tiny random llama3.1 model the way MaxText
does (through Orbax's own CheckpointManager, tests/conversion_models.py) and
converts it with maxckpt to HF, Megatron, TorchTitan and plain torch.
`demo_model_run` saves a few steps of the demo's model through maxckpt's
CheckpointManager: a small run for the notebooks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.conversion.options import SourceOptions

FAMILY = "llama3.1"
TOKEN_IDS = {"bos_token_id": 0, "eos_token_id": 1}  # inside the tiny vocabulary
TARGETS = {"hf": "hf", "megatron": "megatron", "torchtitan": "torchtitan", "torch": "torch"}


def model_in_every_format(root: Path) -> dict[str, Path]:
    """{"maxtext": run/checkpoints, "hf": ..., "megatron": ..., "torchtitan": ..., "torch": ...} of one tiny model."""
    import maxckpt

    spec = tiny_spec(FAMILY)
    params = random_maxtext_params(spec, seed=3)
    checkpoints = save_maxtext_run(root / "run", params, step=4)
    out = {"maxtext": checkpoints}
    for fmt in TARGETS:
        dst = root / fmt
        maxckpt.convert(checkpoints, dst, to=fmt, model=FAMILY, source=SourceOptions(overrides=TOKEN_IDS))
        out[fmt] = dst
    return out


_SHARED: dict[str, dict[str, Path]] = {}


def shared_formats(tmp_path_factory) -> dict[str, Path]:
    """:func:`model_in_every_format`, built once per test session (read-only for the tests that use it)."""
    if "formats" not in _SHARED:
        _SHARED["formats"] = model_in_every_format(tmp_path_factory.mktemp("formats"))
    return _SHARED["formats"]


def expected_parameters(spec) -> int:
    """Parameter count of a Llama-family model from its dimensions (untied, no q/k norms)."""
    e, h, g, d, f, v, n = spec.emb_dim, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.mlp_dim, spec.vocab_size, spec.num_layers
    per_layer = e * h * d * 2 + e * g * d * 2 + 3 * e * f + 2 * e
    return n * per_layer + 2 * v * e + e


def demo_model_run(root: Path, steps: tuple[int, ...] = (0, 1, 2, 3)) -> Path:
    """A run dir (`root/checkpoints/<step>`) of the demo's model, its weights nudged differently at each step."""
    import jax

    from maxckpt import CheckpointManager
    from maxckpt.demo import model

    spec = model.demo_spec()
    state = model.init_state(spec, seed=0)
    with CheckpointManager(root / "checkpoints", period=1, async_save=False) as mgr:
        for step in steps:
            rng = np.random.default_rng(step)
            params = jax.tree_util.tree_map(lambda x: x * np.float32(1 + 0.05 * step) + np.float32(rng.normal(0, 0.01)), state["params"])
            mgr.save(step, {**state, "params": params, "step": np.int32(step + 1)})
    return root
