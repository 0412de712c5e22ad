"""Tiny train states for manager tests: deterministic per step, so any restore can be checked bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

TX = optax.adam(1e-3)


def make_state(step: int, seed: int = 0) -> dict:
    """A MaxText-shaped train state (params under params/params, Adam opt_state, step) unique to `step`."""
    rng = np.random.default_rng(1000 * seed + step)
    params = {
        "params": {
            "decoder": {"layers": {"mlp": {"wi": {"kernel": jnp.asarray(rng.standard_normal((8, 2, 16), np.float32))}}}},
            "token_embedder": {"embedding": jnp.asarray(rng.standard_normal((32, 8), np.float32)).astype(jnp.bfloat16)},
        }
    }
    opt_state = TX.init(params)
    opt_state = jax.tree_util.tree_map(lambda x: x + step, opt_state)
    return {"params": params, "opt_state": opt_state, "step": jnp.asarray(step + 1, jnp.int32)}


def abstract(tree):
    """Shapes, dtypes and shardings only: what a training loop restores onto."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _numpy(x) -> np.ndarray:
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        x = jax.random.key_data(x)  # MaxText's nnx_aux holds typed RNG keys
    return np.asarray(x)


def assert_same(a, b) -> None:
    """Same structure, dtypes and bits."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, f"structures differ:\n{ta}\n{tb}"
    for x, y in zip(la, lb):
        x, y = _numpy(x), _numpy(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        assert np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))
