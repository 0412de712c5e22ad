"""tests/torchtitan_env.py, the installer behind the `torchtitan` fixture: it fails loudly, it never skips.

The TorchTitan tests themselves (test_frameworks_matrix.py)
prove the happy path; these check that a broken pin list or an unreachable
index gives an error naming the cause instead of a silently missing framework.
"""

from __future__ import annotations

import sys

import pytest
import torchtitan_env


@pytest.fixture
def pins(tmp_path, monkeypatch):
    """A pin list of our own and an empty cache, so nothing touches .cache/torchtitan."""
    path = tmp_path / "torchtitan-cpu.txt"
    monkeypatch.setattr(torchtitan_env, "REQUIREMENTS", path)
    monkeypatch.setenv("MAXCKPT_TORCHTITAN_CACHE", str(tmp_path / "cache"))
    return path


def test_the_shipped_pin_list_pins_every_package_and_torchtitan_030():
    pins = torchtitan_env.pinned()
    assert pins["torchtitan"] == "0.3.0" and "triton" in pins
    assert "torch" not in pins and "fsspec" not in pins  # never replaces what the project's environment holds


def test_an_unpinned_requirement_is_refused(pins):
    pins.write_text("torchtitan==0.3.0\ntyro\n")
    with pytest.raises(RuntimeError, match=r"'tyro' is not pinned as name==version"):
        torchtitan_env.torchtitan_site()


def test_a_list_without_torchtitan_030_is_refused(pins):
    pins.write_text("torchtitan==0.2.2\n")
    with pytest.raises(RuntimeError, match=r"must pin torchtitan==0.3.0"):
        torchtitan_env.torchtitan_site()


def test_an_install_pip_cannot_do_fails_with_pips_reason(pins, tmp_path, monkeypatch):
    """No index and an empty wheel folder: the real pip fails, and the error says so and what to do."""
    pins.write_text("torchtitan==0.3.0\n")
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    with pytest.raises(RuntimeError) as info:
        torchtitan_env.torchtitan_site()
    message = str(info.value)
    assert "installing TorchTitan 0.3.0 for the tests failed" in message
    assert "No matching distribution found for torchtitan==0.3.0" in message
    assert "need PyPI" in message
    assert not list((tmp_path / "cache").glob("*/" + torchtitan_env._MARKER))  # nothing marked as installed
    assert str(tmp_path / "cache") not in sys.path
