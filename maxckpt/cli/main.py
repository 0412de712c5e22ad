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
from maxckpt.cli.console import err_console
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

    Run as the `maxckpt` command (no `argv`), the process ends with the command,
    so it skips the interpreter's final collections (`skip_collection_at_exit`);
    a caller that passes `argv` keeps its process as it was.
    """
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        app(args=list(argv) if argv is not None else None, prog_name="maxckpt")
    except MaxckptError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(130)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if argv is None:
            skip_collection_at_exit()


if __name__ == "__main__":
    main()
