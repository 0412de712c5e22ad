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
