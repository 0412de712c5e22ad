"""Child program for the crash tests: a training loop that saves every step, with retention.

    python crash_trainer.py DIR --mode sync|async --until N [--stall-deleting]

It resumes from the newest committed checkpoint (checking it bit for bit
against the state it saved for that step), then saves steps up to N-1 and
exits cleanly. Protocol on stdout, one line each, flushed:
``RESUMED <step>`` or ``FRESH``, ``SAVED <step>`` after each save call,
``DELETING <path>`` when `--stall-deleting` has stopped a deletion halfway,
``DONE`` at the end. The parent SIGKILLs it at instants of its choosing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from maxckpt import CheckpointManager
from manager_states import assert_same, make_state

KEEP, KEEP_PERIOD = 2, 5


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stall_deleting(path, *args, **kwargs) -> None:
    """Delete half of a retired checkpoint's files, then hang until killed: a process dying mid-retention."""
    files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names)
    for name in [os.path.join(path, "commit_success.txt")] + [f for f in files if not f.endswith("commit_success.txt")][::2]:
        os.remove(name)
    say(f"DELETING {path}")
    time.sleep(3600)


def stall_deleting_objects(path) -> None:
    """On a bucket: the deletion intent is recorded; delete the commit marker and half the objects, then hang."""
    from maxckpt.storage import objects

    files = objects.find_files(os.fspath(path))
    commit = [f for f in files if f.endswith("/commit_success.txt") and f.count("/") == os.fspath(path).count("/") + 1]
    objects.delete_files(commit + [f for f in files if f not in commit][::2])
    say(f"DELETING {path}")
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--mode", choices=("sync", "async"), required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--stall-deleting", action="store_true")
    args = parser.parse_args()
    if args.stall_deleting:
        from maxckpt.storage import deletion

        shutil.rmtree = stall_deleting
        deletion.finish = stall_deleting_objects
    with CheckpointManager(
        args.directory, period=1, max_to_keep=KEEP, keep_period=KEEP_PERIOD, async_save=args.mode == "async"
    ) as mgr:
        state = mgr.restore(make_state(0))
        if state is None:
            say("FRESH")
            start = 0
        else:
            assert_same(state, make_state(mgr.restored_step))  # the newest committed step, bit for bit
            say(f"RESUMED {mgr.restored_step}")
            start = mgr.restored_step + 1
        for step in range(start, args.until):
            state = make_state(step)  # "training": the state after `step`
            mgr.save(step, state)
            say(f"SAVED {step}")
    say("DONE")


if __name__ == "__main__":
    main()
