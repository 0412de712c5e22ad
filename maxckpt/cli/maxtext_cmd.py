"""`maxckpt maxtext train`: MaxText's own trainer with maxckpt's checkpoint manager (see maxckpt/maxtext/)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.markup import escape

from maxckpt.cli.console import console

app = typer.Typer(
    help="Run MaxText's own trainer with maxckpt's checkpoint manager (needs the maxtext extra, Python >= 3.12).",
    no_args_is_help=True,
)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    overlay: Path = typer.Argument(..., help="MaxText overlay (base_config + MaxText keys + maxckpt_* keys)."),
    overrides: List[str] = typer.Argument(None, help="key=value overrides, as on MaxText's command line."),
) -> None:
    """Train with MaxText's pre-training entry point; checkpoints go through maxckpt.

    Same layout on disk as plain MaxText (each resumes the other's runs);
    retention with maxckpt_keep_period; SIGTERM checkpoints the current step
    and exits cleanly; maxckpt_export_on_completion exports the final step.
    """
    from maxckpt.maxtext.train import run

    summary = run(overlay, overrides or [])
    console.rule("[bold]maxckpt summary")
    for line in summary.lines():
        console.print(escape(line), soft_wrap=True)
