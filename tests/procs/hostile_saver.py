"""Child program: a training loop whose checkpoint directory turns hostile.

    python hostile_saver.py DIR ACTION END

ACTION: `none` (DIR is hostile already), `ro` (remount DIR's tmpfs read-only
after the manager started), `full` (save a step too big for DIR's tmpfs after
a small one). END: how the script ends - `with` (a with block), `close`,
`wait` (wait() then close()), `exit` (neither: the interpreter exits with the
save in flight), `save` (another save follows), `recover` (wait() fails, close(), the disk is made writable
again, a new manager saves). Prints `RAISED <type>: <message>` for the first error
and `END` when the script body finished.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

directory, action, end = sys.argv[1], sys.argv[2], sys.argv[3]

from maxckpt import CheckpointManager  # noqa: E402


def state(rows: int, seed: float) -> dict:
    # Random values: Orbax compresses chunks, so a constant array would fit anywhere.
    return {"params": {"w": np.random.default_rng(int(seed)).standard_normal((rows, 256)).astype(np.float32)}}


def body(mgr: CheckpointManager) -> None:
    if action == "full":
        mgr.save(0, state(4, 0.0))  # 4 KiB: fits
        mgr.wait()
        print("COMMITTED", mgr.all_steps(), flush=True)
        mgr.save(1, state(4096, 1.0))  # 4 MiB: does not
    else:
        if action == "ro":
            subprocess.run(["mount", "-o", "remount,ro", directory], check=True)
        mgr.save(0, state(4, 0.0))
    if end in ("wait", "recover"):
        mgr.wait()
    if end == "save":  # the next save is where an async failure shows first
        mgr.save(2, state(4, 2.0))


try:
    if end == "with":
        with CheckpointManager(directory, async_save=True) as mgr:
            body(mgr)
    else:
        mgr = CheckpointManager(directory, async_save=True)
        body(mgr)
        if end in ("close", "wait", "save"):
            mgr.close()
except Exception as err:  # noqa: BLE001 - the parent checks what was raised
    print(f"RAISED {type(err).__name__}: {err}", flush=True)
    if end == "recover":
        mgr.close()  # the failure was reported once: closing does not raise it again
        subprocess.run(["mount", "-o", "remount,rw", directory], check=True)
        with CheckpointManager(directory, async_save=True) as again:
            again.save(5, state(4, 5))
        print("RECOVERED", sorted(os.listdir(directory)), flush=True)
    if action == "full":
        from maxckpt.storage.run_dirs import scan_run_dir

        print("AFTER", [e.step for e in scan_run_dir(directory).committed], flush=True)
print("END", flush=True)
