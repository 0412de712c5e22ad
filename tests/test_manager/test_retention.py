"""Specification of retention: the keep/remove policy, crash-safe deletion, pruning any run directory."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from etils import epath

from maxckpt.errors import ConfigError, MaxckptError
from maxckpt.manager import retention
from maxckpt.manager.retention import (
    KEEP,
    LEAVE,
    REMOVE,
    BackgroundRetention,
    RetentionPolicy,
    delete_checkpoints,
    plan_retention,
    prune,
)
from maxckpt.storage.run_dirs import COMMITTED, DELETING, PARTIAL, RunDir, StepEntry, scan_run_dir
from run_dir_builders import (
    hf_trainer_run,
    maxtext_run,
    megatron_run,
    names,
    specforge_run,
    torchtitan_run,
    writable_copy,
)


def run_of(committed: list[int], partial: list[int] = (), deleting: list[int] = (), pinned=None) -> RunDir:
    entries = [StepEntry(s, epath.Path(f"/r/{s}"), "orbax", COMMITTED) for s in committed]
    entries += [StepEntry(s, epath.Path(f"/r/{s}.orbax-checkpoint-tmp"), "orbax", PARTIAL, "tmp") for s in partial]
    entries += [StepEntry(s, epath.Path(f"/r/{s}.maxckpt-deleting"), "orbax", DELETING, "left over") for s in deleting]
    entries.sort(key=lambda e: e.step)
    return RunDir(epath.Path("/r"), "orbax", tuple(entries), pinned=pinned or {})


def actions(plan) -> dict[str, str]:
    return {d.entry.name: d.action for d in plan.decisions}


# --- the policy ----------------------------------------------------------------------------


def test_keeps_the_newest_n_committed() -> None:
    plan = plan_retention(run_of([100, 200, 300, 400]), RetentionPolicy(keep=2))
    assert [e.step for e in plan.keep] == [300, 400]
    assert [e.step for e in plan.remove] == [100, 200]


def test_keep_period_steps_are_kept_forever_on_top_of_the_newest_n() -> None:
    plan = plan_retention(run_of([0, 500, 1000, 1500, 2000, 2500]), RetentionPolicy(keep=2, keep_period=1000))
    assert [e.step for e in plan.keep] == [0, 1000, 2000, 2500]
    assert [e.step for e in plan.remove] == [500, 1500]


def test_partial_steps_are_never_counted_nor_removed_and_leftovers_are() -> None:
    plan = plan_retention(run_of([100, 200], partial=[300, 50], deleting=[10]), RetentionPolicy(keep=1))
    assert actions(plan) == {
        "10.maxckpt-deleting": REMOVE,
        "50.orbax-checkpoint-tmp": LEAVE,
        "100": REMOVE,
        "200": KEEP,  # the in-flight 300 does not count: 200 is the newest committed
        "300.orbax-checkpoint-tmp": LEAVE,
    }


def test_no_limit_keeps_everything_and_pinned_entries_survive() -> None:
    assert plan_retention(run_of([1, 2, 3]), RetentionPolicy()).remove == ()
    plan = plan_retention(run_of([1, 2, 3], pinned={"1": "tracker points here"}), RetentionPolicy(keep=1))
    assert actions(plan) == {"1": KEEP, "2": REMOVE, "3": KEEP}
    assert plan.decisions[0].reason == "tracker points here"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_policy_rejects_non_positive_numbers(bad) -> None:
    with pytest.raises(ConfigError, match="positive integer"):
        RetentionPolicy(keep=bad)


# --- deleting without ever hurting a reader or training --------------------------------------


def test_a_deletion_killed_midway_leaves_nothing_that_lists_as_a_checkpoint(
    maxtext_fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orbax.checkpoint as ocp

    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")

    def dies_halfway(path: str) -> None:
        os.remove(os.path.join(path, "items", "manifest.ocdbt"))
        raise KeyboardInterrupt  # the process is killed in the middle of the recursive delete

    monkeypatch.setattr(shutil, "rmtree", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        delete_checkpoints(scan_run_dir(root).committed[:1])
    monkeypatch.undo()

    assert "0.maxckpt-deleting" in names(root)
    assert [s.step for s in scan_run_dir(root).committed] == [2, 4, 5]
    # Plain Orbax (what MaxText and a restart use) does not see the half-deleted step either.
    plain = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True))
    assert plain.all_steps() == [2, 4, 5]
    # The next pass finishes the job.
    plan = plan_retention(scan_run_dir(root), RetentionPolicy(keep=10))
    assert delete_checkpoints(plan.remove).failed == {}
    assert names(root) == ["2", "4", "5"]


def test_failed_deletion_warns_once_naming_the_path_and_is_retried(
    maxtext_fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    real_rmtree = shutil.rmtree

    def denied(path: str, *a, **k) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(shutil, "rmtree", denied)
    warned: set = set()
    policy = RetentionPolicy(keep=2)
    with caplog.at_level(logging.WARNING, logger="maxckpt.retention"):
        for _ in range(3):  # three saves in a row hit the same failure
            result = delete_checkpoints(plan_retention(scan_run_dir(root), policy).remove, warned=warned)
    assert len(result.failed) == 2 and result.removed == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "maxckpt.retention"]
    assert len(warnings) == 2  # one per path, not one per attempt
    assert all("PermissionError" in w and "maxckpt-deleting" in w for w in warnings)
    assert [s.step for s in scan_run_dir(root).committed] == [4, 5]

    monkeypatch.setattr(shutil, "rmtree", real_rmtree)  # the disk is fixed: the next pass succeeds
    result = delete_checkpoints(plan_retention(scan_run_dir(root), policy).remove, warned=warned)
    assert result.failed == {} and names(root) == ["4", "5"]


def test_an_entry_someone_else_removed_is_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = torchtitan_run(tmp_path / "ckpt", [1, 2])
    entries = scan_run_dir(root).committed
    shutil.rmtree(root / "step-1")  # another process got there first
    with caplog.at_level(logging.WARNING, logger="maxckpt.retention"):
        result = delete_checkpoints(entries[:1])
    assert result.failed == {} and len(result.removed) == 1
    assert [r for r in caplog.records if r.name == "maxckpt.retention"] == []


def test_a_step_retired_twice_gets_a_fresh_name(tmp_path: Path) -> None:
    root = torchtitan_run(tmp_path / "ckpt", [1])
    (root / "step-1.maxckpt-deleting").mkdir()  # left over from an earlier step-1
    moved = retention.retire(epath.Path(root / "step-1"))
    assert moved.name.startswith("step-1.maxckpt-deleting-") and not (root / "step-1").exists()


# --- pruning any run directory ---------------------------------------------------------------


def test_prune_maxtext_run(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    result = prune(root, keep=1, keep_period=4)
    assert names(root) == ["0", "4", "5"] and result.deletion.failed == {}


def test_prune_dry_run_changes_nothing(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    result = prune(root, keep=1, dry_run=True)
    assert [e.step for e in result.plan.remove] == [0, 2, 4] and result.deletion is None
    assert names(root) == ["0", "2", "4", "5"]


def test_prune_torchtitan_leaves_partials_alone(tmp_path: Path) -> None:
    root = torchtitan_run(tmp_path / "ckpt", [10, 20, 30, 40], partial=(40,))
    prune(root, keep=1)
    assert names(root) == ["step-30", "step-40"]


def test_prune_megatron_never_removes_what_the_tracker_names_nor_what_is_newer(tmp_path: Path) -> None:
    root = megatron_run(tmp_path / "ckpt", [100, 200, 300], tracker=100)  # a user rewound the tracker
    (root / "release").mkdir()
    prune(root, keep=1)
    assert names(root) == ["iter_0000100", "iter_0000200", "iter_0000300", "latest_checkpointed_iteration.txt", "release"]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "100"


def test_prune_megatron_tracker_stays_on_a_kept_iteration(tmp_path: Path) -> None:
    root = megatron_run(tmp_path / "ckpt", [100, 200, 300, 400], tracker=300, partial=(400,))
    prune(root, keep=1)
    assert names(root) == ["iter_0000300", "iter_0000400", "latest_checkpointed_iteration.txt"]
    tracker = int((root / "latest_checkpointed_iteration.txt").read_text())
    assert scan_run_dir(root).step(tracker) is not None


def test_prune_specforge_and_hf_trainer(tmp_path: Path) -> None:
    sf = specforge_run(tmp_path / "sf", [(0, 100), (0, 200), (1, 300)])
    prune(sf, keep=2)
    assert names(sf) == ["epoch_0_step_200", "epoch_1_step_300"]
    hf = hf_trainer_run(tmp_path / "hf", [10, 20, 30, 40], best=20)
    (hf / "runs").mkdir()
    prune(hf, keep=1)
    assert names(hf) == ["checkpoint-20", "checkpoint-40", "runs"]


def test_prune_refuses_a_folder_without_recognisable_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "model.bin").write_text("x")
    with pytest.raises(MaxckptError, match="holds no checkpoints maxckpt recognises.*data, model.bin"):
        prune(tmp_path, keep=1)
    assert names(tmp_path) == ["data", "model.bin"]


def test_prune_points_a_maxtext_run_folder_at_its_checkpoints(maxtext_fixtures: Path, tmp_path: Path) -> None:
    maxtext_run(maxtext_fixtures, tmp_path / "run" / "checkpoints")
    with pytest.raises(MaxckptError, match="did you mean .*run/checkpoints"):
        prune(tmp_path / "run", keep=1)


# --- in the background of a training run --------------------------------------------------


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_background_retention_deletes_only_after_the_new_step_commits(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {0: 0, 2: 2, 4: 4})
    in_flight = writable_copy(root / "4", root / "6.orbax-checkpoint-tmp")
    (in_flight / "commit_success.txt").unlink()
    worker = BackgroundRetention(root, RetentionPolicy(keep=1))
    try:
        worker.notify_saved(6)
        time.sleep(0.5)  # the worker is polling for step 6's commit meanwhile
        assert names(root) == ["0", "2", "4", "6.orbax-checkpoint-tmp"]
        (in_flight / "commit_success.txt").write_text("Checkpoint commit was successful.")
        os.rename(in_flight, root / "6")  # Orbax's commit: rename, marker inside
        wait_until(lambda: names(root) == ["6"])
    finally:
        worker.close()


def test_background_retention_moves_crashed_saves_aside_at_start(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {4: 4})
    writable_copy(root / "4", root / "5.orbax-checkpoint-tmp")
    worker = BackgroundRetention(root, RetentionPolicy(keep=3))
    try:
        moved = worker.retire_partials()
        assert [p.name for p in moved] == ["5.orbax-checkpoint-tmp.maxckpt-deleting"]
        assert not (root / "5.orbax-checkpoint-tmp").exists()  # gone before any new save of step 5
        worker.flush()
        assert names(root) == ["4"]
    finally:
        worker.close()


def test_inactive_background_retention_never_touches_the_disk(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    writable_copy(root / "4", root / "9.orbax-checkpoint-tmp")
    worker = BackgroundRetention(root, RetentionPolicy(keep=1), active=False)
    assert worker.retire_partials() == []
    worker.notify_saved(5)
    worker.flush()
    worker.close()
    assert names(root) == ["0", "2", "4", "5", "9.orbax-checkpoint-tmp"]


def test_a_failing_commit_check_never_ends_background_retention(
    maxtext_fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {0: 0, 2: 2, 4: 4})
    path_type = type(epath.Path(root))
    real_exists = path_type.exists
    failed = []

    def flaky_exists(self) -> bool:  # an object store's transient error, once
        if self.name == "commit_success.txt" and not failed:
            failed.append(os.fspath(self))
            raise OSError(5, "Input/output error", os.fspath(self))
        return real_exists(self)

    monkeypatch.setattr(path_type, "exists", flaky_exists)
    worker = BackgroundRetention(root, RetentionPolicy(keep=1))
    try:
        worker.notify_saved(4)
        wait_until(lambda: names(root) == ["4"])
        assert failed == [os.fspath(root / "4" / "commit_success.txt")]
    finally:
        worker.close()
