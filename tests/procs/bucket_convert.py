"""Child program: convert SRC to a bucket DST, and SIGKILL itself right after the first file is uploaded.

    python bucket_convert.py SRC DST FORMAT

A conversion killed outright (no cleanup runs) halfway through its upload.
"""

from __future__ import annotations

import os
import signal
import sys

from maxckpt.formats import HFOptions
from maxckpt.conversion import convert
from maxckpt.storage import outputs

real_upload = outputs._upload_file


def upload_then_die(src: str, dst: str) -> None:
    real_upload(src, dst)
    print(f"UPLOADED {dst}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


outputs._upload_file = upload_then_die
convert(sys.argv[1], sys.argv[2], to=sys.argv[3], model="llama2",
        options=HFOptions(max_shard_size=4096) if sys.argv[3] == "hf" else None)
print("NOT KILLED", flush=True)
