"""The demo's model: a tiny Llama-family decoder in MaxText's parameter layout, trained with optax.

The forward pass is maxckpt's JAX reference of MaxText's decoder
(:mod:`maxckpt.reference.forward`: RMSNorm, rotary as MaxText applies it per
family, GQA, SwiGLU) with the layers taken from the scanned tensors inside
`jit`, so the model the demo trains is exactly the model `maxckpt verify
--logits` later runs, and the parameter tree is MaxText's (`params/params/
decoder/layers/...`, layers stacked on axis 1), shaped by the same table the
MaxText layout converts with.

The data are synthetic and learnable: each sequence follows a fixed random
successor table with 10% noise, so the loss visibly falls from ln(vocab).
A batch depends only on (seed, step): a run resumed from a checkpoint sees
the same data it would have seen without the crash.

>>> spec = demo_spec()
>>> spec.family, spec.num_layers, spec.emb_dim
('llama3.1', 4, 64)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxckpt.conversion.spec import family_defaults
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import resolve_model
from maxckpt.formats.maxtext.layout import as_tree
from maxckpt.formats.maxtext.params import global_params, layer_params
from maxckpt.reference.forward import decoder_layer, rms_norm, rope_timescales

BATCH, SEQ = 8, 32
LEARNING_RATE = 1e-2
NOISE = 0.1  # fraction of tokens that do not follow the successor table


def demo_spec(model: str = "llama3.1") -> ModelSpec:
    """Tiny dimensions (4 layers, width 64, 4 query heads over 2 KV heads, head_dim 16, vocab 256).

    head_dim 16 keeps MaxText's folded query scaling (x1/4) exact in every dtype.
    """
    values = family_defaults(resolve_model(model))
    return ModelSpec(
        family=resolve_model(model).name,
        num_layers=4,
        emb_dim=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        vocab_size=256,
        tie_word_embeddings=False,
        **values,
    )


def init_params(spec: ModelSpec, seed: int = 0) -> dict[str, Any]:
    """MaxText params `{"decoder": ..., "token_embedder": ...}` (scanned), float32, scaled like a fresh model."""
    from maxckpt.layouts.dims import shape_of

    rng = np.random.default_rng(seed)

    def sample(param, shape: tuple[int, ...]) -> np.ndarray:
        if not param.form.in_dims:
            fill = 1.0 if param.key.endswith("scale") else None
            return np.full(shape, fill, np.float32) if fill is not None else rng.normal(0, 1, shape).astype(np.float32)
        fan_in = math.prod(shape_of(param.form.in_dims, spec))
        return (rng.normal(0, 1, shape) / math.sqrt(fan_in)).astype(np.float32)

    flat: dict[str, np.ndarray] = {}
    for p in global_params(spec):
        flat[p.key] = sample(p, p.framework_shape(spec))
    for p in layer_params(spec, moe=False):
        layers = [sample(p, p.framework_shape(spec)) for _ in range(spec.num_layers)]
        flat[f"decoder/layers/{p.key}"] = np.stack(layers, axis=1)  # MaxText's param_scan_axis
    return jax.tree_util.tree_map(jnp.asarray, as_tree(flat))


def logits_fn(params: dict[str, Any], tokens: jnp.ndarray, spec: ModelSpec) -> jnp.ndarray:
    """Differentiable logits [B, S, V] of MaxText's decoder on scanned MaxText params."""
    decoder = params["decoder"]
    layers = decoder["layers"]
    y = params["token_embedder"]["embedding"][tokens]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    timescale = rope_timescales(spec)
    # Scan over the layer axis (1, MaxText's param_scan_axis): one compiled layer body.
    flat = {
        "/".join(str(k.key) for k in path): jnp.moveaxis(leaf, 1, 0)
        for path, leaf in jax.tree_util.tree_flatten_with_path(layers)[0]
    }

    def body(y, layer):
        return decoder_layer(y, layer, positions, timescale, spec), None

    y, _ = jax.lax.scan(body, y, flat)
    y = rms_norm(y, decoder["decoder_norm"]["scale"], spec.rms_norm_eps)
    return y @ decoder["logits_dense"]["kernel"]


def optimizer() -> optax.GradientTransformation:
    return optax.adamw(LEARNING_RATE, weight_decay=0.01)


def init_state(spec: ModelSpec, seed: int = 0) -> dict[str, Any]:
    """A MaxText-shaped train state: `params/params/...`, optax `opt_state`, `step` (completed steps)."""
    params = {"params": init_params(spec, seed)}
    return {"params": params, "opt_state": optimizer().init(params), "step": jnp.asarray(0, jnp.int32)}


def successor_table(vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + 7919).permutation(vocab)


def batch(step: int, spec: ModelSpec, seed: int = 0) -> np.ndarray:
    """The training batch of `step` [BATCH, SEQ + 1] (inputs and shifted targets), a function of (seed, step) only."""
    table = successor_table(spec.vocab_size, seed)
    rng = np.random.default_rng([seed, step])
    out = np.empty((BATCH, SEQ + 1), np.int32)
    out[:, 0] = rng.integers(0, spec.vocab_size, BATCH)
    noise = rng.random((BATCH, SEQ)) < NOISE
    random_tokens = rng.integers(0, spec.vocab_size, (BATCH, SEQ))
    for t in range(SEQ):
        out[:, t + 1] = np.where(noise[:, t], random_tokens[:, t], table[out[:, t]])
    return out


def make_train_step(spec: ModelSpec):
    """A jitted `(state, batch) -> (state, loss)`: cross-entropy, adamw, step + 1."""
    tx = optimizer()

    def loss_fn(params, tokens):
        logits = logits_fn(params["params"], tokens[:, :-1], spec)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def train_step(state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], tokens)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss

    return train_step
