"""`maxckpt demo`: train, crash, resume, prune, convert to three formats, check logits - run for real."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from maxckpt import load_config
from maxckpt.cli.main import main
from maxckpt.demo import workdir
from maxckpt.demo.report import DemoResult
from maxckpt.demo.runner import default_crash_step, demo_config_path, saves_on_disk
from maxckpt.errors import MaxckptError
from maxckpt.storage.run_dirs import scan_run_dir
from run_dir_builders import maxtext_run

STEPS = 24  # saves at 0, 5, 10, 15, 20 and 23; the crash comes after step 15's save starts


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "maxckpt", "demo", "--dir", str(out), "--steps", str(STEPS)],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "COLUMNS": "200"},
    )
    return out, proc, json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None


@pytest.mark.slow
def test_demo_runs_end_to_end(demo):
    out, proc, summary = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["ok"] is True
    # the crash: killed right after step 15's save started, resumed from the newest committed step
    assert summary["crash_step"] == 15
    assert summary["resumed_from"] == max(summary["committed_at_crash"])
    assert summary["committed_at_crash"][:3] == [0, 5, 10]
    assert set(summary["partial_at_crash"]) <= {15}
    assert max(summary["committed_at_crash"] + summary["partial_at_crash"]) == 15  # the child waited for its kill
    assert summary["resumed_saves"] == [s for s in [15, 20, 23] if s > summary["resumed_from"]]
    assert summary["saved_steps"] == [0, 5, 10, 15, 20, 23]
    # retention from configs/demo.yml: newest 3 + every 20th step
    assert summary["kept_steps"] == [0, 15, 20, 23]
    assert summary["pruned_steps"] == [5, 10]
    run = scan_run_dir(Path(summary["checkpoint_dir"]), "orbax")
    assert [s.step for s in run.steps] == [0, 15, 20, 23] and all(s.committed for s in run.steps)
    # training made progress across the crash
    assert summary["losses"]["23"] < summary["losses"]["0"] - 2.0
    # three exports, bit-exact through the layouts, and transformers' logits match the JAX reference
    assert [e["format"] for e in summary["exports"]] == ["hf", "megatron", "torchtitan"]
    assert all(e["tensor_max_abs_diff"] == 0.0 for e in summary["exports"])
    assert all(e["seconds"] > 0 for e in summary["exports"])  # timed in the training process's final save
    assert [e["tensors"] for e in summary["exports"]] == [39, 9, 39]  # Megatron stacks layers and fuses QKV
    assert summary["logits_max_abs_diff"] <= 1e-4
    export = Path(summary["run_dir"]) / "export"
    assert (export / "hf" / "config.json").is_file() and (export / "hf" / "model.safetensors").is_file()
    assert (export / "megatron" / "latest_checkpointed_iteration.txt").read_text().strip() == "24"
    assert (export / "torchtitan" / "step-24" / ".metadata").is_file()
    assert (out / workdir.MARKER).is_file()
    assert (out / "logs" / "train-1.log").is_file()


@pytest.mark.slow
def test_demo_output(demo):
    out, proc, summary = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for expected in ("saves started", "pruned by retention", "5, 10", "resumed from", "cut short by the crash", f"step {summary['resumed_from']}, in a new process",
                     "exports of step 23", "megatron", "torchtitan", "max |diff| vs source", "logits", "Explore the result:"):
        assert expected in text, expected
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("maxckpt ")]
    assert [c.split()[1] for c in commands] == ["ls", "inspect", "inspect", "diff", "diff"]
    assert "crash: SIGKILL after step 15" in proc.stderr and "resumed from step" in proc.stderr
    assert "the final save exported step 23 to hf, megatron, torchtitan (maxckpt_export_on_completion)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_printed_explore_commands_work(demo, capsys):
    out, proc, summary = demo
    assert proc.returncode == 0
    commands = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("maxckpt ")]
    for command in commands:
        with pytest.raises(SystemExit) as exit_info:
            main(shlex.split(command)[1:])
        assert (exit_info.value.code or 0) == 0, (command, capsys.readouterr().err)
    printed = capsys.readouterr().out
    assert "retention (newest 3 + every 20th step) deletes next: nothing" in printed
    assert "39 tensors: 39 unchanged" in printed  # the Megatron export is the final step, exactly


def test_demo_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    proc = subprocess.run([sys.executable, "-m", "maxckpt", "demo", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "is not a maxckpt demo directory" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_rerun_replaces_only_the_demos_own_outputs(tmp_path):
    root = workdir.prepare(tmp_path / "d")
    (root / workdir.RUN_NAME / "checkpoints").mkdir(parents=True)
    (root / workdir.SUMMARY).write_text("{}")
    (root / workdir.JAX_CACHE).mkdir()
    (root / "mine.txt").write_text("user file")
    again = workdir.prepare(tmp_path / "d")
    assert sorted(p.name for p in again.iterdir()) == sorted([workdir.MARKER, workdir.LOGS, workdir.JAX_CACHE, "mine.txt"])


def test_demo_config_loads_and_says_what_the_demo_needs():
    cfg = load_config(demo_config_path())
    assert cfg.async_checkpointing is True
    assert (cfg.checkpoint_period, cfg.max_num_checkpoints_to_keep, cfg.maxckpt_keep_period) == (5, 3, 20)
    assert cfg.maxckpt_export_on_completion == ("hf", "megatron", "torchtitan")
    assert cfg.model_name == "llama3.1" and cfg.maxckpt_export_dtype == "float32"
    proc = subprocess.run([sys.executable, "-m", "maxckpt", "config", "show", str(demo_config_path())], capture_output=True, text=True)
    assert proc.returncode == 0 and "checkpoint_period" in proc.stdout


def test_too_few_steps_is_a_clear_error(tmp_path):
    from maxckpt.demo.runner import run_demo

    with pytest.raises(MaxckptError, match="needs at least 12 steps"):
        run_demo(tmp_path / "d", steps=8)
    assert not (tmp_path / "d").exists()  # refused before touching the disk


def test_crash_step_choice():
    assert default_crash_step(40, 5) == 25
    assert default_crash_step(24, 5) == 15
    assert default_crash_step(12, 5) == 10  # the last save step before the end


def test_saves_on_disk_at_the_crash_leave_out_interrupted_deletions(maxtext_fixtures, tmp_path):
    """A step retention was deleting when the kill landed is not a save the crash cut short."""
    checkpoints = maxtext_run(maxtext_fixtures, tmp_path / "checkpoints")
    (checkpoints / "2").rename(checkpoints / "2.maxckpt-deleting")
    (checkpoints / "5" / "commit_success.txt").unlink()
    (checkpoints / "5").rename(checkpoints / "5.orbax-checkpoint-tmp-1")
    assert saves_on_disk(checkpoints) == {"committed": [0, 4], "partial": [5]}


def _result(**fields) -> DemoResult:
    base = dict(
        directory="d", run_dir="d/demo_run", checkpoint_dir="d/demo_run/checkpoints", config="demo.yml", steps=40,
        period=5, keep=3, keep_period=20, crash_step=25, resumed_from=20, committed_at_crash=[0, 10, 15, 20],
        partial_at_crash=[25], saved_steps=[0, 5, 10, 15, 20, 25, 30, 35, 39], resumed_saves=[25, 30, 35, 39],
        kept_steps=[0, 20, 30, 35, 39], pruned_steps=[5, 10, 15, 25], lost_steps=[25], run_bytes=1, losses={}, final_step=39,
        train_seconds=1.0,
    )
    return DemoResult(**{**base, **fields})


def _row(result: DemoResult, label: str) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(result.checkpoint_table())
    return next(line for line in console.export_text().splitlines() if label in line)


def test_summary_says_saved_again_only_for_steps_the_resumed_run_saved():
    assert "25 (partial: moved aside on resume, then saved again by the resumed run)" in _row(_result(), "cut short")
    alone = _result(resumed_saves=[30, 35, 39], saved_steps=[0, 5, 10, 15, 20, 25, 30, 35, 39])
    assert "25 (partial: moved aside on resume)" in _row(alone, "cut short")
    assert "none (the save in flight had committed)" in _row(_result(lost_steps=[], partial_at_crash=[]), "cut short")


def test_commands_point_at_the_notebooks_of_this_checkout():
    commands = _result().commands()
    assert [c.split()[1] for c in commands if c.startswith("maxckpt ")] == ["ls", "inspect", "inspect", "diff"]
    notebook = next(c for c in commands if "explore_checkpoint.ipynb" in c)
    path = next(w for w in notebook.split() if w.endswith("explore_checkpoint.ipynb"))
    assert Path(path).is_file()


def test_a_paused_child_exits_when_the_parent_goes_away():
    proc = subprocess.run(
        [sys.executable, "-c", "from maxckpt.demo.train import wait_to_be_killed; wait_to_be_killed()"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1 and "parent process went away" in proc.stderr
