"""`maxckpt ls`, `maxckpt inspect`, `maxckpt diff`: look inside runs and checkpoints.

Thin layers over :mod:`maxckpt.explore`: each prints the rich table of the
library's result, or its `to_dict()` as JSON with `--json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from maxckpt.cli.console import console, err_console
from maxckpt.errors import ConfigError
from maxckpt.storage.run_dirs import LAYOUTS


def _print_json(data: dict) -> None:
    typer.echo(json.dumps(data, indent=2))


def ls(
    run_dir: str = typer.Argument(
        ..., help="Run directory: the folder holding the step folders, or a MaxText run dir with checkpoints/."
    ),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for --config."),
    keep: Optional[int] = typer.Option(
        None, "--keep", min=1, help="Retention to apply: keep the newest N committed checkpoints."
    ),
    keep_period: Optional[int] = typer.Option(
        None, "--keep-period", min=1, help="Retention to apply: also keep every step divisible by K."
    ),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        help="Take the retention from this MaxText overlay (max_num_checkpoints_to_keep, maxckpt_keep_period).",
    ),
    layout: Optional[str] = typer.Option(
        None,
        "--layout",
        help=f"Layout to list in a folder mixing several ({', '.join(LAYOUTS)}); default: recognised from the names.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the checkpoints of RUN_DIR: step, committed or partial, size, items, save time.

    With --keep/--keep-period or --config, also shows which steps retention
    would delete next (nothing is deleted; see `maxckpt prune`). Understands
    MaxText/Orbax <step>/, TorchTitan step-N/, Megatron iter_NNNNNNN/,
    SpecForge epoch_E_step_S/ and HF Trainer checkpoint-N/ folders; in a
    folder mixing layouts, --layout picks the one to list.

    Examples:

      maxckpt ls maxckpt_demo/demo_run

      maxckpt ls /runs/llama/checkpoints --config overlay.yml max_num_checkpoints_to_keep=2
    """
    from maxckpt.explore.steps import list_steps

    cfg = None
    if config is not None:
        from maxckpt.config import load_config

        cfg = load_config(config, *(overrides or []))
    elif overrides:
        raise ConfigError(f"key=value overrides ({' '.join(overrides)}) need --config OVERLAY to apply to")
    table = list_steps(run_dir, keep=keep, keep_period=keep_period, config=cfg, layout=layout)
    if as_json:
        _print_json(table.to_dict())
        return
    console.print(table.table())
    for note in table.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


def inspect(
    ckpt: str = typer.Argument(
        ...,
        help="Checkpoint: a MaxText run/checkpoints/step/items dir, an HF model dir, or any other registered format.",
    ),
    filter: Optional[str] = typer.Option(
        None, "--filter", help="Only tensors whose name matches this glob, e.g. '*mlp*' or 'opt_state/*'."
    ),
    depth: Optional[int] = typer.Option(
        None, "--depth", min=1, help="Collapse the tree to N name components, with per-subtree totals."
    ),
    stats: bool = typer.Option(
        False, "--stats", help="Also read every (filtered) tensor, streaming, for mean/std/absmax/NaN count."
    ),
    step: Optional[int] = typer.Option(
        None, "--step", help="Step to show when CKPT is a run dir (default: newest committed)."
    ),
    format: Optional[str] = typer.Option(
        None, "--format", help="Format name when detection is not wanted (maxtext, hf, ...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="MaxText source: the model family or MaxText model name a conversion would use (notes name "
        "the settings it gives).",
    ),
    settings: List[str] = typer.Option(
        [],
        "--set",
        help="MaxText source: model setting KEY=VALUE, repeatable, as `convert --set` takes it (with --maxtext-config, "
        "the run's command-line overrides).",
    ),
    maxtext_config: Optional[Path] = typer.Option(
        None,
        "--maxtext-config",
        help="MaxText source: the config YAML its run was trained with; notes name the model settings a conversion "
        "would take from it (and from the preset for what it leaves out). Refused for other formats.",
    ),
) -> None:
    """Show the tensor tree of CKPT: names, shapes, dtypes, bytes, and totals.

    Reads metadata only (instant on huge checkpoints) unless --stats is given.
    For Orbax training checkpoints the whole stored state is shown: params,
    opt_state, step, nnx_aux.

    For a MaxText checkpoint, --maxtext-config, --model or --set (or, with none
    of them, the run dir's record of its config: MaxText's config.yml or
    maxckpt's maxckpt_run_config.yml) add notes naming the model settings a
    conversion would use and where each came from: the run's config, the
    record, or the preset (`assumed from the ... preset`).

    Examples:

      maxckpt inspect maxckpt_demo/demo_run/checkpoints --depth 3

      maxckpt inspect llama-hf --filter '*layers.0.*' --stats

      maxckpt inspect RUN/checkpoints --maxtext-config my_run.yml --set override_model_config=true
    """
    from maxckpt.cli.convert_cmd import parse_settings
    from maxckpt.explore.tree import inspect_checkpoint

    tree = inspect_checkpoint(
        ckpt,
        step=step,
        format=format,
        filter=filter,
        stats=stats,
        progress=None if as_json else err_console,
        model=model,
        maxtext_config=maxtext_config,
        overrides=parse_settings(settings) or None,
    )
    if as_json:
        _print_json(tree.to_dict(depth))
        return
    tree.print(console, depth)


def diff(
    a: str = typer.Argument(..., help="First checkpoint (any supported format)."),
    b: str = typer.Argument(..., help="Second checkpoint (any supported format)."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model family or MaxText model name for MaxText checkpoints (decides the rotary layout)."
    ),
    model_b: Optional[str] = typer.Option(None, "--model-b", help="Family of B when it differs from --model's."),
    step_a: Optional[int] = typer.Option(None, "--step-a", help="Step of A when A is a run dir."),
    step_b: Optional[int] = typer.Option(None, "--step-b", help="Step of B when B is a run dir."),
    native: Optional[bool] = typer.Option(
        None,
        "--native/--through-layouts",
        help="Compare stored names (same format only; includes optimizer state) or HF names through the layouts "
        "(default for models).",
    ),
    atol: float = typer.Option(0.0, "--atol", help="Differences up to this count as unchanged."),
    filter: Optional[str] = typer.Option(
        None, "--filter", help="Only tensors whose (compared) name matches this glob."
    ),
    show_all: bool = typer.Option(False, "--all", help="Also list unchanged tensors."),
    exit_code: bool = typer.Option(
        False, "--exit-code", help="Exit 1 when the checkpoints differ (like git diff --exit-code)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Tensors added, removed, reshaped or changed between A and B, with max abs and relative diff.

    A and B may be of different formats (a MaxText step and its HF export, a
    Megatron copy, ...): both are compared under HF names through their
    layouts. Relative diff is ||a-b|| / ||a|| per tensor.

    Examples:

      maxckpt diff run/checkpoints/100 run/checkpoints/200 --model llama3.1

      maxckpt diff run/checkpoints/100 run/checkpoints/200 --native --filter 'opt_state/*'
    """
    from maxckpt.explore.diff import diff_checkpoints

    report = diff_checkpoints(
        a, b, model=model, model_b=model_b, step_a=step_a, step_b=step_b, native=native, atol=atol, filter=filter
    )
    if as_json:
        _print_json(report.to_dict())
    else:
        for note in report.notes:
            err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        if show_all or not report.identical:
            console.print(report.table(show_unchanged=show_all))
        console.print(report.summary())
    if exit_code and not report.identical:
        raise typer.Exit(1)
