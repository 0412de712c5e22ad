"""Specification of run-directory listing: which entries are checkpoints, of which step, complete or not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maxckpt.errors import CheckpointNotFoundError, MaxckptError
from maxckpt.storage.run_dirs import COMMITTED, DELETING, PARTIAL, scan_run_dir
from run_dir_builders import (
    hf_trainer_run,
    maxtext_run,
    megatron_run,
    specforge_run,
    torchtitan_run,
    writable_copy,
)


def states(run) -> list[tuple[str, int, str]]:
    return [(s.name, s.step, s.state) for s in run.steps]


def test_maxtext_written_run_lists_its_committed_steps(maxtext_fixtures: Path) -> None:
    run = scan_run_dir(maxtext_fixtures / "llama2_scan" / "checkpoints")
    assert run.layout == "orbax"
    assert [s.step for s in run.committed] == [0, 2, 4, 5]
    assert run.latest.step == 5 and run.latest.path.name == "5"
    assert run.step(4).committed and run.step(3) is None


def test_orbax_partials_and_interrupted_deletions_never_count(maxtext_fixtures: Path, tmp_path: Path) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt", {2: 2, 4: 4})
    writable_copy(root / "4", root / "7.orbax-checkpoint-tmp")  # a save in flight (or killed)
    (root / "7.orbax-checkpoint-tmp" / "commit_success.txt").unlink()
    writable_copy(root / "4", root / "6")  # a folder whose commit never happened
    (root / "6" / "commit_success.txt").unlink()
    os.rename(root / "2", root / "2.maxckpt-deleting")  # retention killed mid-deletion
    (root / "_ROOT_METADATA").write_text("{}")
    (root / "notes.txt").write_text("mine")
    (root / "2024").mkdir()  # an integer folder that is not a checkpoint

    run = scan_run_dir(root)

    assert states(run) == [
        ("2.maxckpt-deleting", 2, DELETING),
        ("4", 4, COMMITTED),
        ("6", 6, PARTIAL),
        ("7.orbax-checkpoint-tmp", 7, PARTIAL),
    ]
    assert run.latest.step == 4
    assert "commit_success.txt" in run.steps[2].why and "temporary" in run.steps[3].why
    others = {o.name: o.what for o in run.others}
    assert others == {"2024": "", "_ROOT_METADATA": "Orbax root metadata", "notes.txt": ""}


def test_torchtitan_steps_commit_with_dcp_metadata(tmp_path: Path) -> None:
    root = torchtitan_run(tmp_path / "ckpt", [10, 20, 30], partial=(30,))
    run = scan_run_dir(root)
    assert run.layout == "torchtitan"
    assert states(run) == [("step-10", 10, COMMITTED), ("step-20", 20, COMMITTED), ("step-30", 30, PARTIAL)]
    assert ".metadata" in run.steps[2].why


def test_megatron_tracker_decides_what_is_final_and_is_pinned(tmp_path: Path) -> None:
    root = megatron_run(tmp_path / "ckpt", [100, 200, 300, 400], tracker=200, partial=(400,))
    (root / "release").mkdir()
    run = scan_run_dir(root)
    assert run.layout == "megatron"
    assert states(run) == [
        ("iter_0000100", 100, COMMITTED),
        ("iter_0000200", 200, COMMITTED),
        ("iter_0000300", 300, PARTIAL),  # complete on disk but newer than the tracker
        ("iter_0000400", 400, PARTIAL),
    ]
    assert run.pinned == {"iter_0000200": "latest_checkpointed_iteration.txt points here"}
    assert {o.name: o.what for o in run.others} == {
        "latest_checkpointed_iteration.txt": "Megatron tracker",
        "release": "Megatron release folder without a complete checkpoint",  # empty: not a checkpoint
    }


def test_megatron_tracker_naming_a_missing_iteration_is_noted(tmp_path: Path) -> None:
    run = scan_run_dir(megatron_run(tmp_path / "ckpt", [100], tracker=900))
    assert run.pinned == {} and "900" in run.notes[0]


def test_specforge_steps_sort_by_global_step(tmp_path: Path) -> None:
    root = specforge_run(tmp_path / "out", [(1, 2000), (0, 1000), (2, 3000)], partial=(3000,))
    run = scan_run_dir(root)
    assert run.layout == "specforge"
    assert [(s.epoch, s.step, s.state) for s in run.steps] == [(0, 1000, COMMITTED), (1, 2000, COMMITTED), (2, 3000, PARTIAL)]


def test_hf_trainer_best_model_is_pinned_and_tmp_checkpoints_are_partial(tmp_path: Path) -> None:
    root = hf_trainer_run(tmp_path / "out", [10, 20, 30], best=10)
    writable_copy(root / "checkpoint-30", root / "tmp-checkpoint-40")
    (root / "runs").mkdir()
    run = scan_run_dir(root)
    assert run.layout == "hf_trainer"
    assert states(run) == [
        ("checkpoint-10", 10, COMMITTED),
        ("checkpoint-20", 20, COMMITTED),
        ("checkpoint-30", 30, COMMITTED),
        ("tmp-checkpoint-40", 40, PARTIAL),
    ]
    assert run.pinned == {"checkpoint-10": "best model in trainer_state.json"}


def test_a_folder_mixing_layouts_is_refused_unless_the_layout_is_given(tmp_path: Path) -> None:
    root = torchtitan_run(tmp_path / "ckpt", [10])
    hf_trainer_run(root, [20])
    with pytest.raises(MaxckptError, match="mixes checkpoints of several layouts"):
        scan_run_dir(root)
    run = scan_run_dir(root, "torchtitan")
    assert states(run) == [("step-10", 10, COMMITTED)]
    assert [o.name for o in run.others] == ["checkpoint-20"]


def test_missing_directory_is_an_empty_run_and_a_file_is_an_error(tmp_path: Path) -> None:
    run = scan_run_dir(tmp_path / "nothing-yet")
    assert run.steps == () and run.latest is None and run.layout is None
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointNotFoundError, match="is a file"):
        scan_run_dir(tmp_path / "file")
    with pytest.raises(MaxckptError, match="unknown run layout 'nemo'"):
        scan_run_dir(tmp_path, "nemo")
