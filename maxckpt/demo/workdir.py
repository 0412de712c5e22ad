"""The demo's output directory: created with a marker, reused on re-runs, never clobbered otherwise.

`maxckpt demo --dir DIR` writes only inside DIR. A directory that exists,
is not empty and lacks the marker file is someone else's: the demo refuses
it rather than deleting anything. A directory with the marker is a previous
demo run: its outputs are removed and the demo starts over (the JAX
compilation cache is kept, so re-runs start faster).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from maxckpt.errors import MaxckptError

MARKER = ".maxckpt-demo"
RUN_NAME = "demo_run"
JAX_CACHE = ".jax_cache"
LOGS = "logs"
SUMMARY = "summary.json"
# What a demo run creates beside the marker (removed before a re-run).
_OUTPUTS = (RUN_NAME, LOGS, SUMMARY)


def prepare(directory: str | Path) -> Path:
    """Make `directory` ready for a demo run and return its absolute path.

    >>> import tempfile, os
    >>> d = prepare(os.path.join(tempfile.mkdtemp(), "demo"))
    >>> (d / MARKER).is_file()
    True
    """
    root = Path(directory).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise MaxckptError(f"--dir {root} is a file; pass a directory for the demo's output")
    if root.is_dir() and any(root.iterdir()) and not (root / MARKER).is_file():
        raise MaxckptError(
            f"--dir {root} exists and is not a maxckpt demo directory (no {MARKER} file in it); "
            "the demo will not write into it. Pass a new or empty directory with --dir"
        )
    root.mkdir(parents=True, exist_ok=True)
    for name in _OUTPUTS:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (root / MARKER).write_text("Output of `maxckpt demo`; re-running the demo replaces everything here.\n")
    (root / LOGS).mkdir()
    return root
