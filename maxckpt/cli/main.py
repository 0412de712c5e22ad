"""Entry point: runs the typer app and turns user errors into one clean line.

A :class:`MaxckptError` is something the user can fix, so it is printed
without a traceback and the process exits non-zero. Anything else is a bug in
maxckpt and keeps its full traceback.
"""

from __future__ import annotations

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


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI (`argv` defaults to sys.argv[1:]); always exits via SystemExit."""
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


if __name__ == "__main__":
    main()
