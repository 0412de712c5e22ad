"""Ctrl-C, SIGTERM and SIGKILL during `maxckpt convert`: no `DST.tmp-*` survives (stale ones are cleaned next time).

The conversions run in child processes on a model big enough (~70 MB) that
the signal lands while tensors are being written: the test waits for the
temporary folder to appear, then signals.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import run_cli
from hostile_tools import REPO
from maxckpt.conversion.staging import OWNER_FILE, REPLACED, clean_stale, owner_record

TARGETS = ["hf", "maxtext", "megatron", "torchtitan", "torch"]


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama2", vocab=262144, layers=2)  # two 32 MB float32 embedding tables
    return save_maxtext_run(tmp_path_factory.mktemp("big") / "run", random_maxtext_params(spec), step=1).parent


def _start(src: Path, dst: Path, target: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "maxckpt", "convert", str(src), str(dst), "--to", target, "--model", "llama2", "-q"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _temporaries(dst: Path) -> list[Path]:
    return [p for p in dst.parent.iterdir() if p.name.startswith(dst.name + ".tmp-")]


def _signal_while_writing(proc: subprocess.Popen, dst: Path, sig: int) -> bool:
    """Send `sig` as soon as the output's temporary folder holds its owner record; False if it finished first."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        tmps = _temporaries(dst)
        if tmps and (tmps[0] / OWNER_FILE).is_file():
            proc.send_signal(sig)
            return True
        time.sleep(0.005)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_removes_the_temporary_output(big_run, tmp_path, target, sig):
    dst = tmp_path / ("out.pt" if target == "torch" else "out")
    for attempt in range(3):
        proc = _start(big_run, dst, target)
        signalled = _signal_while_writing(proc, dst, sig)
        _, err = proc.communicate(timeout=240)
        assert signalled, f"the conversion finished before it could be interrupted: {err}"
        assert "Traceback" not in err, err
        left = sorted(p.name for p in tmp_path.iterdir())
        if proc.returncode == 130:  # typer's exit code for Ctrl-C; SIGTERM is turned into the same
            assert left == [], (left, err)  # neither DST nor DST.tmp-*
            return
        if proc.returncode == -sig and left == []:
            return  # ended by the signal itself (Python restores default handlers as it shuts down): nothing left
        # On a loaded machine the signal can land after the output was renamed into place (even
        # during interpreter shutdown): then DST is complete and nothing else is left. Try again.
        assert sorted(p.name for p in tmp_path.iterdir()) == [dst.name], (proc.returncode, err)
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    pytest.fail("the signal never landed while the conversion was writing")


@pytest.mark.slow
def test_killed_conversion_is_cleaned_by_the_next_one(big_run, tmp_path, capsys):
    dst = tmp_path / "out"
    for attempt in range(3):  # on a loaded machine the kill may land after the conversion finished: retry
        proc = _start(big_run, dst, "hf")
        assert _signal_while_writing(proc, dst, signal.SIGKILL)
        proc.communicate(timeout=120)
        left = _temporaries(dst)
        if left:
            break
        shutil.rmtree(dst)
    assert len(left) == 1 and json.loads((left[0] / OWNER_FILE).read_text())["pid"] == proc.pid
    code, _, err = run_cli(["convert", big_run, dst, "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    assert f"removed the stale temporary folder {left[0]}" in " ".join(err.split())
    assert _temporaries(dst) == [] and (dst / "config.json").is_file()


def _fake_temporary(dst: Path, **owner) -> Path:
    tmp = dst.parent / f"{dst.name}.tmp-fake{len(_temporaries(dst))}"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"half written")
    (tmp / OWNER_FILE).write_text(json.dumps({**owner_record(), **owner}))
    return tmp


def test_live_owner_is_left_alone_and_a_reused_pid_is_not_mistaken_for_it(tmp_path):
    dst = tmp_path / "out"
    live = _fake_temporary(dst)  # this very process: alive
    reused = _fake_temporary(dst, process_start=1)  # our pid, but a process that started at another time
    gone = _fake_temporary(dst, pid=2**22 + 12345)  # above pid_max: no such process
    other_host = _fake_temporary(dst, host=socket.gethostname() + "-elsewhere")
    rebooted = _fake_temporary(dst, boot_id="00000000-0000-0000-0000-000000000000")
    orphan = tmp_path / "out.tmp-noowner"
    orphan.mkdir()
    notes = " ".join(clean_stale(dst))
    assert live.is_dir() and f"left {live} alone: a conversion (pid {os.getpid()}" in notes
    assert other_host.is_dir() and "another host" in notes
    assert orphan.is_dir() and f"left {orphan} alone: a temporary folder with no owner record" in notes
    for stale in (reused, gone, rebooted):
        assert not stale.exists() and f"removed the stale temporary folder {stale}" in notes


def test_destination_parked_by_a_killed_replacement_is_restored(tmp_path):
    dst = tmp_path / "out"
    tmp = _fake_temporary(dst, pid=2**22 + 1)
    (tmp / REPLACED).mkdir()
    (tmp / REPLACED / "config.json").write_text("{}")  # the user's old dst, moved aside just before the kill
    notes = " ".join(clean_stale(dst))
    assert (dst / "config.json").read_text() == "{}" and not tmp.exists()
    assert f"restored {dst}" in notes
