"""Child program: convert SRC to a bucket DST, and stop itself (SIGSTOP) right after the first file is uploaded.

    python bucket_convert_paused.py SRC DST FORMAT

A live conversion caught in the middle of its upload: the test competes with
it, then lets it go on (SIGCONT) and checks that it finishes intact.
"""

from __future__ import annotations

import os
import signal
import sys

from maxckpt.formats import HFOptions
from maxckpt.conversion import convert
from maxckpt.storage import outputs

real_upload = outputs._upload_file
paused = False


def upload_then_pause(src: str, dst: str) -> None:
    global paused
    real_upload(src, dst)
    if not paused:
        paused = True
        print(f"UPLOADED {dst}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


outputs._upload_file = upload_then_pause
convert(sys.argv[1], sys.argv[2], to=sys.argv[3], model="llama2",
        options=HFOptions(max_shard_size=4096) if sys.argv[3] == "hf" else None)
print("DONE", flush=True)
