"""Child program: run `maxckpt ARGS...`, SIGKILLing itself just before its K-th change to an object store.

    python killed_at_mutation.py K ARGS...

Every change maxckpt makes to a bucket (an object written, streamed, or
deleted) goes through :mod:`maxckpt.storage.objects`; counting those calls
enumerates every point between two changes at which a process can die. With
K larger than the number of changes the command runs to its end and prints
``MUTATIONS N`` (how many it made) before it exits with the command's code.
"""

from __future__ import annotations

import os
import signal
import sys

from maxckpt.storage import objects

LIMIT = int(sys.argv[1])
count = 0


def _counted(fn):
    def inner(*args, **kwargs):
        global count
        count += 1
        if count == LIMIT:
            print(f"KILLED AT {count}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)

    return inner


for _name in ("write_bytes", "open_write", "delete_files"):
    setattr(objects, _name, _counted(getattr(objects, _name)))

from maxckpt.cli.main import main  # noqa: E402 - after the patch, so every module sees the counted functions

try:
    main(sys.argv[2:])
except SystemExit as done:
    print(f"MUTATIONS {count}", flush=True)
    raise SystemExit(done.code) from None
