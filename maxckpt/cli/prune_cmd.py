"""`maxckpt prune`: apply the retention policy to any run directory, showing every decision."""

from __future__ import annotations

import os
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from maxckpt.cli.console import console
from maxckpt.errors import MaxckptError
from maxckpt.manager.retention import KEEP, REMOVE, PruneResult, prune as prune_run
from maxckpt.storage.run_dirs import LAYOUTS

_STYLE = {KEEP: "green", REMOVE: "red"}


def _table(result: PruneResult, dry_run: bool) -> Table:
    plan = result.plan
    title = f"{'dry run: ' if dry_run else ''}prune {plan.run.path} ({plan.run.layout})"
    table = Table(title=title, title_justify="left")
    table.add_column("entry", style="cyan", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("state")
    table.add_column("action", no_wrap=True)
    table.add_column("why", overflow="fold")
    failed = result.deletion.failed if result.deletion else {}
    for d in plan.decisions:
        action = d.action
        if action == REMOVE and dry_run:
            action = "would remove"
        elif os.fspath(d.entry.path) in failed:
            action = "FAILED"
        style = "bold red" if action == "FAILED" else _STYLE.get(d.action, "yellow")
        table.add_row(
            escape(d.entry.name), str(d.entry.step), d.entry.state, f"[{style}]{action}[/]", escape(d.reason)
        )
    if plan.run.others:
        table.add_section()
    for other in plan.run.others:
        if other.is_link:
            table.add_row(
                escape(other.name), "", f"symlink -> {escape(other.link_target or '')}", "[yellow]skipped[/]",
                escape(other.what),
            )
            continue
        what = other.what or "not a checkpoint maxckpt recognises"
        table.add_row(escape(other.name), "", "", "[dim]left alone[/]", escape(what))
    return table


def prune(
    directory: str = typer.Argument(..., help="Run directory holding the checkpoint folders."),
    keep: int = typer.Option(..., "--keep", min=1, help="Keep the newest N committed checkpoints."),
    keep_period: Optional[int] = typer.Option(
        None, "--keep-period", min=1, help="Also keep every checkpoint whose step is a multiple of K."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be removed."),
    layout: Optional[str] = typer.Option(
        None, "--layout", help=f"Layout of the checkpoints ({', '.join(LAYOUTS)}); default: recognised from the names."
    ),
) -> None:
    """Remove old checkpoints of DIRECTORY, keeping the newest --keep (and every --keep-period-th step).

    Understands MaxText/Orbax <step>/, TorchTitan step-N/, Megatron iter_NNNNNNN/
    (its latest_checkpointed_iteration.txt always names a kept one), SpecForge
    epoch_E_step_S/ and HF Trainer checkpoint-N/ folders. Partial (unfinished)
    checkpoints and anything it does not recognise are never touched; in a
    folder mixing layouts, --layout picks the one to prune.
    """
    result = prune_run(directory, keep, keep_period, dry_run=dry_run, layout=layout)
    console.print(_table(result, dry_run))
    for note in result.plan.run.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    removed = len(result.plan.remove)
    if dry_run:
        console.print(f"dry run: {removed} entr{'y' if removed == 1 else 'ies'} would be removed; nothing was changed")
        return
    assert result.deletion is not None
    console.print(f"removed {len(result.deletion.removed)} of {removed}")
    if result.deletion.failed:
        lines = "; ".join(f"{path}: {err}" for path, err in result.deletion.failed.items())
        raise MaxckptError(
            f"could not remove {len(result.deletion.failed)} entr(ies): {lines}; fix and run prune again"
        )
