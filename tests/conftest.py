"""Shared fixtures: paths to the real MaxText-written checkpoints and the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]



def _fixtures_root() -> Path:
    """$MAXCKPT_FIXTURES, else the project's shared/fixtures beside the checkout, else the copy in tests/."""
    for candidate in (os.environ.get("MAXCKPT_FIXTURES"), REPO.parent / "shared" / "fixtures", REPO / "tests" / "fixtures"):
        if candidate and (Path(candidate) / "maxtext").is_dir():
            return Path(candidate).resolve()
    return (REPO / "tests" / "fixtures").resolve()


FIXTURES = _fixtures_root()
MAXTEXT_FIXTURES = FIXTURES / "maxtext"


@pytest.fixture
def maxtext_fixtures() -> Path:
    """The read-only MaxText-written checkpoints (skip when this checkout has none)."""
    if not MAXTEXT_FIXTURES.is_dir():
        pytest.skip(f"MaxText fixtures not found at {MAXTEXT_FIXTURES} (set MAXCKPT_FIXTURES)")
    return MAXTEXT_FIXTURES

@pytest.fixture(scope="session")
def torchtitan():
    """The real TorchTitan 0.3.0, installed once into .cache/torchtitan (tests/torchtitan_env.py).

    Fails the test, never skips it, when it cannot be installed or imported.
    """
    from torchtitan_env import import_torchtitan

    try:
        return import_torchtitan()
    except RuntimeError as exc:
        reason = str(exc)
    pytest.fail(f"the real TorchTitan is not available: {reason}", pytrace=False)


# Real GCS (fake-gcs-server) and S3 (moto) servers for the object-store tests.
from object_stores import bucket_url, object_stores  # noqa: E402,F401
