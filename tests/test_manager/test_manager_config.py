"""Specification of the config keys CheckpointManager honours, through MaxText-style overlays."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax
import pytest

from maxckpt import CheckpointManager, load_config
from maxckpt.config import bundled_configs_dir
from maxckpt.errors import CheckpointNotFoundError, ConfigError, ShapeMismatchError
from maxckpt.manager import pytree_io
from maxckpt.manager.retention import RetentionPolicy
from manager_states import abstract, assert_same, make_state

CONFIGS = bundled_configs_dir()


def overlay(tmp_path: Path, name: str, *overrides: str):
    return load_config(CONFIGS / name, f"base_output_directory={tmp_path}", *overrides)


def test_from_config_uses_the_run_directory_period_and_retention(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "checkpoint_period=2", "max_num_checkpoints_to_keep=2")
    with CheckpointManager.from_config(cfg) as mgr:
        assert os.fspath(mgr.directory) == os.fspath(tmp_path / "keep_last_n" / "checkpoints")
        for step in range(9):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [6, 8]
    assert sorted(os.listdir(tmp_path / "keep_last_n" / "checkpoints")) == [".maxckpt.lock", "6", "8"]


def test_keep_period_overlay_archives_every_kth_step(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_period_archival.yml", "checkpoint_period=1", "maxckpt_keep_period=3")
    with CheckpointManager.from_config(cfg) as mgr:
        for step in range(8):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [0, 3, 6, 7]


def test_disabled_checkpointing_saves_nothing_and_creates_nothing(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "enable_checkpointing=false")
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.save(0, make_state(0), force=True) is False
        assert mgr.restore(abstract(make_state(0))) is None
        assert mgr.all_steps() == [] and mgr.latest_step() is None
    assert not (tmp_path / "keep_last_n").exists()


def test_no_directory_is_a_config_error(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "base.yml")
    with pytest.raises(ConfigError, match="set base_output_directory"):
        CheckpointManager.from_config(cfg)


def test_final_save_honours_save_checkpoint_on_completion_and_commits_before_returning(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "checkpoint_period=100")
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.save(7, make_state(7), final=True)
        assert (mgr.directory / "7" / "commit_success.txt").exists()  # no wait() needed
    off = cfg.with_overrides(save_checkpoint_on_completion=False)
    with CheckpointManager.from_config(off) as mgr:
        assert mgr.save(9, make_state(9), final=True) is False
        assert mgr.save(9, make_state(9), force=True)  # force still saves


def test_load_parameters_path_loads_params_with_a_fresh_optimizer(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "pretrained", async_save=False) as pre:
        pre.save(0, make_state(0, seed=1))
    cfg = overlay(tmp_path, "params_only_finetune.yml", f"load_parameters_path={tmp_path}/pretrained/0/items")
    fresh = make_state(0, seed=2)
    with CheckpointManager.from_config(cfg) as mgr:
        state = mgr.restore(fresh)
        assert mgr.restored_step is None
        assert_same(state["params"], make_state(0, seed=1)["params"])
        assert_same(state["opt_state"], fresh["opt_state"])
        assert_same(state["step"], fresh["step"])
        with pytest.raises(ConfigError, match="abstract"):
            mgr.restore(abstract(fresh))
        # Once the fine-tune has its own checkpoint, a restart resumes from it instead.
        mgr.save(200, make_state(200), force=True)
        mgr.wait()
        assert_same(mgr.restore(fresh), make_state(200))


def test_load_full_state_path_and_load_step(maxtext_fixtures: Path, tmp_path: Path) -> None:
    src = maxtext_fixtures / "llama2_scan" / "checkpoints"
    items = src / "4" / "items"
    meta = pytree_io.read_metadata(items)
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev), meta)
    cfg = overlay(tmp_path, "keep_last_n_async.yml", f"load_full_state_path={items}")
    with CheckpointManager.from_config(cfg) as mgr:
        assert int(mgr.restore(target)["step"]) == 5
    with CheckpointManager(tmp_path / "own", period=1, config=cfg.with_overrides(maxckpt_load_step=1)) as mgr:
        for step in range(3):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert_same(mgr.restore(make_state(0)), make_state(1))
    with CheckpointManager(tmp_path / "own", config=cfg.with_overrides(maxckpt_load_step=7)) as mgr:
        with pytest.raises(CheckpointNotFoundError, match=r"step 7 has no committed checkpoint.*\[0, 1, 2\]"):
            mgr.restore(make_state(0))


def test_exclude_from_loading_keeps_the_targets_items(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "maxckpt_exclude_from_loading=[opt_state]")
    fresh = make_state(0, seed=3)
    with CheckpointManager(tmp_path / "ckpt", config=cfg) as mgr:
        mgr.save(5, make_state(5), force=True)
        mgr.wait()
        state = mgr.restore(fresh)
    assert_same(state["params"], make_state(5)["params"])
    assert_same(state["opt_state"], fresh["opt_state"])


def test_skip_optimizer_state_saves_without_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "maxckpt_skip_optimizer_state=true")
    fresh = make_state(0, seed=4)
    with CheckpointManager(tmp_path / "ckpt", config=cfg) as mgr:
        mgr.save(5, make_state(5), force=True)
        mgr.wait()
        assert pytree_io.stored_items(mgr.directory / "5" / "items") == {"params", "step"}
        with caplog.at_level(logging.WARNING, logger="maxckpt.manager"):
            state = mgr.restore(fresh)
    assert "saved without opt_state" in caplog.text
    assert_same(state["params"], make_state(5)["params"])
    assert_same(state["opt_state"], fresh["opt_state"])


def test_scan_layers_is_recorded_and_named_when_a_restore_does_not_fit(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "scan_layers=false")
    with CheckpointManager(tmp_path / "ckpt", period=1, config=cfg, async_save=False) as mgr:
        mgr.save(1, make_state(1))
    scanned = cfg.with_overrides(scan_layers=True)
    with CheckpointManager(tmp_path / "ckpt", config=scanned) as mgr:
        wrong = make_state(0)
        wrong["params"]["params"]["decoder"]["layers"]["mlp"]["wi"]["kernel"] = jax.numpy.zeros((8, 16))
        with pytest.raises(ShapeMismatchError, match=r"expects shape \(8, 16\).*saved with scan_layers=False"):
            mgr.restore(wrong)


def test_the_config_sets_period_retention_and_async_when_no_keyword_does(tmp_path: Path) -> None:
    """`CheckpointManager(dir, config=cfg)` runs with cfg's cadence and retention, as from_config does."""
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "checkpoint_period=2", "max_num_checkpoints_to_keep=2",
                  "maxckpt_keep_period=4", "async_checkpointing=false")
    with CheckpointManager(tmp_path / "ckpt", config=cfg) as mgr:
        assert mgr.period == 2 and mgr.policy == RetentionPolicy(keep=2, keep_period=4)
        assert [tier._async for tier in mgr._tiers] == [False]
        assert [mgr.save(step, make_state(step)) for step in range(10)] == [s % 2 == 0 for s in range(10)]
        mgr.wait()
        assert mgr.all_steps() == [0, 4, 6, 8]
    assert mgr.config == cfg


