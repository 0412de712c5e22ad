"""The Python 3.12 environment in which the MaxText tests run MaxText's real trainer.

MaxText 0.2.5 needs Python >= 3.12 while the rest of the suite runs on the
project's own interpreter, so the tests build a separate venv once and reuse
it: `requirements/maxtext-cpu.txt` installed with `pip install --no-deps`
(MaxText's wheel declares no base dependencies; its extras pull CUDA/TPU
stacks, tensorflow and torch). The venv lives in `.cache/maxtext-venv/<key>`
(gitignored; `$MAXCKPT_MAXTEXT_VENV_CACHE` moves it), keyed by a hash of the
requirement file and the interpreter, so a changed list builds a new one.
maxckpt is not installed into it: runs get `PYTHONPATH=<checkout>`.

Python 3.12 is looked for as `$MAXCKPT_PYTHON312`, `python3.12` on PATH,
pyenv's versions, the usual system paths, then `uv python find 3.12`. If
none is found, :func:`maxtext_python` raises: the MaxText tests fail, they
never skip.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements" / "maxtext-cpu.txt"
_BUILDER_VERSION = "1"


def _is_python312(candidate: str) -> bool:
    try:
        out = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def find_python312() -> str:
    """A working Python 3.12 interpreter, or RuntimeError saying where it looked."""
    candidates = [os.environ.get("MAXCKPT_PYTHON312", ""), shutil.which("python3.12") or ""]
    home = Path.home()
    candidates += sorted(glob.glob(str(home / ".pyenv/versions/3.12*/bin/python3.12")), reverse=True)
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"), reverse=True)
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12", "/opt/python/3.12/bin/python3.12"]
    uv = shutil.which("uv")
    if uv:
        found = subprocess.run([uv, "python", "find", "3.12"], capture_output=True, text=True)
        if found.returncode == 0:
            candidates.append(found.stdout.strip())
    for candidate in candidates:
        if candidate and _is_python312(candidate):
            return candidate
    raise RuntimeError(
        "no Python 3.12 found for the MaxText tests (MaxText 0.2.5 needs Python >= 3.12): looked at "
        "$MAXCKPT_PYTHON312, python3.12 on PATH, ~/.pyenv/versions/3.12*, /usr/bin, /usr/local/bin and `uv python find`; "
        "install one (e.g. apt-get install python3.12, or pip install uv && uv python install 3.12) "
        "or point $MAXCKPT_PYTHON312 at it"
    )


def _cache_root() -> Path:
    return Path(os.environ.get("MAXCKPT_MAXTEXT_VENV_CACHE", REPO / ".cache" / "maxtext-venv"))


def maxtext_python() -> Path:
    """The venv's python, built on first use (a few minutes), reused after."""
    base = find_python312()
    version = subprocess.run([base, "-c", "import sys; print(sys.version)"], capture_output=True, text=True).stdout
    key = hashlib.sha256((REQUIREMENTS.read_text() + version + _BUILDER_VERSION).encode()).hexdigest()[:16]
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / key
    python = venv / "bin" / "python"
    marker = venv / "maxckpt-venv-complete.json"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (pytest-xdist, parallel checkouts)
        if marker.is_file():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted build
        start = time.time()
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        result = subprocess.run([*pip, "--no-deps", "-r", str(REQUIREMENTS)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the MaxText venv in {venv} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        check = subprocess.run(
            [str(python), "-c", "import maxtext.trainers.pre_train.train"], capture_output=True, text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"MaxText does not import in {venv}:\n{check.stderr[-4000:]}")
        size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
        marker.write_text(json.dumps({"seconds": round(time.time() - start, 1), "bytes": size, "python": base}))
        return python


def run_env() -> dict[str, str]:
    """Environment for a process of the venv: this checkout's maxckpt, CPU JAX, quiet TF-less logging."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("PYTHONHOME", None)
    return env


if __name__ == "__main__":  # python tests/maxtext_env.py: build (or find) it and print where
    path = maxtext_python()
    print(path)
    print((path.parent.parent / "maxckpt-venv-complete.json").read_text())
    sys.exit(0)
