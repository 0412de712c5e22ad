"""A tmpfs per test, for file systems chmod cannot fake: tests run as root, so only a read-only
or full mount makes a directory really unwritable. Import the fixture: `from mounts import tmpfs`.

Mounting needs root (CI runs as root on the same kind of machine): where it is impossible the
tests fail loudly rather than skip, since a skipped hostile-input test proves nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path: Path):
    """mount(options) -> a fresh tmpfs at a new folder; remount(point, options); all undone at teardown."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
        assert done.returncode == 0, f"these tests need to mount a tmpfs (run as root): {done.stderr.strip()}"
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


def remount(point: Path, options: str) -> None:
    done = subprocess.run(["mount", "-o", f"remount,{options}", str(point)], capture_output=True, text=True)
    assert done.returncode == 0, f"cannot remount {point} {options}: {done.stderr.strip()}"
