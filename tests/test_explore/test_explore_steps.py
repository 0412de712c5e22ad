"""`maxckpt ls` / `list_steps`: the step table of every run layout, with retention's next deletions."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import cli_runner
from maxckpt.errors import CheckpointNotFoundError
from maxckpt.explore import list_steps
from maxckpt.explore.steps import DELETE_NEXT
from run_dir_builders import hf_trainer_run, maxtext_run, megatron_run, specforge_run, torchtitan_run


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    return cli_runner.run_cli(args, capsys)


@pytest.fixture
def orbax_run(maxtext_fixtures, tmp_path) -> Path:
    """A MaxText run dir: committed steps 0, 2, 4, 5 (real MaxText saves), and a save cut short at 6."""
    checkpoints = maxtext_run(maxtext_fixtures, tmp_path / "run" / "checkpoints")
    partial = checkpoints / "6.orbax-checkpoint-tmp-1234"
    shutil.copytree(checkpoints / "5", partial)
    (partial / "commit_success.txt").unlink()
    return tmp_path / "run"


def test_orbax_rows(orbax_run):
    table = list_steps(orbax_run)  # a run dir: its checkpoints/ is listed
    assert table.layout == "orbax" and table.path == os.fspath(orbax_run / "checkpoints")
    assert [(r.step, r.state) for r in table.rows] == [(0, "committed"), (2, "committed"), (4, "committed"), (5, "committed"), (6, "partial")]
    assert table.committed_steps == [0, 2, 4, 5]
    five = table.rows[3]
    assert five.items == ("items",)
    assert five.bytes == disk_bytes(orbax_run / "checkpoints" / "5")
    meta = json.loads((orbax_run / "checkpoints" / "5" / "_CHECKPOINT_METADATA").read_text())
    assert (five.saved_at, five.time_source) == (meta["commit_timestamp_nsecs"] / 1e9, "commit")
    assert table.rows[4].reason.startswith("Orbax temporary directory")
    assert table.policy is None and all(r.retention is None for r in table.rows)
    assert list_steps(orbax_run.parent).path == table.path  # a folder holding one run (the demo's --dir)


def test_retention_preview_is_the_managers_policy(orbax_run):
    assert list_steps(orbax_run, keep=2).delete_next == [0, 2]
    assert list_steps(orbax_run, keep=2, keep_period=4).delete_next == [2]
    table = list_steps(orbax_run, keep=1)
    assert [r.retention for r in table.rows] == [DELETE_NEXT, DELETE_NEXT, DELETE_NEXT, "keep", "left alone"]
    assert table.rows[3].reason == "newest committed checkpoint"
    assert list_steps(orbax_run, keep=10).delete_next == []


def test_retention_from_a_config(orbax_run, tmp_path):
    from maxckpt import load_config

    overlay = tmp_path / "overlay.yml"
    overlay.write_text("base_config: base.yml\nmax_num_checkpoints_to_keep: 2\nmaxckpt_keep_period: 4\n")
    assert list_steps(orbax_run, config=load_config(overlay)).delete_next == [2]
    assert list_steps(orbax_run, config=load_config(overlay, "maxckpt_keep_period=None")).delete_next == [0, 2]
    assert list_steps(orbax_run, keep=3, config=load_config(overlay)).delete_next == []  # explicit numbers win


def test_torchtitan_and_megatron_runs(tmp_path):
    titan = list_steps(torchtitan_run(tmp_path / "titan", [10, 20, 30], partial=(30,)))
    assert titan.layout == "torchtitan"
    assert [(r.step, r.state) for r in titan.rows] == [(10, "committed"), (20, "committed"), (30, "partial")]
    assert titan.rows[0].items == ("layers", "step")  # top-level keys of the DCP state
    assert titan.rows[0].time_source == "mtime"
    assert titan.rows[0].saved_at == (tmp_path / "titan" / "step-10" / ".metadata").stat().st_mtime

    mega = list_steps(megatron_run(tmp_path / "mega", [100, 200, 300], tracker=200), keep=1)
    assert mega.layout == "megatron"
    assert [(r.step, r.state) for r in mega.rows] == [(100, "committed"), (200, "committed"), (300, "partial")]
    assert mega.delete_next == [100]  # 300 is newer than the tracker: not finalised


def test_hf_trainer_and_specforge_runs(tmp_path):
    hf = list_steps(hf_trainer_run(tmp_path / "hf", [5, 10, 15], best=5), keep=1)
    assert hf.layout == "hf_trainer"
    assert hf.rows[0].items == ("config.json", "model.safetensors", "trainer_state.json")
    assert hf.delete_next == [10]  # 5 is the best model: pinned
    assert hf.rows[0].reason == "best model in trainer_state.json"

    sf = list_steps(specforge_run(tmp_path / "sf", [(0, 100), (1, 200)], partial=(200,)))
    assert [(r.epoch, r.step, r.state) for r in sf.rows] == [(0, 100, "committed"), (1, 200, "partial")]


def test_to_dict_is_json(orbax_run):
    data = json.loads(list_steps(orbax_run, keep=2).to_json())
    assert data["layout"] == "orbax" and data["policy"] == {"keep": 2, "keep_period": None}
    assert [s["step"] for s in data["steps"]] == [0, 2, 4, 5, 6]
    assert data["delete_next"] == [0, 2] and data["committed_steps"] == [0, 2, 4, 5]
    assert data["steps"][0]["saved_at_iso"].endswith("+00:00")
    assert data["total_bytes"] == disk_bytes(orbax_run / "checkpoints")


# ------------------------------------------------------------------ CLI


def test_cli_table(capsys, orbax_run):
    code, out, _ = run_cli(capsys, "ls", str(orbax_run), "--keep", "2", "--keep-period", "4")
    assert code == 0
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("│    2 "))
    assert "committed" in row and "delete next" in row and "items" in row
    assert "partial" in next(line for line in lines if line.startswith("│    6 "))
    assert "deletes next: 2" in out


def test_cli_config_and_overrides(capsys, orbax_run, tmp_path):
    overlay = tmp_path / "o.yml"
    overlay.write_text("base_config: base.yml\nmax_num_checkpoints_to_keep: 3\n")
    code, out, _ = run_cli(capsys, "ls", str(orbax_run), "--config", str(overlay), "max_num_checkpoints_to_keep=1", "--json")
    assert code == 0
    assert json.loads(out)["delete_next"] == [0, 2, 4]


def test_cli_overrides_need_a_config(capsys, orbax_run):
    code, _, err = run_cli(capsys, "ls", str(orbax_run), "max_num_checkpoints_to_keep=1")
    assert code == 2 and "need --config" in err


def test_cli_folder_mixing_layouts_needs_layout(capsys, tmp_path):
    root = megatron_run(tmp_path / "ckpt", [100, 200], tracker=200)
    (root / "checkpoint-5").mkdir()
    (root / "checkpoint-5" / "trainer_state.json").write_text("{}")
    code, out, err = run_cli(capsys, "ls", str(root))
    assert code == 1 and out == "" and "mixes checkpoints of several layouts" in err
    code, out, _ = run_cli(capsys, "ls", str(root), "--layout", "megatron", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["layout"] == "megatron" and [s["step"] for s in data["steps"]] == [100, 200]
    assert list_steps(root, layout="hf_trainer").committed_steps == [5]


def test_cli_not_a_run_dir(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    code, out, err = run_cli(capsys, "ls", str(tmp_path))
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "holds no checkpoints maxckpt recognises (found: notes.txt)" in err


def test_missing_and_file_paths(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        list_steps(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointNotFoundError, match="is a file"):
        list_steps(tmp_path / "f")
