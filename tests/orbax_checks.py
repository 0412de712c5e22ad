"""Looking at a MaxText/Orbax checkpoint as someone without maxckpt would: TensorStore and stock Orbax only."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts


def sharding(items: Path, name: str) -> dict:
    """The `sharding_indexed` codec's configuration of one stored array, read with TensorStore from the OCDBT database."""
    store = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{items}", "path": f"{name}/"}},
        open=True, read=True,
    ).result()
    (codec,) = store.spec().to_json()["metadata"]["codecs"]
    assert codec["name"] == "sharding_indexed"
    return codec["configuration"]


def codecs(items: Path, name: str) -> list[str]:
    """Codec names of one stored array (inside its shards)."""
    return [c["name"] for c in sharding(items, name)["codecs"]]


def chunk_shape(items: Path, name: str) -> list[int]:
    """The shape of one stored array's chunks (the inner chunks of its shards)."""
    return sharding(items, name)["chunk_shape"]


def plain_orbax_restore(items: Path) -> dict:
    """Restore as someone without maxckpt would: Orbax's stock PyTree checkpointer, numpy leaves."""
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = ckptr.metadata(items).item_metadata
        args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta.tree)
        return ckptr.restore(items, args=ocp.args.PyTreeRestore(restore_args=args))
