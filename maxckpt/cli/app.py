"""The typer app: the root command and the registry of subcommands.

Each subcommand lives in its own module and is added here with one line.
"""

from __future__ import annotations

import typer

from maxckpt import __version__
from maxckpt.cli import config_cmd, convert_cmd, demo_cmd, explore_cmd, maxtext_cmd, prune_cmd, verify_cmd

app = typer.Typer(
    name="maxckpt",
    help="Checkpoints for JAX/Orbax in the MaxText world: manage, prune, convert, inspect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"maxckpt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Checkpoints for JAX/Orbax in the MaxText world: manage, prune, convert, inspect."""


# Listed in `maxckpt --help` in this order: first look, then manage, then hand off.
app.command("demo")(demo_cmd.demo)
app.command("ls")(explore_cmd.ls)
app.command("inspect")(explore_cmd.inspect)
app.command("diff")(explore_cmd.diff)
app.command("prune")(prune_cmd.prune)
app.add_typer(config_cmd.app, name="config")
app.command("convert")(convert_cmd.convert)
app.command("verify")(verify_cmd.verify)
app.add_typer(maxtext_cmd.app, name="maxtext")
