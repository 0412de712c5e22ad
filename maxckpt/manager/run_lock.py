"""One writer per run directory: an advisory lock held while a manager may save there.

Two managers saving to one directory destroy each other's work: both write
the same step names, and each one's start-up cleanup moves the other's
in-flight save aside. A manager therefore takes `<dir>/.maxckpt.lock`
(``fcntl.flock``, exclusive, non-blocking) before it touches anything, and
writes its host, pid and start time into the file so the refused one can say
who holds it. The kernel drops the lock when its holder dies, however it
dies, so a lock left by a crashed run is taken over (and said so) rather
than blocking the restart. The file stays; a clean release empties it. The
owner written there is :func:`maxckpt.storage.ownership.owner_record` (pid,
process start, boot id), so "is it still running" is answered by the same
rule as for conversion outputs; the flock, not that record, decides who holds it.

Object stores (``gs://``, ``s3://``) have no such lock: there the caller
skips locking.

>>> lock = RunDirLock.acquire("/runs/llama/checkpoints")   # doctest: +SKIP
>>> lock.release()                                         # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import time

from maxckpt.errors import CheckpointSaveError, RunDirBusyError
from maxckpt.storage.ownership import owner_alive, owner_record
from maxckpt.storage.run_dirs import LOCK_NAME

logger = logging.getLogger("maxckpt.manager")


def _owner_text(raw: str) -> tuple[str, dict]:
    """`host H, pid N, since T` from the lock file's contents, and the parsed fields."""
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return ("an unknown owner (the lock file does not say who)", {})
    since = info.get("started")
    when = ""
    if isinstance(since, (int, float)):
        when = ", since " + _dt.datetime.fromtimestamp(since, _dt.timezone.utc).isoformat(timespec="seconds")
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}{when}", info


def unwritable_error(directory: str, err: OSError, what: str) -> CheckpointSaveError:
    """The error for a run directory the process cannot write (what: the action that failed)."""
    reason = err.strerror or str(err)
    hint = {
        errno.ENOSPC: "free space on that file system",
        errno.EDQUOT: "free space (the disk quota is exhausted)",
        errno.EROFS: "it is on a read-only file system: pick a writable directory",
        errno.EACCES: "make it writable for this user, or pick another directory",
        errno.EPERM: "make it writable for this user, or pick another directory",
        errno.ENOTDIR: "a part of the path is a file, not a directory",
        errno.EEXIST: "a file of that name is in the way",
    }.get(err.errno, "check the path and its permissions")
    return CheckpointSaveError(f"cannot {what} {directory}: {reason}; {hint}")


class RunDirLock:
    """The held lock of one run directory (see the module doc)."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_NAME)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: str | os.PathLike) -> "RunDirLock":
        """Create `directory` if needed and lock it; raise when it cannot be written or is taken."""
        directory = os.fspath(directory)
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise CheckpointSaveError(f"{directory} is a file, not a directory: cannot save checkpoints into it")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as err:
            raise unwritable_error(directory, err, "create the checkpoint directory") from None
        path = os.path.join(directory, LOCK_NAME)
        if os.path.islink(path) or os.path.isdir(path):
            kind = "a symlink" if os.path.islink(path) else "a folder"
            raise CheckpointSaveError(f"{path} is {kind}: maxckpt keeps its run-directory lock there; move it away")
        # The lock is held on a read-only descriptor (flock needs none other), and the owner is written
        # through a short-lived one: no file stays open for writing, so a file system that has to go
        # read-only under a running job (a disk error, an admin) still can.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise unwritable_error(directory, err, "write to the checkpoint directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            raw = _read(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who, _ = _owner_text(raw)
                raise RunDirBusyError(
                    f"another process ({who}) is saving to {directory}; two writers would destroy each "
                    f"other's saves. Stop it, or give this run its own directory (the lock is {path})"
                ) from None
            raise unwritable_error(directory, err, "lock the checkpoint directory") from None
        previous = _read(fd)
        if previous.strip():
            who, info = _owner_text(previous)
            if owner_alive(info):  # it let go without emptying the file (e.g. its disk was read-only)
                logger.info("maxckpt: taking over the lock of %s released by %s", directory, who)
            else:
                logger.warning(
                    "maxckpt: %s was left locked by %s, which is no longer running; taking it over", directory, who
                )
        lock = cls(directory, fd)
        try:
            # `started`: for the "since" of messages
            lock._write(json.dumps({**owner_record(), "started": time.time()}))
        except OSError as err:
            lock.release()
            raise unwritable_error(directory, err, "write to the checkpoint directory") from None
        return lock

    def _write(self, text: str) -> None:
        wfd = os.open(self.path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(wfd, text.encode())
        finally:
            os.close(wfd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the lock file (a clean stop leaves no owner behind) and unlock it."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self._write("")
        except OSError:
            pass  # a full or read-only disk: the next owner sees the lock free and takes it over
        finally:
            os.close(fd)  # closing drops the flock

    def __del__(self) -> None:  # a manager dropped without close(): unlock with it
        try:
            self.release()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        return ""
