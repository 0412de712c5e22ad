"""`maxckpt demo`: the whole story on local files in about a minute (see maxckpt/demo/runner.py)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from maxckpt.cli.console import console, err_console
from maxckpt.demo import DEFAULT_DIR, DEFAULT_STEPS
from maxckpt.errors import MaxckptError


def demo(
    directory: Path = typer.Option(
        Path(DEFAULT_DIR),
        "--dir",
        help="Output directory (created; a previous demo's is replaced; any other non-empty one is refused).",
    ),
    steps: int = typer.Option(
        DEFAULT_STEPS, "--steps", min=1, help="Training steps (at least 12 with the demo config's period of 5)."
    ),
    maxtext: bool = typer.Option(
        False,
        "--maxtext",
        help="Run the story on MaxText's real trainer (`maxckpt maxtext train`; needs the maxtext extra, "
        "Python >= 3.12).",
    ),
) -> None:
    """Train a tiny Llama under maxckpt's manager, crash it, resume, and export it to HF, Megatron and TorchTitan.

    Everything runs locally on CPU: async checkpoints every 5 steps with
    retention (newest 3 + every 20th step, from configs/demo.yml), a SIGKILL
    mid-run and a resume from the newest committed step in a fresh process,
    conversion of the final step to HF, Megatron and TorchTitan, and a logits
    check in transformers against maxckpt's JAX reference of MaxText.
    """
    if maxtext:
        from maxckpt.demo.maxtext_story import run_maxtext_demo

        story = run_maxtext_demo(directory, steps, console=err_console)
        console.print_json(data=story)
        if story["killed_during"] and story["resumed_from"] != story["expected_resume"]:
            raise MaxckptError("the demo finished but the resume did not start from the newest committed step")
        return
    from maxckpt.demo.runner import run_demo

    result = run_demo(directory, steps, console=err_console)
    console.rule("[bold]summary")
    console.print(result.renderable())
    console.print(
        f"done in {result.seconds:.0f} s; summary written to {escape(str(Path(result.directory) / 'summary.json'))}"
    )
    console.print("\n[bold]Explore the result:[/]")
    for command in result.commands():
        console.print(f"  {escape(command)}", soft_wrap=True)
    if not result.ok:
        raise MaxckptError(
            "the demo finished but a check failed: "
            + ("logits differ past the tolerance; " if not result.logits_ok else "")
            + ("an export differs from the MaxText checkpoint; " if not result.exports_exact else "")
            + ("the final step was not kept; " if result.final_step not in result.kept_steps else "")
            + "see the tables above"
        )
