"""Running MaxText's real trainer (plain, or under maxckpt) from the tests, in the MaxText venv."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from maxckpt.containers.orbax import OrbaxReader
from tests.maxtext_env import REPO, run_env

# A model MaxText trains in well under a second per step on one CPU core.
TINY = {
    "hardware": "cpu",
    "skip_jax_distributed_system": True,
    "dataset_type": "synthetic",
    "per_device_batch_size": 1,
    "max_target_length": 16,
    "base_emb_dim": 64,
    "base_num_query_heads": 2,
    "base_num_kv_heads": 2,
    "base_mlp_dim": 128,
    "base_num_decoder_layers": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "enable_checkpointing": True,
    "async_checkpointing": True,
    # The LR schedule does not depend on `steps`, so a run cut short and resumed
    # to 12 steps trains exactly like one run of 12.
    "learning_rate_schedule_steps": 12,
    "enable_goodput_recording": False,
}
TIMEOUT = 600


def write_overlay(path: Path, **keys: object) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"base_config": "base.yml", **TINY, **keys}, sort_keys=False))
    return path


def args(**keys: object) -> list[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]


@dataclass
class Run:
    python: Path
    overlay: Path
    out: Path  # base_output_directory

    def maxckpt_cmd(self, run_name: str, *extra: str) -> list[str]:
        return [str(self.python), "-m", "maxckpt", "maxtext", "train", str(self.overlay),
                f"run_name={run_name}", f"base_output_directory={self.out}", *extra]

    def plain_cmd(self, run_name: str, *extra: str) -> list[str]:
        """Plain MaxText on the same keys (the overlay must hold no maxckpt_* key)."""
        return [str(self.python), "-m", "maxtext.trainers.pre_train.train", str(self.overlay),
                f"run_name={run_name}", f"base_output_directory={self.out}", *extra]

    def run(self, cmd: list[str], log: str, check: bool = True) -> subprocess.CompletedProcess:
        with open(self.out / log, "w") as fh:
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=run_env(), cwd=REPO, timeout=TIMEOUT)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{self.log(log)[-6000:]}")
        return done

    def start(self, cmd: list[str], log: str) -> subprocess.Popen:
        fh = open(self.out / log, "w")
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=run_env(), cwd=REPO)

    def log(self, name: str) -> str:
        return (self.out / name).read_text(errors="replace")

    def checkpoints(self, run_name: str) -> Path:
        return self.out / run_name / "checkpoints"


def committed_steps(checkpoints: Path) -> list[int]:
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists())


def tmp_dirs(checkpoints: Path) -> list[Path]:
    return [p for p in checkpoints.iterdir() if "orbax-checkpoint-tmp" in p.name] if checkpoints.is_dir() else []


def read_all(step_dir: Path) -> dict[str, np.ndarray]:
    """Every array of a checkpoint step (params, optimizer state, step), by name."""
    with OrbaxReader(step_dir) as reader:
        return {name: reader.read(name) for name in reader.tensors()}


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.005) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}")
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def completed_steps(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"completed step: (\d+)", log)]


def layout(step_dir: Path) -> set[str]:
    """The files of a step, with the content-addressed data file names (`d/<hash>`) blanked out."""
    out = set()
    for p in step_dir.rglob("*"):
        rel = p.relative_to(step_dir).as_posix()
        out.add(re.sub(r"/d/[0-9a-f]+$", "/d/*", rel))
    return out


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    os.kill(proc.pid, sig)
