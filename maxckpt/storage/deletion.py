"""Deleting a checkpoint so that a crash at any instant leaks nothing.

A checkpoint is hundreds of files (objects in a bucket). Deleting them takes
time, and a process can die in the middle. Whatever is left must (a) never
look like a checkpoint to anyone (maxckpt, plain Orbax, a restarting run) and
(b) be found and finished by the next retention pass.

- On a local disk that is one atomic rename to ``<name>.maxckpt-deleting``,
  then a recursive delete (:mod:`maxckpt.manager.retention`).
- On a bucket nothing can be renamed. The intent is recorded first, as a
  small object ``<name>.maxckpt-deleting`` beside the step
  (:func:`record_intent`); :func:`~maxckpt.storage.run_dirs.scan_run_dir`
  reports a step with such a record as *deleting*, never as a checkpoint.
  Then :func:`finish` removes the step's ``commit_success.txt`` (so plain
  Orbax stops listing it), its other objects in parallel batches, and the
  record last. A crash anywhere leaves the record, so the next pass finishes
  the job.
- A record proves what it dooms: it holds the fingerprint of the step's
  ``commit_success.txt`` as it was when the deletion began (GCS generation,
  S3 ETag and time, size). A record beside a committed step whose commit
  file it does not name (a stray or copied record, or one older than a save
  of the same step) is no deletion that started, and is ignored
  (:func:`~maxckpt.storage.run_dirs.deletion_state`), and so is a proven
  record of a step that would be the newest committed one: that step is
  never deleted.

>>> finish(record_intent(as_path("gs://bucket/run/checkpoints/100")))   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import socket
import time

from etils import epath

from maxckpt.storage import objects
from maxckpt.storage.run_dirs import COMMIT_FILE, DELETING_SUFFIX, DELETION_RECORD_KIND
from maxckpt.storage.urls import as_path


def intent_path(step_dir: str | os.PathLike) -> epath.Path:
    """Where the deletion record of `step_dir` lives: ``<parent>/<name>.maxckpt-deleting``."""
    p = as_path(step_dir)
    return p.parent / (p.name + DELETING_SUFFIX)


def record_intent(step_dir: str | os.PathLike) -> epath.Path:
    """Record that `step_dir` is being deleted (before touching any of its objects); returns `step_dir`."""
    p = as_path(step_dir)
    record = {
        "kind": DELETION_RECORD_KIND, "version": 2, "deleting": p.name, "since": time.time(),
        "host": socket.gethostname(), "pid": os.getpid(),
        "commit": objects.fingerprint(os.fspath(p / COMMIT_FILE)),  # what this deletion dooms, exactly
    }
    objects.write_bytes(os.fspath(intent_path(p)), json.dumps(record).encode())
    return p


def finish(step_dir: str | os.PathLike) -> None:
    """Delete every object of a step whose intent is recorded, then the record itself.

    Idempotent: a step already (partly) gone, or a record without a step, is
    finished off. Raises StorageError (an OSError) when the store keeps
    failing; the record stays, so the next pass retries.
    """
    p = as_path(step_dir)
    inside = os.fspath(p).rstrip("/") + "/"
    files = [f for f in objects.find_files(os.fspath(p)) if f.startswith(inside)]  # never an object named `p` itself
    commit = [
        f for f in files if f.rstrip("/").endswith("/" + COMMIT_FILE) and f.count("/") == os.fspath(p).count("/") + 1
    ]
    objects.delete_files(commit)  # first: from here on, plain Orbax no longer lists the step
    objects.delete_files([f for f in files if f not in commit])
    leftovers = [f for f in objects.find_files(os.fspath(p)) if f.startswith(inside)]
    if leftovers:  # written while we deleted (should not happen: nobody writes a retired step)
        objects.delete_files(leftovers)
    objects.delete_files([os.fspath(intent_path(p))])
