"""Run the `maxckpt` CLI in-process exactly as the console script does."""

from __future__ import annotations

from typing import Sequence

import pytest

from maxckpt.cli.main import main


def run_cli(argv: Sequence[object], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `maxckpt *argv`; paths may be given as Path objects."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    code = info.value.code
    return (0 if code is None else int(code)), out, err
