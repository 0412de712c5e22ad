"""MaxText's own forward pass: logits of fixed tokens from a checkpoint's params (runs in the MaxText venv).

    python maxtext_logits.py OVERLAY PARAMS_ITEMS_DIR TOKENS.npy OUT.npy [key=value ...]

The model is built by MaxText (`model_creation_utils.from_pretrained`, as its
distillation and decode tools do) from the overlay, with
`load_parameters_path` set to the checkpoint, and called in eval mode.
MaxText 0.2.5's `from_pretrained` restores only `params`: a DeepSeek routing
bias (an NNX `MoEBiasVar`, stored under `nnx_aux/model/...`) is left as a
deleted array, so it is copied in from the checkpoint here, as the fixtures'
logits were made (../shared/fixtures/README.md, deepseek3).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from maxtext.configs import pyconfig
from maxtext.utils import maxtext_utils, model_creation_utils

overlay, params_path, tokens_file, out_file, *overrides = sys.argv[1:]
config = pyconfig.initialize(["", overlay, *overrides, f"load_parameters_path={params_path}"])
mesh = jax.sharding.Mesh(maxtext_utils.create_device_mesh(config, jax.devices()), config.mesh_axes)
model = model_creation_utils.from_pretrained(config, mesh=mesh)


def copy_routing_bias(model) -> None:
    from flax import nnx
    from maxtext.layers.moe import MoEBiasVar

    biases = nnx.state(model, MoEBiasVar)
    flat = list(nnx.to_flat_state(biases))
    if not flat:
        return
    import orbax.checkpoint as ocp

    stored = ocp.PyTreeCheckpointer().restore(params_path)["nnx_aux"]["model"]
    for path, var in flat:
        node = stored
        for key in path:
            node = node[key]
        var.value = jnp.asarray(np.asarray(node), dtype=var.value.dtype).reshape(var.value.shape)
    nnx.update(model, biases)


copy_routing_bias(model)
tokens = np.load(tokens_file).astype(np.int32)
positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
with jax.set_mesh(mesh):
    logits = model(
        decoder_input_tokens=jnp.asarray(tokens),
        decoder_positions=jnp.asarray(positions),
        decoder_segment_ids=jnp.ones_like(jnp.asarray(tokens)),
        enable_dropout=False,
    )
np.save(out_file, np.asarray(logits, dtype=np.float32))
