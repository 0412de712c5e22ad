"""Helpers of the hostile-input suite: tiny real checkpoints, a file-tree snapshot, a real full/read-only disk.

The snapshot records every entry under a root (name, type, size, mtime,
SHA-256 of files, link targets), so a test can assert that a failed
command changed nothing at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from cli_runner import run_cli
from maxckpt.formats import HFOptions

REPO = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` -> (kind, size, mtime_ns, sha256 or link target)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", st.st_mtime_ns)
            elif not stat.S_ISREG(st.st_mode):  # a FIFO or device: reading it could block
                out[rel] = ("special", st.st_mode, st.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", st.st_size, st.st_mtime_ns, digest)
    return out


def assert_unchanged(before: dict, root: Path) -> None:
    after = snapshot(root)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (added or removed or changed), f"tree changed: added {added[:5]}, removed {removed[:5]}, changed {changed[:5]}"


def one_error_line(code: int, err: str, *expected: str) -> str:
    """The command failed with one `error:` message holding every `expected` text, and no traceback."""
    assert code != 0, err
    assert "Traceback" not in err, err
    flat = " ".join(err.split())
    assert flat.startswith("error: "), err
    assert flat.count("error:") == 1, err
    for text in expected:
        assert text in flat, flat
    return flat


def fails_cleanly(argv, capsys, root: Path, *expected: str) -> str:
    """Run the CLI; it must fail with one error line and leave `root` exactly as it was."""
    before = snapshot(root)
    code, _, err = run_cli(argv, capsys)
    message = one_error_line(code, err, *expected)
    assert_unchanged(before, root)
    return message


def run_subprocess(argv: list[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m maxckpt *argv` in a child process (for crashes a test process must survive)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "maxckpt", *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "2m") -> Iterator[Path]:
    """A real, tiny filesystem mounted at `where` (tests run as root, as CI does); unmounted after.

    Fails loudly (never skips) when it cannot be mounted: the full-disk and
    read-only guarantees are only tested on a real filesystem.
    """
    where.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    assert result.returncode == 0, f"cannot mount a tmpfs at {where} (the suite needs root): {result.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def remount_read_only(where: Path) -> None:
    result = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True, text=True)
    assert result.returncode == 0, f"cannot remount {where} read-only: {result.stderr}"


def build_sources(root: Path) -> Path:
    """Tiny real checkpoints of every format under `root`: run/ (MaxText, step 2), hf/, mega/, titan/, model.pt."""
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    from maxckpt.conversion import convert

    spec = tiny_spec("llama2")
    run = save_maxtext_run(root / "run", random_maxtext_params(spec), step=2).parent
    convert(run, root / "hf", to="hf", model="llama2", options=HFOptions(max_shard_size="30KB"))
    convert(run, root / "mega", to="megatron", model="llama2")
    convert(run, root / "titan", to="torchtitan", model="llama2")
    convert(run, root / "model.pt", to="torch", model="llama2")
    return root
