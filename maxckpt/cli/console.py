"""Shared rich consoles: results to stdout, progress and errors to stderr.

When output is piped (CI logs, `| less`) rich would wrap tables at 80 columns
and cut paths; a wider default keeps paths whole unless COLUMNS says otherwise.

Printing is the last, least important part of a command: the work (a
committed conversion, a listing) is done. So output that cannot be written
(stdout on a full disk or `/dev/full`, a closed pipe, a closed descriptor)
is dropped without an error and never changes the exit code
(:func:`lossy_standard_streams`, :func:`reopen_closed_standard_streams`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, TextIO

from rich.console import Console


def _width(stream: TextIO | None) -> int | None:
    if os.environ.get("COLUMNS") or (stream is not None and stream.isatty()):
        return None
    return 160


# emoji=False: user text such as a path holding `:x:` must print as written. Markup stays on for
# maxckpt's own styles; every user string is passed through rich.markup.escape (or Text) first.
# No file is given: both consoles write to whatever sys.stdout / sys.stderr is when they print.
console = Console(width=_width(sys.stdout), emoji=False)
err_console = Console(stderr=True, width=_width(sys.stderr), emoji=False)


class LossyStream:
    """A standard stream whose first failed write (ENOSPC, EPIPE, EIO, EBADF) silences it for good.

    Why: an OSError from printing a report would abort a command whose work
    had succeeded (and exit 1 with a traceback). After the failure its file
    descriptor is pointed at /dev/null, so what is still buffered, and the
    interpreter's own flush at exit, go nowhere instead of failing again.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                return self._stream.write(text)
            except OSError:
                self._silence()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._stream.flush()
            except OSError:
                self._silence()

    def _silence(self) -> None:
        self.failed = True
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):  # an in-memory stream (tests): nothing buffered below it
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # the buffered rest now goes to /dev/null

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno...: those of the real stream
        return getattr(self._stream, name)


@contextlib.contextmanager
def lossy_standard_streams() -> Iterator[None]:
    """Run a command with sys.stdout and sys.stderr wrapped in :class:`LossyStream` (restored after)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None else LossyStream(s) for s in saved)  # type: ignore[assignment]
    try:
        yield
    finally:
        for wrapped in (sys.stdout, sys.stderr):
            if isinstance(wrapped, LossyStream):
                wrapped.flush()
        sys.stdout, sys.stderr = saved


def reopen_closed_standard_streams() -> None:
    """Put /dev/null on descriptors 0-2 when the command was started with them closed (`maxckpt ls >&-`).

    Why: the next file maxckpt opened would get the free number 1 or 2, and
    anything writing to "stdout" (a C library's log, a child process) would
    write into that file. Python leaves sys.stdout None then; it gets a
    stream on /dev/null, so printing works and goes nowhere.
    """
    streams = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))
    for fd, name, flags, mode in streams:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        opened = os.open(os.devnull, flags)  # the lowest free number: `fd` itself, as lower ones are open
        if opened != fd:
            os.dup2(opened, fd)
            os.close(opened)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))
