"""A full disk, a read-only parent and a read-only destination: one `error:` line, nothing left behind.

These use real filesystems: a 2 MB tmpfs (full after a few tensors) and a
read-only remount or bind mount. The suite runs as root (as CI does), where
chmod would not stop a write; mounting fails the test loudly, never skips it.
Stdout on /dev/full or closed must not change a command's exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_runner import run_cli
from hostile_tools import (
    REPO,
    assert_unchanged,
    fails_cleanly,
    one_error_line,
    remount_read_only,
    small_tmpfs,
    snapshot,
)

TARGETS = ["hf", "maxtext", "megatron", "torchtitan", "torch"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama2", vocab=65536)  # two 8 MB embedding tables: more than the 2 MB disk holds
    return save_maxtext_run(tmp_path_factory.mktemp("src") / "run", random_maxtext_params(spec), step=1).parent


@pytest.mark.parametrize("target", TARGETS + ["torch-file"])
def test_full_disk_is_one_error_and_leaves_nothing(run_dir, tmp_path, capsys, target):
    with small_tmpfs(tmp_path / "disk") as disk:
        (disk / "keep.txt").write_text("already here\n")
        dst = disk / ("model.pt" if target == "torch-file" else "out")
        fmt = "torch" if target == "torch-file" else target
        before = snapshot(disk)
        code, _, err = run_cli(["convert", run_dir, dst, "--to", fmt, "--model", "llama2", "-q"], capsys)
        one_error_line(code, err, f"cannot write {dst}", "No space left on device", "the partial output was removed")
        assert_unchanged(before, disk)


def test_full_disk_in_a_child_process_is_not_an_interpreter_abort(run_dir, tmp_path):
    # torch's C++ zip writer used to abort the interpreter (exit 134) from a destructor on ENOSPC.
    from hostile_tools import run_subprocess

    with small_tmpfs(tmp_path / "disk") as disk:
        result = run_subprocess(["convert", run_dir, disk / "out", "--to", "torch", "--model", "llama2", "-q"])
        assert result.returncode == 1, result.stderr
        assert "terminate called" not in result.stderr and "Traceback" not in result.stderr
        assert list(disk.iterdir()) == []


@pytest.mark.parametrize("target", ["hf", "torch"])
def test_read_only_parent(run_dir, tmp_path, capsys, target):
    with small_tmpfs(tmp_path / "disk", size="1m") as disk:
        (disk / "models").mkdir()
        remount_read_only(disk)
        fails_cleanly(["convert", run_dir, disk / "models" / "out", "--to", target, "--model", "llama2", "-q"], capsys, disk, "Read-only file system", "Nothing was written")


def test_read_only_destination(run_dir, tmp_path, capsys):
    dst = tmp_path / "old-export"
    code, _, err = run_cli(["convert", run_dir, dst, "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(dst), str(dst)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot bind-mount {dst} read-only (the suite needs root): {mounted.stderr}"
    try:
        fails_cleanly(["convert", run_dir, dst, "--to", "hf", "--model", "llama2", "-q", "--overwrite"], capsys, tmp_path, "is a mount point, which cannot be replaced")
    finally:
        subprocess.run(["umount", "-l", str(dst)], capture_output=True)


def test_empty_mount_point_is_refused_before_converting(run_dir, tmp_path, capsys):
    with small_tmpfs(tmp_path / "volume", size="64m") as volume:
        fails_cleanly(["convert", run_dir, volume, "--to", "hf", "--model", "llama2", "-q"], capsys, tmp_path, "is a mount point, which cannot be replaced; write to a new folder inside it")
        code, _, err = run_cli(["convert", run_dir, volume / "model", "--to", "hf", "--model", "llama2", "-q"], capsys)
        assert code == 0, err
        assert sorted(p.name for p in volume.iterdir()) == ["model"]


# --------------------------------------------------- stdout that cannot be written


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    params = random_maxtext_params(tiny_spec("llama2"))
    return save_maxtext_run(tmp_path_factory.mktemp("small") / "run", params, step=1).parent


def _with_stdout(argv: list, stdout: str, cwd) -> subprocess.CompletedProcess:
    """`python -m maxckpt *argv` with stdout on /dev/full (every write fails with ENOSPC) or closed (`>&-`)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    redirect = {"full": ">/dev/full", "closed": ">&-"}[stdout]
    command = [sys.executable, "-m", "maxckpt", *map(str, argv)]
    return subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "bash", *command], cwd=cwd, env=env,
                          stderr=subprocess.PIPE, text=True, timeout=300)


@pytest.mark.parametrize("stdout", ["full", "closed"])
@pytest.mark.parametrize("command", ["convert", "ls", "config-json", "version"])
def test_output_that_cannot_be_written_never_changes_the_exit_code(small_run, tmp_path, stdout, command):
    dst = tmp_path / "hf"
    argv = {
        "convert": ["convert", small_run / "checkpoints", dst, "--to", "hf", "--model", "llama2", "-q"],
        "ls": ["ls", small_run],
        "config-json": ["config", "show", REPO / "configs" / "keep_last_n_async.yml", "--json"],  # typer.echo, not rich
        "version": ["--version"],
    }[command]
    result = _with_stdout(argv, stdout, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error:" not in result.stderr, result.stderr
    if command == "convert":  # the work was done and committed: printing its report failed
        assert (dst / "config.json").is_file() and not list(tmp_path.glob("hf.tmp-*"))
    failing = _with_stdout(["ls", tmp_path / "nothing-here"], stdout, tmp_path)  # a failed command still fails
    assert failing.returncode == 1 and "Traceback" not in failing.stderr
    assert failing.stderr.count("error:") == 1 and "no such directory" in failing.stderr, failing.stderr
