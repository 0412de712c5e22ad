"""Specification of `maxckpt prune`: a table of every decision, dry runs, clear refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli as run
from run_dir_builders import maxtext_run, megatron_run, names


def rows(out: str) -> dict[str, str]:
    """entry name -> its table row."""
    table = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) >= 4 and cells[0]:
            table[cells[0]] = line
    return table


def test_prune_prints_every_decision_and_removes_old_steps(maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    (root / "notes.txt").write_text("mine")
    code, out, _ = run(["prune", str(root), "--keep", "2", "--keep-period", "4"], capsys)
    assert code == 0
    table = rows(out)
    assert "remove" in table["2"] and "older than the newest 2" in table["2"]
    assert "keep" in table["0"] and "keep_period=4" in table["0"]
    assert "keep" in table["4"] and "newest 2" in table["4"]
    assert "keep" in table["5"] and "newest committed" in table["5"]
    assert "left alone" in table["notes.txt"]
    assert "removed 1 of 1" in out
    assert names(root) == ["0", "4", "5", "notes.txt"]


def test_dry_run_shows_the_plan_and_changes_nothing(maxtext_fixtures: Path, tmp_path: Path, capsys) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")
    code, out, _ = run(["prune", str(root), "--keep", "1", "--dry-run"], capsys)
    assert code == 0
    assert "would remove" in rows(out)["2"] and "3 entries would be removed; nothing was changed" in out
    assert names(root) == ["0", "2", "4", "5"]


def test_megatron_tracker_is_shown_and_left_alone(tmp_path: Path, capsys) -> None:
    root = megatron_run(tmp_path / "ckpt", [100, 200, 300], tracker=300)
    code, out, _ = run(["prune", str(root), "--keep", "1"], capsys)
    assert code == 0
    assert "Megatron tracker" in rows(out)["latest_checkpointed_iteration.txt"]
    assert names(root) == ["iter_0000300", "latest_checkpointed_iteration.txt"]


def test_unrecognised_folder_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "weights.bin").write_text("x")
    code, out, err = run(["prune", str(tmp_path), "--keep", "1"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error:") and "holds no checkpoints maxckpt recognises" in err and "Traceback" not in err
    assert names(tmp_path) == ["weights.bin"]


def test_failed_deletions_are_reported_and_exit_non_zero(
    maxtext_fixtures: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = maxtext_run(maxtext_fixtures, tmp_path / "ckpt")

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(shutil, "rmtree", denied)
    code, out, err = run(["prune", str(root), "--keep", "3"], capsys)
    assert code == 1
    assert "FAILED" in rows(out)["0"]
    assert "could not remove 1 entr(ies)" in err and "0.maxckpt-deleting" in err and "Permission denied" in err


def test_keep_must_be_positive(tmp_path: Path, capsys) -> None:
    code, _, err = run(["prune", str(tmp_path), "--keep", "0"], capsys)
    assert code == 2 and "--keep" in err


def test_help(capsys) -> None:
    code, out, _ = run(["prune", "--help"], capsys)
    assert code == 0 and "--keep-period" in out and "--dry-run" in out and "latest_checkpointed_iteration.txt" in out
    assert "--layout" in out and "hf_trainer" in out


def test_a_folder_mixing_layouts_is_refused_and_layout_picks_one(tmp_path: Path, capsys) -> None:
    root = megatron_run(tmp_path / "ckpt", [100, 200], tracker=200)
    (root / "checkpoint-5").mkdir()
    (root / "checkpoint-5" / "trainer_state.json").write_text("{}")
    code, out, err = run(["prune", str(root), "--keep", "1"], capsys)
    assert code == 1 and out == "" and "mixes checkpoints of several layouts" in err and "--layout" in err
    code, out, _ = run(["prune", str(root), "--keep", "1", "--layout", "megatron"], capsys)
    assert code == 0 and "left alone" in rows(out)["checkpoint-5"]
    assert names(root) == ["checkpoint-5", "iter_0000200", "latest_checkpointed_iteration.txt"]


def test_a_missing_directory_is_named(tmp_path: Path, capsys) -> None:
    code, out, err = run(["prune", str(tmp_path / "nope"), "--keep", "1"], capsys)
    assert code == 1 and out == "" and "nope: no such directory" in err