def test_keywords_are_explicit_overrides_of_the_config(tmp_path: Path) -> None:
    cfg = overlay(tmp_path, "keep_last_n_async.yml", "checkpoint_period=2", "max_num_checkpoints_to_keep=2",
                  "maxckpt_keep_period=4", "async_checkpointing=false")
    with CheckpointManager(tmp_path / "ckpt", config=cfg, period=3, max_to_keep=1, keep_period=6,
                           async_save=True) as mgr:
        assert mgr.period == 3 and mgr.policy == RetentionPolicy(keep=1, keep_period=6)
        assert [tier._async for tier in mgr._tiers] == [True]
        assert [mgr.save(step, make_state(step)) for step in range(10)] == [s % 3 == 0 for s in range(10)]
        mgr.wait()
        assert mgr.all_steps() == [0, 6, 9]
    # The manager's config says what it ran with, and where each value came from.
    assert (mgr.config.checkpoint_period, mgr.config.max_num_checkpoints_to_keep) == (3, 1)
    assert (mgr.config.maxckpt_keep_period, mgr.config.async_checkpointing) == (6, True)
    assert mgr.config.sources["checkpoint_period"] == "CheckpointManager keyword"
    assert mgr.config.sources["run_name"] == cfg.sources["run_name"]
    # One keyword overrides only its own key.
    with CheckpointManager(tmp_path / "other", config=cfg, period=5) as mgr:
        assert mgr.period == 5 and mgr.policy == RetentionPolicy(keep=2, keep_period=4)
        assert [tier._async for tier in mgr._tiers] == [False]


def test_a_manager_without_a_config_saves_every_step_and_keeps_all(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        assert mgr.period == 1 and mgr.policy == RetentionPolicy(keep=None, keep_period=None)
        assert [tier._async for tier in mgr._tiers] == [True]
        assert mgr.config.checkpoint_period == 1
