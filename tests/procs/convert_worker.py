"""Child program: one process of a multi-process `maxckpt convert`, optionally killed mid-way.

    python convert_worker.py [maxckpt convert arguments...]

With MAXCKPT_TEST_KILL_AFTER=K in the environment, the process SIGKILLs
itself once K tensors (or layer pieces) have been computed - after it
wrote something, before its share is complete - as a crash or an OOM kill
would; with MAXCKPT_TEST_FAIL_AFTER=K it fails there as a full disk would,
and with MAXCKPT_TEST_HANG_AFTER=K it stops making progress there.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from maxckpt.cli.main import main
from maxckpt.conversion import pipeline

kill_after = int(os.environ.get("MAXCKPT_TEST_KILL_AFTER", "0"))
fail_after = int(os.environ.get("MAXCKPT_TEST_FAIL_AFTER", "0"))
hang_after = int(os.environ.get("MAXCKPT_TEST_HANG_AFTER", "0"))
if kill_after or fail_after or hang_after:
    checked, seen = pipeline._checked, [0]

    def dying_checked(t, array):
        seen[0] += 1
        if kill_after and seen[0] > kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if fail_after and seen[0] > fail_after:
            raise OSError(28, "No space left on device (injected by the test)")
        if hang_after and seen[0] > hang_after:
            time.sleep(3600)  # alive (heartbeats go on) but making no progress
        return checked(t, array)

    pipeline._checked = dying_checked

main(["convert", *sys.argv[1:]])
