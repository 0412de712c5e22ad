"""Entry point: runs the typer app and turns user errors into one clean line.

A :class:`MaxckptError` is something the user can fix, so it is printed
without a traceback and the process exits non-zero. Anything else is a bug in
maxckpt and keeps its full traceback.
"""

from __future__ import annotations

import sys
from typing import Sequence

from rich.markup import escape

from maxckpt.cli.app import app
from maxckpt.cli.console import err_console
from maxckpt.errors import MaxckptError


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI (`argv` defaults to sys.argv[1:]); always exits via SystemExit."""
    try:
        app(args=list(argv) if argv is not None else None, prog_name="maxckpt")
    except MaxckptError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
