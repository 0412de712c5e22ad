"""`maxckpt config show`: the effective checkpoint config and where each value came from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List

import typer
from rich.markup import escape
from rich.table import Table

from maxckpt.cli.console import console
from maxckpt.config import FIELDS, load_config

app = typer.Typer(help="Check MaxText base.yml overlays.", no_args_is_help=True)


MAX_CELL_CHARS = 200  # a table cell shows at most this much of a value (a 50 MB value would take minutes to lay out)
MAX_NOTE_CHARS = 1000


def capped(text: str, limit: int = MAX_CELL_CHARS) -> str:
    """`text`, cut to `limit` characters with a note of how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters; see --json)"


def _short(source: str) -> str:
    """Show config files relative to the working directory when that is shorter."""
    head, sep, tail = source.partition(" (as ")
    try:
        rel = os.path.relpath(head)
        head = rel if len(rel) < len(head) and not rel.startswith("../..") else head
    except ValueError:
        pass
    return head + sep + tail


def _keys_epilog() -> str:
    """The known keys and what each means, from their declarations (the help's last section)."""
    lines = [f"{spec.name}: {escape(spec.help)}" for spec in FIELDS]
    return "Keys (MaxText's, then maxckpt's own):\n\n" + "\n".join(lines)


@app.command("show", epilog=_keys_epilog())
def show(
    overlay: Path = typer.Argument(..., help="A base.yml overlay (YAML with `base_config: ...`)."),
    overrides: List[str] = typer.Argument(None, help="key=value overrides, applied last."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts instead of a table."),
) -> None:
    """Print the effective checkpoint config of OVERLAY as a table, with the source of each value."""
    cfg = load_config(overlay, *(overrides or []))
    if as_json:
        payload = {
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.values().items()},
            "sources": dict(cfg.sources),
            "checkpoint_dir": cfg.checkpoint_dir,
            "notes": list(cfg.notes),
            "passthrough_keys": sorted(cfg.extra),
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    table = Table(title=escape(f"checkpoint config: {overlay}"), title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", style="bold", overflow="fold")
    table.add_column("from", style="dim", overflow="fold")
    for spec in FIELDS:
        value = getattr(cfg, spec.name)
        shown = ", ".join(value) if isinstance(value, tuple) else repr(value) if value == "" else str(value)
        table.add_row(spec.name, escape(capped(shown)), escape(capped(_short(cfg.sources.get(spec.name, "default")))))
    table.add_section()
    table.add_row("checkpoint_dir", escape(capped(str(cfg.checkpoint_dir or "(set base_output_directory)"))), "derived")
    console.print(table)
    for note in cfg.notes:
        console.print(f"[yellow]note:[/] {escape(capped(note, MAX_NOTE_CHARS))}")
    if cfg.extra:
        console.print(f"[dim]{len(cfg.extra)} MaxText key(s) maxckpt does not use pass through untouched.[/]")
