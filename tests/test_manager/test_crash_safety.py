"""Crash safety: a training process SIGKILLed at any instant of a save or of retention.

After every kill: the newest committed step restores bit for bit, neither
maxckpt nor plain Orbax lists a partial or half-deleted step, and a restarted
run resumes from the newest committed step and goes on saving and pruning.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orbax.checkpoint as ocp
import pytest
from etils import epath

from maxckpt.manager import pytree_io
from maxckpt.storage.run_dirs import scan_run_dir
from manager_states import assert_same, make_state

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parents[1] / "procs" / "crash_trainer.py"
KEEP, KEEP_PERIOD = 2, 5  # as in crash_trainer.py
KILLS_PER_RUN = 3


class Child:
    """The training process, with its stdout lines arriving on a queue."""

    def __init__(self, root: Path, mode: str, until: int, log: Path, *extra: str) -> None:
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        }
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(root), "--mode", mode, "--until", str(until), *extra],
            stdout=subprocess.PIPE, stderr=open(log, "a"), text=True, env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("<EOF>")

    def expect(self, prefix: str, timeout: float = 120.0) -> str:
        """Wait for the next line starting with `prefix`; fail on EOF."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"no {prefix!r} line in {timeout}s; child log:\n{self.log.read_text()[-3000:]}")
            if line.startswith(prefix):
                return line
            if line == "<EOF>":
                raise AssertionError(
                    f"child exited ({self.proc.wait()}) before {prefix!r}; log:\n{self.log.read_text()[-3000:]}"
                )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def check_after_crash(root: Path) -> list[int]:
    """The invariants a crash must leave; returns the committed steps."""
    committed = [s.step for s in scan_run_dir(root, "orbax").committed]
    if root.exists():
        # What MaxText (plain Orbax) would resume from: exactly the committed steps, nothing partial.
        plain = ocp.CheckpointManager(epath.Path(root), options=ocp.CheckpointManagerOptions(read_only=True))
        assert plain.all_steps() == committed, (plain.all_steps(), committed, sorted(os.listdir(root)))
    if committed:
        newest = committed[-1]
        restored = pytree_io.restore_tree(epath.Path(root / str(newest) / "items"), make_state(0))
        assert_same(restored, make_state(newest))
    return committed


def finish_and_check(root: Path, mode: str, log: Path, ever_committed: set[int]) -> None:
    """Restart once more, let it run to the end, and check it resumed, saved and pruned."""
    latest = check_after_crash(root)
    resume_from = latest[-1] if latest else None
    until = (resume_from if resume_from is not None else -1) + 1 + 6
    child = Child(root, mode, until, log)
    first = child.expect("RESUMED" if resume_from is not None else "FRESH")
    assert first == (f"RESUMED {resume_from}" if resume_from is not None else "FRESH")
    child.expect("DONE")
    assert child.proc.wait(timeout=60) == 0
    run = scan_run_dir(root, "orbax")
    final = [s.step for s in run.committed]
    assert [s.state for s in run.steps] == ["committed"] * len(run.steps), "leftovers were not cleaned up"
    assert final[-KEEP:] == [until - 2, until - 1]
    assert all(s % KEEP_PERIOD == 0 for s in final[:-KEEP]), final
    assert {s for s in ever_committed if s % KEEP_PERIOD == 0} <= set(final), "a keep_period step was lost"
    check_after_crash(root)


@pytest.mark.slow
@pytest.mark.parametrize("mode,seed", [("sync", 0), ("async", 1)])
def test_sigkill_at_random_instants_of_saving_and_pruning(tmp_path: Path, mode: str, seed: int) -> None:
    rng = random.Random(seed)
    root, log = tmp_path / "checkpoints", tmp_path / "child.log"
    ever_committed: set[int] = set()
    for _ in range(KILLS_PER_RUN):
        child = Child(root, mode, 10_000, log)
        child.expect("SAVED")  # JAX is up and the loop is saving (and pruning) every step
        time.sleep(rng.uniform(0.0, 0.8))
        child.kill()
        ever_committed |= set(check_after_crash(root))
    finish_and_check(root, mode, log, ever_committed)


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_deletion(tmp_path: Path) -> None:
    root, log = tmp_path / "checkpoints", tmp_path / "child.log"
    child = Child(root, "async", 10_000, log, "--stall-deleting")
    doomed = Path(child.expect("DELETING").split(" ", 1)[1])
    child.kill()  # retention dies with a checkpoint half deleted
    assert doomed.name.endswith(".maxckpt-deleting") and doomed.exists()
    assert not (doomed / "commit_success.txt").exists() and (doomed / "items").exists()
    committed = check_after_crash(root)
    assert int(doomed.name.split(".")[0]) not in committed
    finish_and_check(root, "async", log, set(committed))
    assert not doomed.exists()
