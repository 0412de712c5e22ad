"""MaxText -> MaxText (params only, another compression, ...): stored tensors are copied as they are, chunk by chunk.

The general path goes through HF tensors and back, which is the identity in
value but transposes every kernel twice and re-applies MaxText's query
scaling, which is one ulp off on some values at head dims whose square root
is not a power of two. A tensor stored under the same name, shape and dtype
is copied in the source's own chunks instead: bit for bit, and chunked as
the source was.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conversion_models import nest, random_maxtext_params, tiny_spec
from maxckpt.formats import MaxTextOptions
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.conversion import convert


def _save_chunked(run: Path, params: dict, chunk_bytes: int) -> Path:
    """A MaxText-style run whose arrays are stored in several chunks each (and an optimizer state to drop)."""
    tree = {"params": {"params": nest(params)}, "opt_state": {"mu": nest({k: np.zeros_like(v) for k, v in params.items()})},
            "step": np.int32(8)}
    save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(chunk_byte_size=chunk_bytes), tree)
    manager = ocp.CheckpointManager(
        run / "checkpoints", item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
    )
    manager.save(7, args=ocp.args.Composite(items=ocp.args.PyTreeSave(tree, save_args=save_args)))
    manager.wait_until_finished()
    manager.close()
    return run / "checkpoints" / "7" / "items"


@pytest.mark.parametrize("workers", [1, 3])
def test_maxtext_to_maxtext_copies_every_param_bit_for_bit_in_the_source_chunks(tmp_path, workers):
    spec = tiny_spec("llama2", layers=3, head_dim=128)  # sqrt(128) is no power of two: scaling would round
    params = random_maxtext_params(spec)
    items = _save_chunked(tmp_path / "run", params, chunk_bytes=16 << 10)
    out = tmp_path / "params-only"
    convert(tmp_path / "run", out, to="maxtext", model="llama2", workers=workers, options=MaxTextOptions(compression="zstd"))

    with OrbaxReader(items) as src, OrbaxReader(out / "0" / "items") as dst:
        written = dst.tensors()
        assert sorted(written) == sorted(f"params/params/{k}" for k in params)  # params only: no opt_state, no step
        chunked = 0
        for name, info in written.items():
            stored = src.tensors()[name]
            assert info.chunk_shape == stored.chunk_shape, name
            chunked += info.chunk_shape != tuple(info.shape)
            np.testing.assert_array_equal(dst.read(name), src.read(name), err_msg=name)
        assert chunked >= 5  # the test really has tensors in several chunks


def test_a_changed_layout_or_dtype_still_goes_through_the_layouts(tmp_path):
    spec = tiny_spec("llama2", layers=2)
    params = random_maxtext_params(spec)
    _save_chunked(tmp_path / "run", params, chunk_bytes=16 << 10)
    unscanned, halved = tmp_path / "unscanned", tmp_path / "bf16"
    convert(tmp_path / "run", unscanned, to="maxtext", model="llama2", options=MaxTextOptions(scan_layers=False))
    convert(tmp_path / "run", halved, to="maxtext", model="llama2", dtype="bfloat16")
    with OrbaxReader(unscanned / "0" / "items") as r:
        names = r.tensors()
        assert "params/params/decoder/layers_1/mlp/wo/kernel" in names
        np.testing.assert_array_equal(r.read("params/params/decoder/layers_1/mlp/wo/kernel"), params["decoder/layers/mlp/wo/kernel"][:, 1])
    with OrbaxReader(halved / "0" / "items") as r:
        wo = r.read("params/params/decoder/layers/mlp/wo/kernel")
        assert wo.dtype.name == "bfloat16"
        np.testing.assert_array_equal(wo, params["decoder/layers/mlp/wo/kernel"].astype(wo.dtype))
