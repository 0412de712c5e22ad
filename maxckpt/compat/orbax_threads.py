"""Keep a failed async Orbax save from hanging the process, and from flooding the log.

In Orbax 0.12.x an async save runs its writers in non-daemon threads that
first wait for signals from each other (e.g. "the step directory was
created"). When one of them fails (read-only or full disk, permissions) the
signal it owed is never sent and the others wait for it for
`multihost.coordination_timeout()` (300 s) each; Python then blocks at exit
joining them, with or without `close()`. Once the failure is known,
:func:`release_stuck_threads` wakes the threads of that save's operations as
cancelled, so they end at once. :func:`at_exit` gives savers a last chance to
do that when the interpreter exits without `close()`: it runs before Python
joins the threads.

The helpers use Orbax internals (`future._SignalingThread`): when those are
missing, or this is another Orbax release than 0.12, they do nothing and the
old behaviour (a slow exit) comes back, not an error. The bounded waits
(:func:`wait_bounded`, :func:`save_timeout`) work on any release.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable

from maxckpt.compat.versions import written_for

logger = logging.getLogger("maxckpt.manager")

_JOIN_S = 5.0


def current_operation_id() -> str | None:
    """The id Orbax gave the save just started (each save gets a new one)."""
    try:
        from orbax.checkpoint._src.futures import synchronization

        return synchronization.OperationIdGenerator.get_current_operation_id()
    except Exception:  # noqa: BLE001 - internals moved: release_stuck_threads then does nothing
        return None


def release_stuck_threads(operation_ids: Iterable[str | None]) -> int:
    """Cancel the live writer threads of `operation_ids` and wake them; the number released."""
    ids = {i for i in operation_ids if i is not None}
    if not ids or not written_for("orbax-checkpoint"):
        return 0
    try:
        from orbax.checkpoint._src.futures import future as ocp_future

        thread_type = ocp_future._SignalingThread
    except Exception:  # noqa: BLE001
        return 0
    stuck = [
        t for t in threading.enumerate()
        if isinstance(t, thread_type) and t.is_alive() and getattr(t, "_operation_id", None) in ids
    ]
    for t in stuck:  # all cancelled before any wakes: a woken one must not start writing
        t._cancelled = True
    for t in stuck:
        try:
            ocp_future.set_signals(t._receive_signals, operation_id=t._operation_id)
        except Exception as err:  # noqa: BLE001 - best effort: the thread then times out as before
            logger.debug("maxckpt: could not wake Orbax thread %s: %s", t.name, err)
    for t in stuck:
        threading.Thread.join(t, _JOIN_S)  # Orbax's own join re-raises the CancelledError we caused
        if not t.is_alive():
            _close_coroutines(getattr(t, "_target", None))
    return len(stuck)


def _close_coroutines(func: object, depth: int = 0) -> None:
    """Close the coroutines a cancelled thread never ran (else Python warns "never awaited" at exit)."""
    for cell in getattr(func, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.iscoroutine(value):
            value.close()
        elif callable(value) and depth < 3:
            _close_coroutines(value, depth + 1)


class QuietFailedSaves(logging.Filter):
    """Orbax logs a full traceback per failed writer thread; maxckpt raises one clear error instead.

    The record stays (one line, at its level); only the traceback goes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.name == "absl" and "orbax" in (record.pathname or ""):
            message = record.getMessage()
            if any(part in message for part in _FAILED_SAVE_MESSAGES):
                record.exc_info = None
                record.exc_text = None
        return True


_FAILED_SAVE_MESSAGES = ("raised an exception", "Failed to run", "(save_finalize) failed")
_QUIET = QuietFailedSaves()
logging.getLogger("absl").addFilter(_QUIET)

# Savers that want a last word before the interpreter joins the writer threads.
_AT_EXIT: weakref.WeakSet = weakref.WeakSet()
_registered = False


def at_exit(saver: object) -> None:
    """Call `saver.at_exit()` when the interpreter exits, before it joins non-daemon threads."""
    global _registered
    _AT_EXIT.add(saver)
    if _registered:
        return
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(_run_exit_hooks)
    except RuntimeError:  # the interpreter is already shutting down
        return
    _registered = True


def _run_exit_hooks() -> None:
    for saver in list(_AT_EXIT):
        try:
            saver.at_exit()  # type: ignore[attr-defined]
        except Exception as err:  # noqa: BLE001 - never raise at exit
            logger.error("maxckpt: at exit: %s", err)


DEFAULT_SAVE_TIMEOUT_S = 3600.0


def save_timeout() -> float:
    """Seconds `wait`/`close` wait for the save in flight to commit (``MAXCKPT_SAVE_TIMEOUT``, default 3600).

    Past it the save counts as failed (CheckpointSaveError). The store's own
    bounds (``MAXCKPT_STORAGE_TIMEOUT``, ``MAXCKPT_STORAGE_RETRIES``, see
    :mod:`maxckpt.storage.retry`) usually end a save to a dead store sooner.
    """
    import os

    from maxckpt.errors import ConfigError

    raw = os.environ.get("MAXCKPT_SAVE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_SAVE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"MAXCKPT_SAVE_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


class SaveTimeout(TimeoutError):
    """The save in flight did not commit within :func:`save_timeout`."""


def wait_bounded(wait: Callable[[], object], timeout: float) -> None:
    """`wait()`, from a daemon thread joined for at most `timeout` s; SaveTimeout past it, its error otherwise."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            wait()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            failure.append(err)

    waiter = threading.Thread(target=run, name="maxckpt-save-wait", daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        raise SaveTimeout(
            f"the save did not commit within {timeout:g} s (MAXCKPT_SAVE_TIMEOUT); the store may be unreachable"
        )
    if failure:
        raise failure[0]
