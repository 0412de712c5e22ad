"""Child program: one of two JAX processes starting a manager on a run directory another process holds.

    python two_process_locked.py PROCESS_ID PORT DIR

Prints `RAISED <type>: <message>` (both processes must stop, neither may wait for the other).
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

from maxckpt import CheckpointManager  # noqa: E402

try:
    with CheckpointManager(directory, async_save=True):
        print("STARTED", flush=True)
except Exception as err:  # noqa: BLE001 - the parent checks what was raised
    print(f"RAISED {type(err).__name__}: {err}", flush=True)
