"""Hostile file systems under CheckpointManager: read-only, going read-only mid-run, full.

Tests run as root, so chmod cannot make a directory unwritable: each test
mounts its own tmpfs (read-only, or tiny) and unmounts it. A machine where
mounting is impossible fails these tests loudly; CI runs as root on the same
kind of machine. Every scenario runs in a child process with a timeout,
because the failure being guarded against is a process that never exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mounts import tmpfs  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parents[1] / "procs" / "hostile_saver.py"
EXIT_WITHIN_S = 90  # a hang is Orbax's 300 s signal timeout per stuck thread


def run_child(directory: Path, action: str, end: str) -> tuple[str, str, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(PROGRAM), str(directory), action, end],
            env=env, capture_output=True, text=True, timeout=EXIT_WITHIN_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the process did not exit within {EXIT_WITHIN_S} s (hung at exit?):\n{err.stdout}\n{err.stderr}")
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "END" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # Orbax's per-thread tracebacks are quieted
    return done.stdout, done.stderr, took


@pytest.mark.slow
@pytest.mark.parametrize("end", ["with", "close"])
def test_read_only_directory_is_refused_at_construction(tmpfs, end: str) -> None:
    ro = tmpfs("ro,size=1m")
    out, _, _ = run_child(ro, "none", end)
    assert f"RAISED CheckpointSaveError: cannot write to the checkpoint directory {ro}: Read-only file system" in out
    assert os.listdir(ro) == []


@pytest.mark.slow
@pytest.mark.parametrize("end", ["with", "close", "wait"])
def test_directory_going_read_only_fails_the_save_and_never_hangs(tmpfs, end: str) -> None:
    point = tmpfs("size=4m")
    out, _, took = run_child(point, "ro", end)
    assert f"RAISED CheckpointSaveError: saving step 0 to {point} failed: OSError: Read-only file system" in out, out
    assert "Committed checkpoints are untouched (no step is committed yet)" in out
    assert took < EXIT_WITHIN_S


@pytest.mark.slow
def test_after_a_failed_save_close_is_quiet_and_the_directory_is_usable_again(tmpfs) -> None:
    point = tmpfs("size=4m")
    out, err, _ = run_child(point, "ro", "recover")
    assert out.count("RAISED CheckpointSaveError") == 1, out
    assert "RECOVERED ['.maxckpt.lock', '5']" in out, out
    assert "no longer running" not in err  # the lock was let go by a live process, not left by a dead one


@pytest.mark.slow
def test_directory_going_read_only_at_interpreter_exit_without_close(tmpfs) -> None:
    point = tmpfs("size=4m")
    out, err, _ = run_child(point, "ro", "exit")
    assert "RAISED" not in out  # nothing waited: the failure is only known at exit
    assert f"maxckpt: saving step 0 to {point} failed: OSError: Read-only file system" in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("end", ["with", "wait", "save", "exit"])
def test_full_disk_during_an_async_save(tmpfs, end: str) -> None:
    point = tmpfs("size=1m")
    out, err, _ = run_child(point, "full", end)
    assert "COMMITTED [0]" in out
    message = f"saving step 1 to {point} failed: ValueError: RESOURCE_EXHAUSTED"
    if end == "exit":
        assert message in err and "No space left on device" in err, err[-3000:]
        return
    assert f"RAISED CheckpointSaveError: {message}" in out and "No space left on device" in out, out
    assert "free space on that file system" in out
    assert "(the newest committed checkpoint is step 0)" in out
    assert "AFTER [0]" in out  # the committed step is still there, still committed
    # The failed save's temporary folder went (it only held a disk's worth of garbage).
    assert sorted(os.listdir(point)) == [".maxckpt.lock", "0"]


# --- one writer per run directory ---------------------------------------------------------


def _state(step: int) -> dict:
    import numpy as np

    return {"params": {"w": np.full((4, 4), step, np.float32)}}


def test_a_second_manager_on_the_same_directory_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    import socket

    from maxckpt import CheckpointManager
    from maxckpt.errors import RunDirBusyError
    from run_dir_builders import tree_snapshot

    root = tmp_path / "ckpt"
    with CheckpointManager(root, async_save=False) as first:
        first.save(0, _state(0))
        # What a save in flight looks like on disk: the second manager's start-up cleanup must not touch it.
        (root / "1.orbax-checkpoint-tmp-1234").mkdir()
        (root / "1.orbax-checkpoint-tmp-1234" / "data").write_bytes(b"in flight")
        before = tree_snapshot(root)
        with pytest.raises(RunDirBusyError) as info:
            CheckpointManager(root, async_save=False)
        assert str(info.value).startswith(
            f"another process (host {socket.gethostname()}, pid {os.getpid()}, since "
        )
        assert f"is saving to {root};" in str(info.value)
        assert tree_snapshot(root) == before
        first.save(2, _state(2))
        assert first.all_steps() == [0, 2]
    with CheckpointManager(root, async_save=False) as again:  # closed: free again
        assert again.all_steps() == [0, 2]
    assert (root / ".maxckpt.lock").read_text() == ""  # a clean stop leaves no owner


def test_a_lock_left_by_a_dead_process_is_taken_over_and_said_so(tmp_path: Path, caplog) -> None:
    import json
    import logging

    from maxckpt import CheckpointManager

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / ".maxckpt.lock").write_text(json.dumps({"host": "node-7", "pid": 999999, "started": 0}))
    with caplog.at_level(logging.WARNING, logger="maxckpt.manager"):
        with CheckpointManager(root, async_save=False) as mgr:
            assert mgr.save(3, _state(3))
            owner = json.loads((root / ".maxckpt.lock").read_text())
            assert owner["pid"] == os.getpid()
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        f"{root} was left locked by host node-7, pid 999999, since 1970-01-01T00:00:00+00:00, which is no longer "
        "running; taking it over" in m for m in messages
    ), messages


def test_a_lock_held_by_another_process_is_refused(tmp_path: Path) -> None:
    from maxckpt import CheckpointManager
    from maxckpt.errors import RunDirBusyError

    root = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from maxckpt.manager.run_lock import RunDirLock; "
         "l = RunDirLock.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(root)],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusyError, match=rf"another process \(host .*, pid {holder.pid}, since .*\) is saving to {root}"):
            CheckpointManager(root, async_save=False)
    finally:
        holder.kill()
        holder.wait()
    with CheckpointManager(root, async_save=False) as mgr:  # its holder died: the kernel freed the lock
        assert mgr.save(0, _state(0))


# --- relative paths -------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_relative_directories_are_made_absolute_once(tmp_path: Path, monkeypatch, async_save: bool) -> None:
    from maxckpt import CheckpointManager
    from manager_states import abstract, assert_same, make_state

    (tmp_path / "work" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work" / "sub")
    with CheckpointManager("../runs/./r1/ckpt", async_save=async_save, max_to_keep=1) as mgr:
        assert os.fspath(mgr.directory) == str(tmp_path / "work" / "runs" / "r1" / "ckpt")
        assert mgr.save(0, make_state(0)) and mgr.save(1, make_state(1))
        mgr.wait()
        assert mgr.all_steps() == [1]
        assert_same(mgr.restore(abstract(make_state(0))), make_state(1))
    monkeypatch.chdir(tmp_path)  # the run moved on: what was written stays where it was said
    assert sorted(os.listdir(tmp_path / "work" / "runs" / "r1" / "ckpt")) == [".maxckpt.lock", "1"]


def test_every_manager_path_of_a_config_is_made_absolute(tmp_path: Path, monkeypatch) -> None:
    from maxckpt import CheckpointManager, load_config
    from maxckpt.config import bundled_configs_dir
    from maxckpt.storage.run_dirs import scan_run_dir
    from manager_states import abstract, assert_same, make_state

    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        bundled_configs_dir() / "emergency_two_tier.yml",
        "base_output_directory=out/../persistent",
        "local_checkpoint_directory=./local",
        "local_checkpoint_period=2",
        "checkpoint_period=5",
    )
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.config.base_output_directory == str(tmp_path / "persistent")
        assert mgr.config.local_checkpoint_directory == str(tmp_path / "local")
        persistent = Path(os.fspath(mgr.directory))
        assert persistent.is_relative_to(tmp_path / "persistent")
        for step in range(6):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [0, 2, 4, 5]
    assert [s.step for s in scan_run_dir(tmp_path / "local").committed] == [2, 4]  # LOCAL_KEEP
    assert not list(tmp_path.glob("**/*orbax-checkpoint-tmp*"))
    # A fresh run starting from that state by a relative load_full_state_path.
    items = os.path.relpath(persistent / "5" / "items", tmp_path)
    assert not os.path.isabs(items)
    fresh = load_config(bundled_configs_dir() / "emergency_two_tier.yml", "base_output_directory=fresh",
                        f"load_full_state_path={items}", "enable_emergency_checkpoint=false")
    with CheckpointManager.from_config(fresh) as mgr:
        assert mgr.config.load_full_state_path == str(persistent / "5" / "items")
        assert_same(mgr.restore(abstract(make_state(0))), make_state(5))


def test_object_store_urls_are_left_as_they_are() -> None:
    from maxckpt.storage.urls import normalize

    assert normalize("gs://bucket/run/../ckpt") == "gs://bucket/run/../ckpt"
    assert normalize("s3://b/x") == "s3://b/x"
    assert os.fspath(normalize("/a/b/../c/")) == "/a/c"


@pytest.mark.parametrize("kind", ["folder", "symlink"])
def test_something_else_where_the_lock_file_goes_is_refused(kind: str, tmp_path: Path) -> None:
    from maxckpt import CheckpointManager
    from maxckpt.errors import CheckpointSaveError
    from run_dir_builders import tree_snapshot

    root = tmp_path / "ckpt"
    root.mkdir()
    if kind == "folder":
        (root / ".maxckpt.lock").mkdir()
    else:
        (tmp_path / "elsewhere").write_text("mine")
        os.symlink(tmp_path / "elsewhere", root / ".maxckpt.lock")
    before = tree_snapshot(tmp_path)
    with pytest.raises(CheckpointSaveError, match=rf"{root / '.maxckpt.lock'} is a {kind}: maxckpt keeps its run-directory lock there"):
        CheckpointManager(root)
    assert tree_snapshot(tmp_path) == before


# --- committed steps whose files are gone ------------------------------------------------------


@pytest.mark.parametrize(
    "gone, expected",
    [
        ("_METADATA", "its _METADATA is missing"),
        ("d", "its d/ (the array data) is missing"),
        ("manifest.ocdbt", "its manifest.ocdbt is missing"),
        ("chunk", "NOT_FOUND: chunk {0, 0}"),
    ],
)
def test_restoring_a_committed_step_whose_files_are_gone_names_it(tmp_path: Path, gone: str, expected: str) -> None:
    import dataclasses
    import shutil

    from maxckpt import CheckpointManager
    from maxckpt.config import CheckpointConfig
    from maxckpt.errors import CorruptCheckpointError
    from maxckpt.manager import pytree_io

    root = tmp_path / "ckpt"
    # "chunk": without OCDBT, one file per chunk
    config = dataclasses.replace(CheckpointConfig(), checkpoint_storage_use_ocdbt=gone != "chunk")
    with CheckpointManager(root, period=1, async_save=False, config=config) as mgr:
        mgr.save(0, _state(0))
        mgr.save(1, _state(1))
    items = root / "1" / "items"
    victim = next((items / "params.w" / "c").rglob("0")) if gone == "chunk" else items / gone
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    # It raised AttributeError: 'NoneType' object has no attribute 'tree'.
    with CheckpointManager(root, async_save=False, config=config) as mgr:
        with pytest.raises(CorruptCheckpointError) as info:
            mgr.restore()
        message = str(info.value)
        assert message.startswith("step 1 (persistent tier) cannot be restored: cannot read the "), message
        assert str(items) in message and expected in message and "other committed steps: [0]" in message, message
        assert "tensorstore_spec" not in message
        assert mgr.restore(step=0)["params"]["w"][0, 0] == 0  # the other step is fine
    with pytest.raises(CorruptCheckpointError, match=rf"cannot read the .* of {items}: "):
        pytree_io.load_params(items, _state(0)["params"])


def test_load_params_without_a_target_is_a_config_error(tmp_path: Path) -> None:
    from maxckpt import CheckpointManager
    from maxckpt.errors import ConfigError
    from maxckpt.manager import pytree_io

    root = tmp_path / "ckpt"
    with CheckpointManager(root, async_save=False) as mgr:
        mgr.save(0, _state(0))
        for target in (None, {}):  # Orbax raised TypeError: Type mismatch at key path ()
            with pytest.raises(ConfigError, match=rf"load_params\({root}/0/items\): the target holds no arrays"):
                pytree_io.load_params(root / "0" / "items", target)
            with pytest.raises(ConfigError, match="the target holds no arrays"):
                mgr.load_params(root / "0", target)
