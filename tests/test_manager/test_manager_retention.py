"""Specification of retention inside a training run: after commit, in the background, never fatal.

Orbax 0.12.8's own deletion, when one old step cannot be removed, raises from
the next `wait_until_finished()` and drops the new step from `all_steps()`.
These tests inject that failure into maxckpt's deleter and check that
training never notices.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
from etils import epath

from maxckpt import CheckpointManager
from maxckpt.manager import pytree_io
from maxckpt.storage.run_dirs import scan_run_dir
from manager_states import assert_same, make_state


def committed_on_disk(root: Path) -> list[int]:
    return [s.step for s in scan_run_dir(root, "orbax").committed]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_keeps_newest_n_plus_every_kth(tmp_path: Path, async_save: bool) -> None:
    with CheckpointManager(tmp_path / "ckpt", max_to_keep=2, keep_period=4, async_save=async_save) as mgr:
        for step in range(10):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [0, 4, 8, 9]
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".maxckpt.lock", "0", "4", "8", "9"]


def test_failed_deletions_never_reach_training_and_are_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    real_rmtree = shutil.rmtree
    broken = threading.Event()
    broken.set()
    seen_committed: list[int] = []

    def flaky_rmtree(path, *args, **kwargs):
        seen_committed.append(len(committed_on_disk(root)))
        if broken.is_set():
            raise PermissionError(13, "Permission denied", str(path))
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", flaky_rmtree)
    with caplog.at_level(logging.WARNING, logger="maxckpt.retention"):
        with CheckpointManager(root, max_to_keep=2, async_save=True) as mgr:
            for step in range(6):
                assert mgr.save(step, make_state(step))  # never raises
            mgr.wait()  # never raises either (Orbax's own deletion would, here)
            assert mgr.all_steps() == [4, 5]  # the newest step is listed (Orbax's would drop it)
            assert_same(mgr.restore(make_state(0)), make_state(5))
            leftovers = sorted(n for n in os.listdir(root) if "maxckpt-deleting" in n)
            assert leftovers == [f"{s}.maxckpt-deleting" for s in range(4)]
            warnings = [r.getMessage() for r in caplog.records if r.name == "maxckpt.retention"]
            assert len(warnings) == 4 and all("Permission denied" in w for w in warnings)
            assert {w.split(" could not remove ")[1].split(" ")[0] for w in warnings} == {
                os.fspath(root / str(s)) for s in range(4)
            }
            broken.clear()  # the disk is fixed: the next save's pass cleans up
            mgr.save(6, make_state(6))
            mgr.wait()
    assert sorted(os.listdir(root)) == [".maxckpt.lock", "5", "6"]
    assert min(seen_committed) >= 2  # nothing was deleted while fewer than max_to_keep were committed


def test_someone_else_deleting_first_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def already_gone(path, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(shutil, "rmtree", already_gone)
    with caplog.at_level(logging.WARNING, logger="maxckpt.retention"):
        with CheckpointManager(tmp_path / "ckpt", max_to_keep=1, async_save=False) as mgr:
            for step in range(3):
                mgr.save(step, make_state(step))
            mgr.wait()
            assert mgr.all_steps() == [2]
    assert [r for r in caplog.records if r.name == "maxckpt.retention"] == []


def test_a_slow_deletion_never_blocks_the_training_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_rmtree = shutil.rmtree
    release = threading.Event()
    deleting = threading.Event()

    def stuck_rmtree(path, *args, **kwargs):
        deleting.set()
        assert release.wait(timeout=60), "test never released the deletion"
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", stuck_rmtree)
    with CheckpointManager(tmp_path / "ckpt", max_to_keep=1, async_save=True) as mgr:
        mgr.save(0, make_state(0))
        mgr.save(1, make_state(1))
        assert deleting.wait(timeout=60)  # retention is now stuck inside a deletion...
        for step in range(2, 6):  # ...and training keeps saving regardless
            assert mgr.save(step, make_state(step))
        release.set()
        mgr.wait()
        assert mgr.all_steps() == [5]


def test_a_crashed_runs_partial_steps_are_cleared_on_restart(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with CheckpointManager(root, async_save=False) as mgr:
        mgr.save(3, make_state(3))
    shutil.copytree(root / "3", root / "4.orbax-checkpoint-tmp")  # a save that was killed
    (root / "4.orbax-checkpoint-tmp" / "commit_success.txt").unlink()
    with CheckpointManager(root, async_save=False) as mgr:
        assert mgr.latest_step() == 3
        assert_same(mgr.restore(make_state(0)), make_state(3))
        assert mgr.save(4, make_state(4))  # the same step again, written cleanly
        mgr.wait()
        assert mgr.all_steps() == [3, 4]
    assert sorted(os.listdir(root)) == [".maxckpt.lock", "3", "4"]


def test_a_step_folder_without_the_commit_marker_is_never_removed(tmp_path: Path) -> None:
    # An Orbax old enough not to write commit_success.txt on local disks leaves exactly this after a
    # complete save (and Orbax lists it as a checkpoint): maxckpt does not count it, nor delete it.
    root = tmp_path / "ckpt"
    with CheckpointManager(root, async_save=False) as mgr:
        mgr.save(3, make_state(3))
    shutil.copytree(root / "3", root / "2")
    (root / "2" / "commit_success.txt").unlink()
    with CheckpointManager(root, max_to_keep=1, async_save=False) as mgr:
        for step in (4, 5):
            assert mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [5]
    assert sorted(os.listdir(root)) == [".maxckpt.lock", "2", "5"]
    assert_same(pytree_io.restore_tree(epath.Path(root / "2" / "items"), make_state(0)), make_state(3))
