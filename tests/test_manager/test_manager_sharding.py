"""Specification: a checkpoint restores onto another mesh, partitioning or device count when the target carries shardings.

JAX fixes the number of (fake CPU) devices when it starts, so each side runs
in its own process: saved with 8 devices, restored with 8 on other meshes,
then in a fresh process with 2 devices and with 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parents[1] / "procs" / "reshard.py"


def run_child(mode: str, directory: Path, devices: int) -> str:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), mode, str(directory)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{mode} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.slow
def test_restore_onto_other_meshes_and_device_counts(tmp_path: Path) -> None:
    out = run_child("save", tmp_path / "ckpt", devices=8)
    assert "ok 8 devices -> 2x4 mesh, other partitioning: 8 devices, w shards [(16, 16)]" in out
    assert "ok 8 devices -> 4 of them: 4 devices, w shards [(64, 8)]" in out
    assert "ok single-replica restore on 2x4: 8 devices, w shards [(16, 32)]" in out
    out = run_child("restore", tmp_path / "ckpt", devices=2)
    assert "ok saved on 8 devices -> restored on 2: 2 devices, w shards [(32, 32)]" in out
    assert "ok saved on 8 devices -> restored on 1: 1 devices, w shards [(64, 32)]" in out
    assert "ok no target: first local device" in out
