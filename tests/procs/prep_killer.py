"""Child program: `maxckpt convert`, SIGKILLed inside the window where its owner record is being prepared.

    MAXCKPT_TEST_KILL_IN_PREP=before-record|after-record|stop-before-record python prep_killer.py [maxckpt convert arguments...]

`before-record`: killed right after the hidden `.<dst>.prep-*` folder was
created and its owner record file opened, before anything is written to it. `after-record`: killed once the
record is complete on disk, before the folder is renamed to `<dst>.tmp-*`.
Either way the process dies as a crash or an OOM kill would, leaving the
hidden folder behind. `stop-before-record`: stopped (SIGSTOP) at the
`before-record` point instead, a live conversion caught inside that window;
it goes on when sent SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from maxckpt.cli.main import main
from maxckpt.conversion import staging

mode = os.environ["MAXCKPT_TEST_KILL_IN_PREP"]
if mode in ("before-record", "stop-before-record"):
    real_owner_record = staging.owner_record

    def dying_owner_record() -> dict:
        os.kill(os.getpid(), signal.SIGKILL if mode == "before-record" else signal.SIGSTOP)
        return real_owner_record()  # reached only after a SIGCONT

    staging.owner_record = dying_owner_record
elif mode == "after-record":

    class _DyingJson:
        @staticmethod
        def dump(obj, f) -> None:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the record is complete on disk; the rename never comes
            os.kill(os.getpid(), signal.SIGKILL)

    staging.json = _DyingJson
else:
    raise SystemExit(f"unknown MAXCKPT_TEST_KILL_IN_PREP={mode!r}")

main(["convert", *sys.argv[1:]])
