"""Hostile run directories under `maxckpt ls`, `maxckpt prune` and retention.

Every test builds the input, runs the CLI or the API over it, and checks the
message, the exit code and that the file tree is unchanged (names, sizes,
hashes, link targets) wherever nothing was to be removed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mounts import tmpfs  # noqa: F401 - the fixture

from cli_runner import run_cli as run
from run_dir_builders import (
    hf_trainer_run,
    maxtext_run,
    megatron_run,
    names,
    specforge_run,
    torchtitan_run,
    tree_snapshot,
)

LAYOUT_NAMES = {
    "orbax": str,
    "torchtitan": lambda n: f"step-{n}",
    "megatron": lambda n: f"iter_{n:07d}",
    "specforge": lambda n: f"epoch_0_step_{n}",
    "hf_trainer": lambda n: f"checkpoint-{n}",
}


def build(layout: str, root: Path, steps: list[int], fixtures: Path | None) -> Path:
    if layout == "orbax":
        return maxtext_run(fixtures, root, {s: (0, 2, 4, 5)[i % 4] for i, s in enumerate(steps)})
    if layout == "torchtitan":
        return torchtitan_run(root, steps)
    if layout == "megatron":
        return megatron_run(root, steps, tracker=max(steps))
    if layout == "specforge":
        return specforge_run(root, [(0, s) for s in steps])
    return hf_trainer_run(root, steps)


def rows(out: str) -> dict[str, str]:
    table = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) >= 4 and cells[0]:
            table[cells[0]] = line
    return table


# --- symlinks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUT_NAMES))
def test_symlinks_are_never_followed_renamed_or_deleted(layout: str, tmp_path: Path, request, capsys) -> None:
    fixtures = request.getfixturevalue("maxtext_fixtures") if layout == "orbax" else None
    name = LAYOUT_NAMES[layout]
    root = build(layout, tmp_path / "run", [1, 2, 3], fixtures)
    elsewhere = build(layout, tmp_path / "elsewhere", [0, 4], fixtures)
    os.symlink(elsewhere / name(0), root / name(0))  # the oldest "step": a link to a real, committed one
    os.symlink(tmp_path / "gone", root / name(9))  # a dangling one, newer than everything
    os.symlink(elsewhere / name(4), root / f"{name(4)}.maxckpt-deleting")  # what the old prune bug left
    links = {name(0), name(9), f"{name(4)}.maxckpt-deleting"}
    outside = tree_snapshot(tmp_path / "elsewhere")

    code, out, err = run(["ls", root, "--keep", "1"], capsys)
    assert code == 0, err
    for link in links:
        assert f"{link} -> " in out and "skipped symlink: maxckpt never follows, renames or deletes links" in out
    for _ in range(2):  # a later prune must not fail because of the first
        code, out, err = run(["prune", root, "--keep", "1"], capsys)
        assert code == 0, err
        table = rows(out)
        for link in links:
            assert "symlink ->" in table[link] and "skipped" in table[link], table[link]
    assert names(root) == sorted([name(3), *links, *(["latest_checkpointed_iteration.txt"] if layout == "megatron" else [])])
    for link in links:
        assert os.path.islink(root / link)
    assert os.readlink(root / name(0)) == str(elsewhere / name(0))
    assert tree_snapshot(tmp_path / "elsewhere") == outside


def test_retention_warns_once_about_a_symlink_and_leaves_it(tmp_path: Path, caplog) -> None:
    import logging

    import numpy as np

    from maxckpt import CheckpointManager

    root, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    with CheckpointManager(elsewhere, async_save=False) as mgr:
        mgr.save(0, {"w": np.zeros(4, np.float32)})
    root.mkdir()
    os.symlink(elsewhere / "0", root / "0")
    before = tree_snapshot(elsewhere)
    with caplog.at_level(logging.WARNING, logger="maxckpt.retention"):
        with CheckpointManager(root, max_to_keep=1, async_save=True) as mgr:
            for step in range(1, 5):
                mgr.save(step, {"w": np.full(4, step, np.float32)})
                mgr.wait()
            assert mgr.all_steps() == [4]
    warnings = [r.getMessage() for r in caplog.records if "symlink" in r.getMessage()]
    assert warnings == [
        f"maxckpt retention: {root / '0'} is a symlink (-> {elsewhere / '0'}); it is left alone: maxckpt never "
        "follows, renames or deletes links in a run directory"
    ]
    assert os.path.islink(root / "0") and names(root) == [".maxckpt.lock", "0", "4"]
    assert tree_snapshot(elsewhere) == before


# --- --step of a step that exists but is not committed ------------------------------------------


def _uncommitted_runs(tmp_path: Path, fixtures: Path) -> dict[str, tuple[Path, int, str, str]]:
    """layout -> (run dir, uncommitted step, its entry name, its reason)."""
    orbax = maxtext_run(fixtures, tmp_path / "orbax", {0: 0, 2: 2, 4: 4})
    os.unlink(orbax / "4" / "commit_success.txt")
    tt = torchtitan_run(tmp_path / "tt", [1, 2, 3], partial=(3,))
    mg = megatron_run(tmp_path / "mg", [10, 20, 30], tracker=20)
    return {
        "orbax": (orbax, 4, "", "no commit_success.txt: the save never finished; committed steps: 0, 2"),
        "torchtitan": (tt, 3, " (step-3)", "no .metadata: the DCP save never finished; committed steps: 1, 2"),
        "megatron": (mg, 30, " (iter_0000030)",
                     "newer than latest_checkpointed_iteration.txt (20): not finalised; committed steps: 10, 20"),
    }


@pytest.mark.parametrize("command", ["inspect", "convert", "verify", "diff"])
def test_step_that_is_not_committed_says_so_for_every_command_and_layout(
    command: str, maxtext_fixtures: Path, tmp_path: Path, capsys
) -> None:
    for layout, (root, step, name, why) in _uncommitted_runs(tmp_path, maxtext_fixtures).items():
        before = tree_snapshot(root)
        argv = {
            "inspect": ["inspect", root, "--step", step],
            "convert": ["convert", root, tmp_path / f"out-{layout}", "--to", "hf", "--step", step],
            "verify": ["verify", root, root, "--step", step],
            "diff": ["diff", root, root, "--step-b", step],
        }[command]
        code, out, err = run(argv, capsys)
        assert code == 1 and "Traceback" not in err, (layout, err)
        assert err.strip() == f"error: {root}: step {step}{name} exists but is not committed: {why}", (layout, err)
        assert tree_snapshot(root) == before
        assert not (tmp_path / f"out-{layout}").exists()


def test_a_run_with_only_uncommitted_steps_says_so(maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "orbax", {4: 4})
    os.unlink(root / "4" / "commit_success.txt")
    code, _, err = run(["inspect", root], capsys)
    assert code == 1
    assert err.strip() == (
        f"error: {root} holds no committed checkpoint: every step in it is partial (4: no commit_success.txt: "
        "the save never finished); a save that never finished cannot be read"
    )
    code, _, err = run(["inspect", root, "--step", "9"], capsys)
    assert err.strip() == f"error: {root}: no step 9; committed steps: none"


def test_manager_restore_of_an_uncommitted_step_says_so(tmp_path: Path) -> None:
    import numpy as np

    from maxckpt import CheckpointManager
    from maxckpt.errors import CheckpointNotFoundError

    root = tmp_path / "ckpt"
    with CheckpointManager(root, async_save=False) as mgr:
        mgr.save(0, {"w": np.zeros(4, np.float32)})
        mgr.save(1, {"w": np.ones(4, np.float32)})
    os.unlink(root / "1" / "commit_success.txt")
    with CheckpointManager(root, async_save=False) as mgr:
        with pytest.raises(CheckpointNotFoundError) as info:
            mgr.restore(step=1)
    assert str(info.value) == (
        f"step 1 has no committed checkpoint in {root} (1 exists but is not committed: no commit_success.txt: "
        "the save never finished); committed steps: [0]"
    )


# --- Megatron's release/ ------------------------------------------------------------------------


def test_megatron_release_is_listed_and_never_pruned(tmp_path: Path, capsys) -> None:
    from run_dir_builders import dcp_save

    root = tmp_path / "mg"
    root.mkdir()
    dcp_save(root / "release", 7.0)
    (root / "latest_checkpointed_iteration.txt").write_text("release")
    code, out, err = run(["ls", root, "--json"], capsys)
    assert code == 0, err
    listed = json.loads(out)
    assert [(r["name"], r["state"], r["release"]) for r in listed["steps"]] == [("release", "committed", True)]
    code, out, err = run(["ls", root, "--keep", "1"], capsys)
    assert code == 0 and "release" in rows(out) and "Megatron release checkpoint: never counted or removed" in out
    before = tree_snapshot(root)
    code, out, err = run(["prune", root, "--keep", "1"], capsys)
    assert code == 0, err
    assert "keep" in rows(out)["release"] and "Megatron release checkpoint: never counted or removed" in rows(out)["release"]
    assert tree_snapshot(root) == before

    megatron_run(root, [100, 200, 300], tracker=300)  # training went on from the release weights
    code, out, err = run(["prune", root, "--keep", "1"], capsys)
    assert code == 0, err
    assert names(root) == ["iter_0000300", "latest_checkpointed_iteration.txt", "release"]
    assert tree_snapshot(root / "release") == {k[len("release/"):]: v for k, v in before.items() if k.startswith("release/")}
    code, out, err = run(["inspect", root, "--step", "300"], capsys)
    assert code == 0, err


def test_a_folder_named_release_that_is_no_checkpoint_changes_nothing(maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {1: 0, 2: 2})
    (root / "release").mkdir()
    (root / "release" / "NOTES.md").write_text("release notes")
    code, out, err = run(["prune", root, "--keep", "1"], capsys)
    assert code == 0, err
    assert names(root) == ["2", "release"]


# --- odd run directories ------------------------------------------------------------------------


def test_prune_on_a_read_only_file_system_fails_in_one_line_and_changes_nothing(
    maxtext_fixtures: Path, tmpfs, capsys
) -> None:
    from mounts import remount

    point = tmpfs("size=64m")
    root = maxtext_run(maxtext_fixtures, point / "ckpt", {1: 0, 2: 2, 3: 4})
    remount(point, "ro")
    before = tree_snapshot(root)
    code, out, err = run(["prune", root, "--keep", "1"], capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: could not remove 2 entr(ies): {root / '1'}: OSError: [Errno 30] Read-only file system")
    assert err.rstrip().endswith("fix and run prune again")
    assert "FAILED" in rows(out)["1"]
    assert tree_snapshot(root) == before
    code, out, err = run(["ls", root, "--keep", "1"], capsys)  # reading still works
    assert code == 0 and "delete next" in rows(out)["1"]


@pytest.mark.parametrize("command", [["ls"], ["prune", "--keep", "1"]])
def test_a_run_dir_that_is_a_file_or_empty_or_unrelated(command: list[str], tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "run.txt"
    a_file.write_text("not a folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.md").write_text("x")
    (unrelated / "42").mkdir()  # a number, but nothing Orbax wrote
    before = tree_snapshot(tmp_path)
    for path, expected in [
        (a_file, "is a file"),
        (empty, "holds no checkpoints maxckpt recognises (found: nothing)"),
        (unrelated, "holds no checkpoints maxckpt recognises (found: 42, notes.md)"),
        (tmp_path / "missing", "no such directory"),
    ]:
        code, out, err = run([command[0], path, *command[1:]], capsys)
        assert code == 1 and out == "" and "Traceback" not in err, (path, out, err)
        assert err.startswith(f"error: {path}") and expected in err and len(err.strip().splitlines()) == 1, err
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("keep", ["0", "-3"])
def test_prune_keep_below_one_is_a_usage_error(keep: str, maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {1: 0, 2: 2})
    before = tree_snapshot(root)
    code, out, err = run(["prune", root, "--keep", keep], capsys)
    assert code == 2 and "Traceback" not in err and "--keep" in err
    assert tree_snapshot(root) == before

    from maxckpt.errors import ConfigError
    from maxckpt.manager.retention import prune

    with pytest.raises(ConfigError, match=rf"retention keep: expected a positive integer or None, got {keep}"):
        prune(root, keep=int(keep))
    assert tree_snapshot(root) == before


@pytest.mark.parametrize("content", ["[1, 2, 3]", '"text"', "null", "{not json", '{"custom_metadata": [1]}'])
def test_checkpoint_metadata_that_is_not_an_object(content: str, maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {1: 0, 2: 2})
    (root / "2" / "_CHECKPOINT_METADATA").write_text(content)
    code, out, err = run(["ls", root, "--json"], capsys)
    assert code == 0, err
    row = json.loads(out)["steps"][1]
    assert row["name"] == "2" and row["state"] == "committed" and row["time_source"] == "mtime"

    from maxckpt.manager.pytree_io import step_custom_metadata

    assert step_custom_metadata(root / "2") == {}


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"iteration-12"])
def test_megatron_tracker_that_is_garbage_pins_nothing(content: bytes, tmp_path: Path, capsys) -> None:
    root = megatron_run(tmp_path / "mg", [100, 200], tracker=None)
    (root / "latest_checkpointed_iteration.txt").write_bytes(content)
    code, out, err = run(["ls", root], capsys)
    assert code == 0 and "Traceback" not in err


def test_hf_trainer_state_that_is_not_an_object(tmp_path: Path, capsys) -> None:
    root = hf_trainer_run(tmp_path / "hf", [10, 20])
    (root / "checkpoint-20" / "trainer_state.json").write_text("[]")
    code, out, err = run(["prune", root, "--keep", "1", "--dry-run"], capsys)
    assert code == 0, err
    assert "would remove" in rows(out)["checkpoint-10"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"period": 0}, "CheckpointManager period: expected a positive integer, got 0"),
        ({"period": 2.5}, "CheckpointManager period: expected a positive integer, got 2.5"),
        ({"max_to_keep": 0}, "CheckpointManager max_to_keep: expected a positive integer or None, got 0"),
        ({"max_to_keep": -1}, "CheckpointManager max_to_keep: expected a positive integer or None, got -1"),
        ({"keep_period": True}, "CheckpointManager keep_period: expected a positive integer or None, got True"),
        ({"async_save": "yes"}, "CheckpointManager async_save: expected True or False, got 'yes'"),
        ({"config": {"checkpoint_period": 5}}, "CheckpointManager config: expected a maxckpt.CheckpointConfig"),
    ],
)
def test_manager_kwargs_out_of_range_are_one_config_error(kwargs: dict, message: str, tmp_path: Path) -> None:
    from maxckpt import CheckpointManager
    from maxckpt.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        CheckpointManager(tmp_path / "ckpt", **kwargs)
    assert str(info.value).startswith(message)
    assert not (tmp_path / "ckpt").exists()  # refused before anything was created


def test_manager_on_a_run_dir_that_is_a_file(tmp_path: Path) -> None:
    from maxckpt import CheckpointManager
    from maxckpt.errors import CheckpointSaveError

    (tmp_path / "ckpt").write_text("mine")
    with pytest.raises(CheckpointSaveError, match="is a file, not a directory: cannot save checkpoints into it"):
        CheckpointManager(tmp_path / "ckpt")
    assert (tmp_path / "ckpt").read_text() == "mine"
    with pytest.raises(CheckpointSaveError, match="cannot create the checkpoint directory .*Not a directory"):
        CheckpointManager(tmp_path / "ckpt" / "sub")


@pytest.mark.parametrize("step", [-1, 1.5, "3", True])
def test_a_save_step_that_is_no_step_is_refused_before_anything_is_written(step, tmp_path: Path) -> None:
    import numpy as np

    from maxckpt import CheckpointManager
    from maxckpt.errors import ConfigError

    with CheckpointManager(tmp_path / "ckpt", async_save=True) as mgr:
        with pytest.raises(ConfigError, match=rf"save step: expected a non-negative integer, got {step!r}"):
            mgr.save(step, {"w": np.zeros(2, np.float32)})
        assert mgr.save(np.int64(2), {"w": np.zeros(2, np.float32)})  # numpy integers are steps
    assert names(tmp_path / "ckpt") == [".maxckpt.lock", "2"]


# --- a run name must stay inside base_output_directory -------------------------------------


@pytest.mark.parametrize("run_name", ["../../etc", "/etc", "runs/../../x", ".."])
def test_a_run_name_that_leaves_base_output_directory_is_refused(run_name: str, tmp_path: Path, capsys) -> None:
    from maxckpt import load_config
    from maxckpt.config import CheckpointConfig
    from maxckpt.errors import ConfigError

    base = tmp_path / "base"
    overlay = tmp_path / "overlay.yml"
    overlay.write_text(f"base_output_directory: {base}\nrun_name: {json.dumps(run_name)}\n")
    refused = (
        f"run_name {run_name!r} (set in {overlay}) would put checkpoint_dir, where saves go and retention deletes, "
        "outside base_output_directory"
    )
    with pytest.raises(ConfigError) as info:  # checkpoint_dir was <base>/../../etc/checkpoints
        load_config(overlay)
    assert str(info.value).startswith(refused), info.value
    assert "a run name may not be an absolute path or hold '..' parts" in str(info.value)
    with pytest.raises(ConfigError, match="would put checkpoint_dir"):
        load_config(tmp_path / "overlay.yml", "run_name=ok", f"run_name={run_name}")
    with pytest.raises(ConfigError, match="would put checkpoint_dir"):
        CheckpointConfig(base_output_directory=str(base), run_name=run_name)
    before = tree_snapshot(tmp_path)
    code, _, err = run(["ls", tmp_path, "--config", overlay], capsys)
    assert code == 2 and err.startswith("error: run_name ") and "Traceback" not in err, err
    assert tree_snapshot(tmp_path) == before


def test_a_run_name_with_folders_inside_base_output_directory_is_fine(tmp_path: Path) -> None:
    from maxckpt import load_config

    overlay = tmp_path / "overlay.yml"
    overlay.write_text(f"base_output_directory: {tmp_path}\nrun_name: team/./r1\n")
    assert load_config(overlay).checkpoint_dir == f"{tmp_path}/team/r1/checkpoints/"
