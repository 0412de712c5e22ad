"""Child program: save on one mesh, restore onto others (run with fake CPU devices).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python reshard.py save DIR
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python reshard.py restore DIR

The device count must be set before JAX starts, hence a separate process.
Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from maxckpt import CheckpointConfig, CheckpointManager

W = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
E = (np.arange(32 * 16, dtype=np.float32).reshape(32, 16) / 7).astype(jnp.bfloat16)


def target(mesh: Mesh, w_spec: P, e_spec: P) -> dict:
    return {
        "params": {
            "w": jax.ShapeDtypeStruct(W.shape, W.dtype, sharding=NamedSharding(mesh, w_spec)),
            "e": jax.ShapeDtypeStruct(E.shape, E.dtype, sharding=NamedSharding(mesh, e_spec)),
        },
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P())),
    }


def check(name: str, restored: dict, want: dict) -> None:
    for key, value, expected in (("w", restored["params"]["w"], W), ("e", restored["params"]["e"], E)):
        assert value.sharding == want["params"][key].sharding, (name, key, value.sharding)
        assert np.array_equal(np.asarray(value), expected), (name, key)
    assert int(restored["step"]) == 3, name
    shard_shapes = sorted({s.data.shape for s in restored["params"]["w"].addressable_shards})
    print(f"ok {name}: {len(restored['params']['w'].sharding.device_set)} devices, w shards {shard_shapes}", flush=True)


def main(mode: str, directory: str) -> None:
    devices = np.array(jax.devices())
    if mode == "save":
        assert len(devices) == 8, devices
        mesh = Mesh(devices, ("data",))
        state = {
            "params": {
                "w": jax.device_put(W, NamedSharding(mesh, P("data", None))),
                "e": jax.device_put(E, NamedSharding(mesh, P(None, "data"))),
            },
            "step": jax.device_put(np.int32(3), NamedSharding(mesh, P())),
        }
        with CheckpointManager(directory, async_save=True) as mgr:
            mgr.save(3, state)
        mesh24 = Mesh(devices.reshape(2, 4), ("x", "y"))
        with CheckpointManager(directory) as mgr:
            want = target(mesh24, P("y", "x"), P(None, ("x", "y")))
            check("8 devices -> 2x4 mesh, other partitioning", mgr.restore(want), want)
            want = target(Mesh(devices[:4], ("d",)), P(None, "d"), P("d", None))
            check("8 devices -> 4 of them", mgr.restore(want), want)
        single = CheckpointConfig(enable_single_replica_ckpt_restoring=True)
        with CheckpointManager(directory, config=single) as mgr:
            want = target(mesh24, P("y", None), P(None, "y"))  # replicated over x: replica 0 reads
            check("single-replica restore on 2x4", mgr.restore(want), want)
    else:
        assert len(devices) == 2, devices
        with CheckpointManager(directory) as mgr:
            want = target(Mesh(devices, ("d",)), P("d", None), P(None, None))
            check("saved on 8 devices -> restored on 2", mgr.restore(want), want)
            want = target(Mesh(devices[:1], ("d",)), P(), P())
            check("saved on 8 devices -> restored on 1", mgr.restore(want), want)
            plain = mgr.restore()  # no target: as saved, on the first device
            assert np.array_equal(np.asarray(plain["params"]["w"]), W)
            print("ok no target: first local device", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
