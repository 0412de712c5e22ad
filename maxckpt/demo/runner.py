"""`maxckpt demo`: train, crash, resume, prune, convert, verify - on local files, in about a minute.

The steps, each a real use of maxckpt:

1. a tiny llama3.1-style model in MaxText's layout trains with optax on
   synthetic data in a child process, under `CheckpointManager.from_config(
   load_config("configs/demo.yml"))`: async saves every 5 steps, the newest 3
   kept plus every 20th step;
2. the child is SIGKILLed right after a save starts (an injected crash: it
   waits at that step for the kill, and the save in flight is usually cut
   short and left partial; when it commits first, the run resumes from it);
3. a fresh process resumes from the newest *committed* checkpoint and
   finishes, retention pruning as it goes;
4. the final save exports the final step to HF, Megatron and TorchTitan
   (the overlay's `maxckpt_export_on_completion`, run by the manager in the
   training process); the parent checks each export tensor by tensor against
   the MaxText checkpoint and compares the HF copy's logits in transformers
   with maxckpt's JAX reference of MaxText's forward pass;
5. a summary table, `summary.json`, and the commands to explore the result.

>>> result = run_demo("maxckpt_demo", steps=40)   # doctest: +SKIP
>>> result.ok, result.resumed_from, result.logits_max_abs_diff   # doctest: +SKIP
(True, 20, 2.9e-06)
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from maxckpt.config import bundled_configs_dir, load_config
from maxckpt.demo import DEFAULT_DIR, DEFAULT_STEPS, workdir
from maxckpt.demo.child import ChildRun, run_training
from maxckpt.demo.report import DemoResult, ExportResult, rel_path
from maxckpt.errors import ConfigError, MaxckptError
from maxckpt.explore.steps import dir_bytes
from maxckpt.manager.export import export_model
from maxckpt.storage.run_dirs import PARTIAL, scan_run_dir

LOGITS_ATOL = 1e-4


def demo_config_path() -> Path:
    """The bundled overlay the demo trains under (`configs/demo.yml`)."""
    return (bundled_configs_dir() / "demo.yml").resolve()  # through the package's configs link, to the real file


def default_crash_step(steps: int, period: int) -> int:
    """The first save step at or after 60% of the run: late enough to have checkpoints, early enough to resume.

    >>> default_crash_step(40, 5), default_crash_step(12, 5)
    (25, 10)
    """
    step = period * math.ceil(0.6 * steps / period)
    return max(period, min(step, (steps - 2) // period * period))


class _TrainingBar:
    """A progress bar for one training process, fed by the child's events."""

    def __init__(self, progress: Progress, steps: int, label: str) -> None:
        self.progress = progress
        self.task = progress.add_task(label, total=steps, loss="")

    def __call__(self, event: dict[str, Any]) -> None:
        if event["event"] == "start":
            self.progress.update(self.task, completed=event["start"])
        elif event["event"] == "step":
            saved = " [cyan]saved[/]" if event["saved"] else ""
            self.progress.update(self.task, completed=event["step"] + 1, loss=f"loss {event['loss']:.3f}{saved}")
        elif event["event"] == "finishing":
            formats = ", ".join(event["exports"]) or "nothing"
            self.progress.update(self.task, loss=f"final save, then exporting to {formats} ...")
        elif event["event"] == "final_save":
            self.progress.update(self.task, loss=f"final save and exports done in {event['seconds']:.1f} s")


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(), console=console,
    )


def saves_on_disk(checkpoints: Path) -> dict[str, list[int]]:
    """The committed steps, and the saves cut short (partial), in `checkpoints`.

    A ``*.maxckpt-deleting`` folder is neither: it is a step retention was
    removing when the process died, not a lost save.
    """
    run = scan_run_dir(checkpoints, "orbax")
    return {
        "committed": [s.step for s in run.steps if s.committed],
        "partial": [s.step for s in run.steps if s.state == PARTIAL],
    }


