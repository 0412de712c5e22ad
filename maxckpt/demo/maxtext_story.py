"""`maxckpt demo --maxtext`: the demo story on MaxText's real trainer (needs the maxtext extra).

1. MaxText's own pre-training entry point trains a tiny model on synthetic
   data under `maxckpt maxtext train` (async saves every 5 steps, the newest
   3 kept plus every 20th step, HF export on completion);
2. the trainer is SIGKILLed while an asynchronous save is being written
   (the save is left partial on disk);
3. the same command again resumes from the newest *committed* step, moves
   the partial save aside, finishes, prunes and exports the final step;
4. a summary (also `summary.json`) and the commands to explore the result.

>>> result = run_maxtext_demo("maxckpt_demo", steps=30)   # doctest: +SKIP
>>> result["resumed_from"], result["kept_steps"]          # doctest: +SKIP
(15, [0, 20, 25, 28, 29])
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from maxckpt.demo import workdir
from maxckpt.errors import MaxckptError

OVERLAY = {
    "base_config": "base.yml",
    "hardware": "cpu",
    "skip_jax_distributed_system": True,
    "dataset_type": "synthetic",
    "per_device_batch_size": 1,
    "max_target_length": 32,
    "base_emb_dim": 128,
    "base_num_query_heads": 4,
    "base_num_kv_heads": 4,
    "base_mlp_dim": 256,
    "base_num_decoder_layers": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "dtype": "float32",
    "enable_checkpointing": True,
    "async_checkpointing": True,
    "checkpoint_period": 5,
    "max_num_checkpoints_to_keep": 3,
    "maxckpt_keep_period": 20,
    "maxckpt_export_on_completion": ["hf"],
    "maxckpt_export_dtype": "float32",
}


def _partial_saves(checkpoints: Path) -> list[Path]:
    return [p for p in checkpoints.iterdir() if "orbax-checkpoint-tmp" in p.name] if checkpoints.is_dir() else []


def _committed(checkpoints: Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(
        int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists()
    )


def run_maxtext_demo(directory: str | os.PathLike, steps: int = 30, console: Console | None = None) -> dict[str, Any]:
    """Run the story in `directory`; returns what happened (also written to `summary.json`)."""
    from maxckpt.maxtext.train import _require_maxtext

    _require_maxtext()
    if steps < 12:
        raise MaxckptError(f"--steps {steps}: the MaxText demo needs at least 12 steps (saves every 5)")
    console = console or Console(stderr=True)
    root = workdir.prepare(directory)
    overlay = root / "overlay.yml"
    overlay.write_text(yaml.safe_dump(OVERLAY, sort_keys=False))
    checkpoints = root / workdir.RUN_NAME / "checkpoints"
    cmd = [sys.executable, "-m", "maxckpt", "maxtext", "train", str(overlay), f"run_name={workdir.RUN_NAME}",
           f"base_output_directory={root}", f"steps={steps}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.time()

    console.print(f"[bold]1.[/] MaxText trains {steps} steps under maxckpt: {' '.join(cmd[1:])}")
    crash_after = max(5, (steps * 6 // 10) // 5 * 5)
    with open(root / workdir.LOGS / "train_crashed.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        killed_during = None
        while proc.poll() is None:
            done = _committed(checkpoints)
            if done and done[-1] >= crash_after and _partial_saves(checkpoints):
                proc.send_signal(signal.SIGKILL)
                killed_during = [p.name for p in _partial_saves(checkpoints)]
                break
            time.sleep(0.002)
        proc.wait()
    if killed_during:
        console.print(
            f"[bold]2.[/] SIGKILL while writing {', '.join(killed_during)}; committed: {_committed(checkpoints)}"
        )
    else:
        console.print("[bold]2.[/] the run finished before a save could be caught in flight (no crash this time)")
    resumed_from = _committed(checkpoints)[-1] if killed_during else None

    console.print("[bold]3.[/] the same command again: resume, prune, export")
    with open(root / workdir.LOGS / "train_resumed.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        raise MaxckptError(
            f"the resumed MaxText run failed (exit {rc}); see {root / workdir.LOGS / 'train_resumed.log'}"
        )
    resumed_log = (root / workdir.LOGS / "train_resumed.log").read_text(errors="replace")
    found = re.search(r"restoring from this run's directory step (\d+)", resumed_log)
    run_summary = json.loads((root / workdir.RUN_NAME / "maxckpt_summary.json").read_text())
    result = {
        "steps": steps,
        "killed_during": killed_during,
        "resumed_from": int(found.group(1)) if found else None,
        "expected_resume": resumed_from,
        "kept_steps": run_summary["kept_steps"],
        "exports": run_summary["exports"],
        "seconds": round(time.time() - start, 1),
        "commands": [
            f"maxckpt ls {checkpoints}",
            f"maxckpt inspect {checkpoints / str(steps - 1)}",
            f"maxckpt verify {checkpoints / str(steps - 1)} {run_summary['exports'].get('hf', '')} --model llama2",
        ],
    }
    (root / workdir.SUMMARY).write_text(json.dumps(result, indent=2))
    console.print(
        f"[bold]4.[/] resumed from step {result['resumed_from']}; kept {result['kept_steps']}; "
        f"exported {', '.join(f'{k}: {v}' for k, v in result['exports'].items()) or 'nothing'}"
    )
    return result
