"""Who is writing something, and whether that process still runs: the one rule for owner records.

A conversion's temporary folder (:mod:`maxckpt.conversion.staging`), a
bucket output's ``writing`` record (:mod:`maxckpt.storage.outputs`) and a
run directory's lock (:mod:`maxckpt.manager.run_lock`) all say who owns them, so that a later process can tell debris \
of a dead writer from
the work of a live one. A pid alone is not enough: pids are reused, and a
machine may have rebooted since. The record holds the host, the pid, the
process start time (clock ticks since boot) and the boot id; this host can
then answer exactly, another host cannot (``None``).

>>> owner_alive(owner_record())
True
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path


def proc_start(pid: int) -> int | None:
    """Start time of process `pid` in clock ticks since boot (Linux), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2 :].split()[19])  # field 22; the command name may hold spaces
    except (ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This machine's boot id (Linux), None where unknown: a pid recorded before a reboot names nobody now."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def host_tag() -> str:
    """This host and boot in 8 hex digits, for a name that must say who made it before any record exists."""
    return hashlib.sha1(f"{socket.gethostname()}\0{boot_id() or ''}".encode()).hexdigest()[:8]


def owner_record() -> dict:
    """Who is writing: enough to tell later whether that process is still alive (pid reuse included)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": proc_start(os.getpid()),
        "boot_id": boot_id(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def owner_alive(owner: dict) -> bool | None:
    """True/False when this host can tell whether the recorded owner still runs; None for another host."""
    if owner.get("host") != socket.gethostname():
        return None
    boot = boot_id()
    if boot is not None and owner.get("boot_id") not in (None, boot):
        return False  # the machine rebooted since
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    start = proc_start(pid)
    if start is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return owner.get("process_start") is None  # cannot compare start times: trust the pid
    return owner.get("process_start") in (None, start)
