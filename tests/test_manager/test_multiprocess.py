"""Specification: two JAX processes (jax.distributed on 127.0.0.1) save, restore and prune one sharded state.

Each process holds half of the array; only process 0 deletes old checkpoints.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parents[1] / "procs" / "two_process_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_save_restore_and_only_process_0_deletes(tmp_path: Path) -> None:
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROGRAM), str(i), str(port), str(ckpt), str(logs)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for i, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"process {i} failed:\n{out[-4000:]}"
    assert "OK process 0 steps [3, 4] rows 0:4" in outputs[0]
    assert "OK process 1" in outputs[1] and "rows 4:8" in outputs[1]
    assert sorted(os.listdir(ckpt)) == [".maxckpt.lock", "3", "4"]  # process 0 held the lock
    assert not (logs / "deletions.1").exists(), (logs / "deletions.1").read_text()
    assert (logs / "deletions.0").read_text().split("\n")[:-1] == [
        line for s in range(3) for line in (f"retire {s}", f"rmtree {s}.maxckpt-deleting")
    ]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_on_a_locked_run_dir_both_stop_at_once(tmp_path: Path) -> None:
    from maxckpt.manager.run_lock import RunDirLock

    ckpt = tmp_path / "ckpt"
    held = RunDirLock.acquire(ckpt)  # another job is saving there
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("XLA_FLAGS", None)
    program = Path(__file__).parents[1] / "procs" / "two_process_locked.py"
    procs = [
        subprocess.Popen([sys.executable, str(program), str(i), str(port), str(ckpt)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        held.release()
    assert "RAISED RunDirBusyError: another process (host " in outputs[0] and f"is saving to {ckpt};" in outputs[0], outputs[0][-3000:]
    assert f"RAISED CheckpointSaveError: process 0 could not start saving to {ckpt}" in outputs[1], outputs[1][-3000:]
    assert "STARTED" not in outputs[0] + outputs[1]
    assert sorted(os.listdir(ckpt)) == [".maxckpt.lock"]
