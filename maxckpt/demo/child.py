"""Running the demo's training in a child process, and killing it to inject a crash.

The parent starts `python -m maxckpt.demo.train`, reads its JSON event lines
as they come (one per training step), forwards them to a callback (progress
bars), and - when asked - sends SIGKILL once the child reports a given step.
The child waits there for the kill (`--pause-after`), so the crash point is
that step whatever the machine's load; no clean-up code runs in the child,
exactly like a preempted VM or an OOM kill, so a save still in flight is cut
short (or, when it committed first, the run resumes from it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from maxckpt.demo.train import EVENT_PREFIX
from maxckpt.errors import MaxckptError


@dataclass
class ChildRun:
    """What one training process did, from its events."""

    events: list[dict[str, Any]] = field(default_factory=list)
    killed_at: int | None = None  # step after which it was SIGKILLed
    returncode: int | None = None
    log: Path | None = None

    @property
    def start(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == "start"), None)

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "step"]

    @property
    def saves(self) -> list[int]:
        """Steps whose save started (async: not necessarily committed)."""
        out = [e["step"] for e in self.steps if e["saved"]]
        out += [e["step"] for e in self.events if e["event"] == "final_save" and e["saved"]]
        return out

    @property
    def finished(self) -> bool:
        return any(e["event"] == "done" for e in self.events)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_training(
    config: Path,
    overrides: list[str],
    steps: int,
    *,
    log: Path,
    env: dict[str, str],
    kill_at: int | None = None,
    seed: int = 0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> ChildRun:
    """Run one training process to the end, or SIGKILL it once it reports step `kill_at`."""
    cmd = [
        sys.executable,
        "-m",
        "maxckpt.demo.train",
        "--config",
        os.fspath(config),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
    ]
    for item in overrides:
        cmd += ["--set", item]
    if kill_at is not None:
        cmd += ["--pause-after", str(kill_at)]
    run = ChildRun(log=log)
    with open(log, "w") as err:
        # A paused child waits on its stdin: EOF (this process gone) is its cue to exit.
        stdin = subprocess.PIPE if kill_at is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **env}, bufsize=1
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.startswith(EVENT_PREFIX):
                    err.write(line)  # a library printing to stdout: keep it in the log
                    continue
                event = json.loads(line[len(EVENT_PREFIX):])
                run.events.append(event)
                if on_event is not None:
                    on_event(event)
                if kill_at is not None and event["event"] == "step" and event["step"] >= kill_at:
                    os.kill(proc.pid, signal.SIGKILL)  # the injected crash: no clean-up runs
                    run.killed_at = event["step"]
                    break
        finally:
            if proc.poll() is None and run.killed_at is None:
                proc.kill()  # the parent is failing (or interrupted): do not leave the child behind
            run.returncode = proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    if run.killed_at is None and (run.returncode != 0 or not run.finished):
        raise MaxckptError(
            f"the demo's training process failed (exit code {run.returncode}); last lines of {log}:\n{_tail(log)}"
        )
    if kill_at is not None and run.killed_at is None:
        raise MaxckptError(f"the training process finished before step {kill_at}, where the demo meant to kill it")
    return run
