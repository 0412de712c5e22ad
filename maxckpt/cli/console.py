"""Shared rich consoles: results to stdout, progress and errors to stderr.

When output is piped (CI logs, `| less`) rich would wrap tables at 80 columns
and cut paths; a wider default keeps paths whole unless COLUMNS says otherwise.
"""

import os
import sys

from rich.console import Console


def _width(stream) -> int | None:
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 160


# emoji=False: user text such as a path holding `:x:` must print as written. Markup stays on for
# maxckpt's own styles; every user string is passed through rich.markup.escape (or Text) first.
console = Console(width=_width(sys.stdout), emoji=False)
err_console = Console(stderr=True, width=_width(sys.stderr), emoji=False)
