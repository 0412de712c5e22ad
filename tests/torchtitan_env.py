"""The real TorchTitan 0.3.0 for the tests that load maxckpt's TorchTitan output into its models.

TorchTitan is not part of `pip install -e '.[all]'`: its declared
dependencies (datasets, pyarrow, wandb, tensorboard, torchdata) are for
training, and datasets pins an fsspec older than the one gcsfs/s3fs need, so
installing it into the project's environment would break the object stores.
Instead the tests install the few packages its model and checkpoint code
import, `requirements/torchtitan-cpu.txt`, with `pip install --no-deps
--target` into `.cache/torchtitan/<key>` (gitignored; `$MAXCKPT_TORCHTITAN_CACHE`
moves it) once, keyed by a hash of that list and the interpreter, and append
that folder to `sys.path`. Appending, not prepending: nothing in it can
shadow a package of the environment (torch stays the environment's 2.13.0).

A lock file lets parallel pytest processes share one build. If pip cannot
install the list (no index, a yanked wheel) or TorchTitan does not import
afterwards, :func:`import_torchtitan` raises: the tests fail, they never skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements" / "torchtitan-cpu.txt"
VERSION = "0.3.0"
# What the tests import; checked in a fresh interpreter before the folder is used.
IMPORTS = (
    "torchtitan.components.checkpointer.base",
    "torchtitan.models.common",
    "torchtitan.models.common.moe",
    "torchtitan.models.llama3",
    "torchtitan.models.qwen3",
    "torchtitan.models.deepseek_v3",
    "torchtitan.models.gpt_oss",
)
_BUILDER_VERSION = "1"
_MARKER = "maxckpt-torchtitan-complete.json"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned() -> dict[str, str]:
    """`requirements/torchtitan-cpu.txt` as {normalized name: version}; every line must be `name==version`."""
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise RuntimeError(f"{REQUIREMENTS}: {line!r} is not pinned as name==version")
        pins[_normalize(name)] = version.strip()
    return pins


def cache_root() -> Path:
    return Path(os.environ.get("MAXCKPT_TORCHTITAN_CACHE", REPO / ".cache" / "torchtitan"))


def _key() -> str:
    ident = REQUIREMENTS.read_text() + sys.version + platform.machine() + _BUILDER_VERSION
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _installed(folder: Path) -> dict[str, str]:
    """{normalized name: version} of the distributions pip put in `folder`."""
    found = {}
    for info in folder.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        found[_normalize(name)] = version
    return found


def _check_imports(folder: Path) -> None:
    """Import what the tests use in a fresh interpreter with `folder` appended, as the tests do."""
    code = (
        "import sys, importlib, torch; before = torch.__version__; "
        f"sys.path.append({str(folder)!r}); "
        f"[importlib.import_module(m) for m in {IMPORTS!r}]; "
        "import torchtitan; "
        f"assert torchtitan.__file__.startswith({str(folder)!r}), 'torchtitan came from ' + torchtitan.__file__; "
        f"assert not torch.__file__.startswith({str(folder)!r}) and torch.__version__ == before"
    )
    check = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if check.returncode != 0:
        raise RuntimeError(f"TorchTitan {VERSION} does not import from {folder}:\n{check.stderr[-4000:]}")


def torchtitan_site() -> Path:
    """The folder holding TorchTitan and its pinned imports, installed on first use (~1 GB, triton), reused after."""
    pins = pinned()
    if pins.get("torchtitan") != VERSION:
        raise RuntimeError(f"{REQUIREMENTS} must pin torchtitan=={VERSION} (the release these tests are written for)")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = _key()
    site = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (pytest-xdist, parallel checkouts)
        if (site / _MARKER).is_file():
            return site
        partial = root / f"{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted install
        shutil.rmtree(site, ignore_errors=True)
        start = time.time()
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--no-deps", "--target", str(partial), "-r", str(REQUIREMENTS)]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"installing TorchTitan into {partial} took over 30 minutes: {' '.join(cmd)}") from exc
        if result.returncode != 0:
            raise RuntimeError(
                f"installing TorchTitan {VERSION} for the tests failed ({' '.join(cmd)}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n"
                "the TorchTitan tests need PyPI (or a mirror pip is configured for) once; "
                f"after that they reuse {root}"
            )
        got = _installed(partial)
        if got != pins:  # --no-deps: exactly the list, nothing pulled in beside it (no torch, no fsspec)
            raise RuntimeError(f"pip installed {got} into {partial}, expected exactly {pins} from {REQUIREMENTS}")
        _check_imports(partial)
        size = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file() and not f.is_symlink())
        (partial / _MARKER).write_text(json.dumps({"seconds": round(time.time() - start, 1), "bytes": size, "pins": pins}))
        partial.rename(site)
        return site


def import_torchtitan() -> ModuleType:
    """`torchtitan` 0.3.0 from the cached folder (built if needed), with that folder appended to sys.path."""
    site = str(torchtitan_site())
    if site not in sys.path:
        sys.path.append(site)
    try:
        module = importlib.import_module("torchtitan")
    except ImportError as exc:
        raise RuntimeError(f"torchtitan does not import from {site} ({exc}); delete that folder to reinstall it") from exc
    if module.__version__ != VERSION:
        raise RuntimeError(
            f"torchtitan {module.__version__} from {module.__file__} shadows the pinned {VERSION} in {site}; "
            "uninstall it from this environment"
        )
    return module


if __name__ == "__main__":  # python tests/torchtitan_env.py: install (or find) it and print where
    folder = torchtitan_site()
    print(folder)
    print((folder / _MARKER).read_text())