def _train(
    root: Path,
    checkpoints: Path,
    cfg_path: Path,
    overrides: list[str],
    steps: int,
    crash_step: int,
    seed: int,
    console: Console,
) -> tuple[ChildRun, ChildRun, dict[str, list[int]], float]:
    env = {
        "JAX_PLATFORMS": "cpu",
        # A compilation cache shared by both processes: the resumed one skips most of XLA's compile.
        "JAX_COMPILATION_CACHE_DIR": os.fspath(root / workdir.JAX_CACHE),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    logs = root / workdir.LOGS
    t0 = time.perf_counter()
    with _progress(console) as progress:
        bar = _TrainingBar(progress, steps, "training, process 1")
        first = run_training(
            cfg_path, overrides, steps, log=logs / "train-1.log", env=env, kill_at=crash_step, seed=seed, on_event=bar
        )
    at_crash = saves_on_disk(checkpoints)
    partial = ", ".join(map(str, at_crash["partial"])) or "none"
    console.print(
        f"[bold red]crash:[/] SIGKILL after step {first.killed_at}; on disk: committed steps "
        f"{', '.join(map(str, at_crash['committed'])) or 'none'}, partial (cut short) {partial}"
    )
    with _progress(console) as progress:
        bar = _TrainingBar(progress, steps, "training, process 2")
        second = run_training(cfg_path, overrides, steps, log=logs / "train-2.log", env=env, seed=seed, on_event=bar)
    start = second.start or {}
    console.print(
        f"[bold green]resumed[/] from step {start.get('resumed_from')} in a fresh process and finished step {steps - 1}"
    )
    return first, second, at_crash, time.perf_counter() - t0


def _quiet_transformers() -> None:
    """No per-load progress bars or token-id warnings from transformers between the demo's own lines.

    The exports keep llama3.1's bos/eos ids (128000/128001), as MaxText's own
    exporter does, which transformers flags for a 256-token vocabulary.
    """
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return  # verify_logits reports the missing extra
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _check_exports(
    cfg, checkpoint_dir: Path, seconds: dict[str, float], console: Console
) -> tuple[list[ExportResult], Any]:
    """Check what the final save exported: each format tensor by tensor, the HF copy by logits."""
    from maxckpt.conversion.verify import verify, verify_logits
    from maxckpt.explore.tree import inspect_checkpoint

    _quiet_transformers()
    model = export_model(cfg)
    exports: list[ExportResult] = []
    logits = None
    for fmt in cfg.maxckpt_export_on_completion:
        dst = Path(cfg.export_directory) / fmt
        if not dst.exists():
            raise MaxckptError(
                f"the final save did not export to {fmt}: {dst} is missing (see "
                f"{Path(cfg.base_output_directory) / workdir.LOGS})"
            )
        with console.status(f"checking the {fmt} export against the MaxText checkpoint ..."):
            totals = inspect_checkpoint(dst).totals()
            check = verify(checkpoint_dir, dst, model=model)
        exports.append(
            ExportResult(
                fmt, os.fspath(dst), totals.tensors, totals.bytes, seconds.get(fmt, math.nan), check.max_abs_diff
            )
        )
        console.print(
            f"[green]{fmt}[/] export {escape(rel_path(os.fspath(dst)))}: max |diff| vs the MaxText checkpoint, through "
            f"the layouts: {check.max_abs_diff:.3g}"
        )
        if fmt == "hf":
            with console.status("checking logits: JAX reference of MaxText vs transformers ..."):
                logits = verify_logits(checkpoint_dir, dst, model=model, atol=LOGITS_ATOL)
            console.print(
                "[green]logits[/] of the HF export in transformers vs the JAX reference: max |diff| "
                f"{logits.max_abs_diff:.3g}"
            )
    return exports, logits


def run_demo(
    directory: str | os.PathLike = DEFAULT_DIR,
    steps: int = DEFAULT_STEPS,
    *,
    console: Console | None = None,
    seed: int = 0,
    crash_step: int | None = None,
) -> DemoResult:
    """Run the whole demo in `directory` and return what happened (also written to `summary.json`)."""
    console = console or Console(stderr=True)
    t_start = time.perf_counter()
    cfg_path = demo_config_path()
    root = Path(directory).expanduser().absolute()
    overrides = [f"base_output_directory={root}", f"run_name={workdir.RUN_NAME}"]
    cfg = load_config(cfg_path, *overrides)
    period = cfg.checkpoint_period
    if steps < 2 * period + 2:
        raise ConfigError(
            f"--steps {steps} is too short for the demo: with checkpoint_period {period} it needs at least "
            f"{2 * period + 2} steps"
        )
    crash = default_crash_step(steps, period) if crash_step is None else crash_step
    if not period <= crash < steps - 1:
        raise ConfigError(
            f"crash step {crash} must lie between the first save (step {period}) and the last step ({steps - 1})"
        )

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:  # the exports need torch, the logits check transformers
        raise ConfigError(
            f"the demo needs {' and '.join(missing)}: pip install 'maxckpt[all]' (or the torch and hf extras)"
        )
    workdir.prepare(root)
    checkpoints = Path(cfg.checkpoint_dir)
    console.rule("[bold]maxckpt demo")
    console.print(
        f"config {escape(rel_path(os.fspath(cfg_path)))}: async saves every {period} steps, keep the newest "
        f"{cfg.max_num_checkpoints_to_keep} + every {cfg.maxckpt_keep_period}th step; {steps} steps; "
        f"the training process is killed after step {crash}"
    )
    first, second, at_crash, train_seconds = _train(root, checkpoints, cfg_path, overrides, steps, crash, seed, console)

    kept = saves_on_disk(checkpoints)["committed"]
    saved = sorted(set(first.saves) | set(second.saves))
    lost = sorted(set(at_crash["partial"]))
    pruned = sorted(set(saved) - set(kept) - (set(lost) - set(second.saves)))
    losses = {e["step"]: e["loss"] for e in first.steps + second.steps}  # the resumed run overwrites re-trained steps

    export_seconds = {e["format"]: e["seconds"] for e in second.events if e["event"] == "export"}
    console.print(
        f"the final save exported step {steps - 1} to {', '.join(cfg.maxckpt_export_on_completion)} "
        f"(maxckpt_export_on_completion) in {sum(export_seconds.values()):.1f} s"
    )
    console.rule("[bold]checks")
    exports, logits = _check_exports(cfg, checkpoints, export_seconds, console)
    result = DemoResult(
        directory=os.fspath(root),
        run_dir=os.fspath(Path(cfg.run_directory)),
        checkpoint_dir=os.fspath(checkpoints),
        config=os.fspath(cfg_path),
        steps=steps,
        period=period,
        keep=cfg.max_num_checkpoints_to_keep,
        keep_period=cfg.maxckpt_keep_period,
        crash_step=first.killed_at,
        resumed_from=(second.start or {}).get("resumed_from"),
        committed_at_crash=at_crash["committed"],
        partial_at_crash=at_crash["partial"],
        saved_steps=saved,
        resumed_saves=sorted(set(second.saves)),
        kept_steps=kept,
        pruned_steps=pruned,
        lost_steps=lost,
        run_bytes=dir_bytes(checkpoints),
        losses=losses,
        final_step=steps - 1,
        train_seconds=train_seconds,
        exports=exports,
        logits_max_abs_diff=math.nan if logits is None else logits.max_abs_diff,
        logits_max_abs=math.nan if logits is None else float(abs(logits.logits_a).max()),
        logits_atol=LOGITS_ATOL,
    )
    result.seconds = time.perf_counter() - t_start
    result.write_json(root / workdir.SUMMARY)
    return result
