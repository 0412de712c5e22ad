"""Specification of two-tier checkpointing: frequent local saves, periodic persistent ones, newest wins."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from maxckpt import CheckpointManager, load_config
from maxckpt.config import bundled_configs_dir
from maxckpt.storage.run_dirs import scan_run_dir
from manager_states import assert_same, make_state


def steps_in(path: Path) -> list[int]:
    return [s.step for s in scan_run_dir(path, "orbax").committed]


def test_two_tier_saves_both_tiers_and_restores_the_newest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(
        bundled_configs_dir() / "emergency_two_tier.yml",
        f"base_output_directory={tmp_path}/persistent",
        f"local_checkpoint_directory={tmp_path}/local",
        "local_checkpoint_period=2",
        "checkpoint_period=5",
        "max_num_checkpoints_to_keep=2",
    )
    persistent, local = Path(cfg.checkpoint_dir), tmp_path / "local"
    caplog.set_level(logging.INFO, logger="maxckpt.manager")
    with CheckpointManager.from_config(cfg) as mgr:
        for step in range(11):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert steps_in(local) == [8, 10]  # every 2nd step, newest 2 kept
        assert steps_in(persistent) == [5, 10]  # every 5th step, max_num_checkpoints_to_keep=2
        assert mgr.all_steps() == [5, 8, 10] and mgr.latest_step() == 10
        assert_same(mgr.restore(make_state(0)), make_state(10))
        assert "step 10 from the local tier" in caplog.text  # a tie reads the faster copy

        mgr.save(11, make_state(11), final=True)  # the final save goes to persistent storage
        assert steps_in(persistent) == [10, 11] and steps_in(local) == [8, 10]
        assert_same(mgr.restore(make_state(0)), make_state(11))
        assert "step 11 from the persistent tier" in caplog.text

        mgr.save(12, make_state(12))
        mgr.wait()
        assert_same(mgr.restore(make_state(0)), make_state(12))
        assert "step 12 from the local tier" in caplog.text

    shutil.rmtree(local)  # the node (and its local disk) is gone: resume from persistent storage
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.latest_step() == 11
        assert_same(mgr.restore(make_state(0)), make_state(11))
        assert mgr.restored_step == 11
