"""Child program: one of two JAX processes sharing a sharded train state on CPU.

    python two_process_worker.py PROCESS_ID PORT DIR LOG_DIR

Each process holds half of a (8, 4) array (its rows), saves with retention,
restores, and records every deletion it performs in LOG_DIR/deletions.<id>,
so the parent can check that only process 0 ever touched the disk.
"""

from __future__ import annotations

import os
import shutil
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, directory, log_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from maxckpt import CheckpointManager  # noqa: E402

LOG = os.path.join(log_dir, f"deletions.{process_id}")
_rmtree, _rename = shutil.rmtree, os.rename


def logged_rmtree(path, *args, **kwargs):
    with open(LOG, "a") as f:
        f.write(f"rmtree {os.path.basename(path)}\n")
    return _rmtree(path, *args, **kwargs)


def logged_rename(src, dst, *args, **kwargs):
    if "maxckpt-deleting" in os.fspath(dst):
        with open(LOG, "a") as f:
            f.write(f"retire {os.path.basename(src)}\n")
    return _rename(src, dst, *args, **kwargs)


shutil.rmtree, os.rename = logged_rmtree, logged_rename

X = np.arange(32, dtype=np.float32).reshape(8, 4)


def state_at(step: int, sharding: NamedSharding) -> dict:
    w = jax.make_array_from_callback(X.shape, sharding, lambda index: X[index] * (step + 1))
    s = jax.make_array_from_callback((), NamedSharding(sharding.mesh, P()), lambda index: np.int32(step))
    return {"params": {"w": w}, "step": s}


def main() -> None:
    assert jax.process_count() == 2 and len(jax.devices()) == 2 and len(jax.local_devices()) == 1
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data", None))
    with CheckpointManager(directory, period=1, max_to_keep=2, async_save=True) as mgr:
        for step in range(5):
            assert mgr.save(step, state_at(step, rows))
        # The final save of the step just saved: already saved, on both processes alike (no barrier left waiting).
        assert mgr.save(4, state_at(4, rows), final=True) is False
        mgr.wait()
        steps = mgr.all_steps()
        target = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state_at(0, rows)
        )
        restored = mgr.restore(target)
        assert mgr.restored_step == 4
        (shard,) = restored["params"]["w"].addressable_shards
        assert np.array_equal(np.asarray(shard.data), X[shard.index] * 5), (shard.index, shard.data)
        # Restore onto another sharding: every process holds the whole array.
        replicated = {"params": {"w": jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(mesh, P()))},
                      "step": target["step"]}
        full = mgr.restore(replicated)
        assert np.array_equal(np.asarray(full["params"]["w"].addressable_data(0)), X * 5)
    print(f"OK process {process_id} steps {steps} rows {shard.index[0].start}:{shard.index[0].stop}", flush=True)


if __name__ == "__main__":
    main()
