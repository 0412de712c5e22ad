"""Child program: an async CheckpointManager save to s3:// whose server the test kills mid-save.

    python s3_dies_mid_save.py s3://BUCKET/run/checkpoints

Prints `saving` once the async save of step 0 started, then waits for a line
on stdin (the test kills the server meanwhile), then `wait`s, saves step 1,
`wait`s and `close`s, printing one JSON line per call: what it raised and when.
"""

from __future__ import annotations

import json
import sys
import time

import jax.numpy as jnp
import numpy as np

from maxckpt import CheckpointManager


def attempt(what, fn, started):
    try:
        fn()
        error = None
    except BaseException as err:  # noqa: BLE001 - reported to the test
        error = f"{type(err).__module__}.{type(err).__name__}: {err}"
    print(json.dumps({"call": what, "error": error, "seconds": time.monotonic() - started}), flush=True)


rng = np.random.default_rng(0)
state = {"params": {f"w{i}": jnp.asarray(rng.random((1024, 1024), dtype=np.float32)) for i in range(16)}}
mgr = CheckpointManager(sys.argv[1], period=1, async_save=True)
mgr.save(0, state)
print("saving", flush=True)
sys.stdin.readline()
started = time.monotonic()
attempt("wait", mgr.wait, started)
attempt("save", lambda: (mgr.save(1, state), mgr.wait()), started)
attempt("close", mgr.close, started)
