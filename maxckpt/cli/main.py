"""Entry point: runs the typer app and turns user errors into one clean line.

A :class:`MaxckptError` is something the user can fix, so it is printed
without a traceback and the process exits non-zero. Anything else is a bug in
maxckpt and keeps its full traceback.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
from typing import Sequence

from rich.text import Text

from maxckpt.cli.app import app
from maxckpt.cli.console import err_console, lossy_standard_streams, reopen_closed_standard_streams
from maxckpt.errors import MaxckptError


MAX_ERROR_CHARS = 4000  # a message quoting a huge value must not flood the terminal


def print_error(message: str) -> None:
    """One `error: ...` line on stderr; the message is shown as plain text (no markup, no emoji codes)."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + f"... ({len(message) - MAX_ERROR_CHARS:,} more characters)"
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)


def _terminated(signum, frame) -> None:
    # SIGTERM (a job scheduler, `kill`) unwinds like Ctrl-C, so conversions remove their temporary output.
    raise KeyboardInterrupt


# Collect the youngest generation every 50k new container objects instead of 700, and each
# older one every 20 collections of the one below (CPython's defaults: 700, 10, 10).
COMMAND_GC_THRESHOLDS = (50_000, 20, 20)


def collect_less_often() -> None:
    """Run the cyclic garbage collector less often for the rest of this command's process.

    A command imports torch, JAX and Orbax as it goes; that creates some 300
    thousand long-lived objects, and at CPython's default thresholds the
    collector runs hundreds of times while they are created, several times
    over all of them: 0.4-0.7 s of a 3.7-4.3 s import on a 2-core machine.
    A conversion's own garbage is freed by reference counting (arrays are not
    kept in reference cycles), and cycles are still collected, only in larger
    batches (mypy's command line does the same).
    """
    gc.set_threshold(*COMMAND_GC_THRESHOLDS)


def skip_collection_at_exit() -> None:
    """Spare the interpreter its last garbage collections: the command is done, the process exits.

    At exit CPython collects every generation, walking each object torch, JAX
    and Orbax created at import (about 270 thousand) to free memory the
    operating system is about to take back anyway: over a second on a 2-core
    machine, longer than converting a small checkpoint. Frozen objects are not
    walked. Nothing waits on that walk: every file maxckpt writes is closed,
    and every background save finished, before a command returns.
    """
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI (`argv` defaults to sys.argv[1:]); always exits via SystemExit.

    Run as the `maxckpt` command (no `argv`), the process is the command's, so
    it collects garbage less often (`collect_less_often`) and skips the
    interpreter's final collections (`skip_collection_at_exit`) and puts
    /dev/null on standard descriptors it was started without; a caller that
    passes `argv` keeps its process's collector as it was. Output that cannot
    be written (stdout on a full disk, a closed pipe) is dropped and never
    changes the exit code (see :mod:`maxckpt.cli.console`).
    """
    previous = None
    if argv is None:
        collect_less_often()
        reopen_closed_standard_streams()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        with lossy_standard_streams():  # output that cannot be written never changes the exit code
            try:
                app(args=list(argv) if argv is not None else None, prog_name="maxckpt")
            except MaxckptError as err:
                print_error(str(err))
                sys.exit(err.exit_code)
            except KeyboardInterrupt:
                print_error("interrupted")
                sys.exit(130)
            except Exception as err:  # a storage client's raw error (credentials, network) is the user's to fix
                from maxckpt.storage.retry import client_error

                storage = client_error(err)
                if storage is None:
                    raise
                print_error(str(storage))
                sys.exit(storage.exit_code)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if argv is None:
            skip_collection_at_exit()


if __name__ == "__main__":
    main()
