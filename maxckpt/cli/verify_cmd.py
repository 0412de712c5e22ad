"""`maxckpt verify A B [--logits]`: compare two checkpoints tensor by tensor, or by logits; `verify A --integrity`: \
check A's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from maxckpt.cli.console import console, err_console
from maxckpt.cli.convert_cmd import parse_settings, print_notes
from rich.markup import escape

from maxckpt.conversion.options import SourceOptions
from maxckpt.errors import ConfigError, CorruptCheckpointError
from maxckpt.formats.fields import knob_help


def _tokens(text: Optional[str]):
    if not text:
        return None
    try:
        return [[int(t) for t in text.replace(" ", "").split(",") if t]]
    except ValueError as err:
        raise ConfigError(f"--tokens {text!r}: write comma-separated token ids, e.g. 1,5,9,13") from err


def verify(
    a: str = typer.Argument(
        ...,
        help="First checkpoint, any format convert reads (MaxText, HF, Megatron, TorchTitan, torch); with --logits it "
        "runs maxckpt's JAX reference of MaxText on A's tensors.",
    ),
    b: Optional[str] = typer.Argument(
        None,
        help="Second checkpoint, any format; with --logits its HF view runs in transformers. Not with --integrity.",
    ),
    integrity: bool = typer.Option(
        False,
        "--integrity",
        help="Check A alone: re-read every tensor and compare it with the content hashes of A's maxckpt-manifest.json "
        "(every checkpoint maxckpt writes has one); without a manifest, say so and check what the format allows "
        "(metadata, offsets and sizes, every chunk decodes).",
    ),
    logits: bool = typer.Option(False, "--logits", help="Compare logits of a forward pass instead of tensors."),
    atol: Optional[float] = typer.Option(
        None, "--atol", help="Largest accepted absolute difference (default 0 for tensors, 1e-4 for logits)."
    ),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model family or MaxText model name, for MaxText checkpoints (decides the rotary layout)."
    ),
    model_b: Optional[str] = typer.Option(
        None, "--model-b", help="Family of B when it differs from --model's (e.g. B's config.json already states it)."
    ),
    step: Optional[int] = typer.Option(
        None, "--step", help="Step of A to read (MaxText step, TorchTitan step-N, Megatron iteration)."
    ),
    hf_config: Optional[Path] = typer.Option(
        None, "--hf-config", help="An HF config.json stating what shapes cannot tell."
    ),
    settings: List[str] = typer.Option(
        [],
        "--set",
        help="Model setting KEY=VALUE for both checkpoints (e.g. num_experts_per_tok=2, or MaxText's name "
        "n_routing_groups=8); repeatable.",
    ),
    maxtext_config: Optional[Path] = typer.Option(
        None, "--maxtext-config", help=knob_help(SourceOptions, "maxtext_config")
    ),
    tokens: Optional[str] = typer.Option(
        None, "--tokens", help="Comma-separated token ids for --logits (default 1,5,9,...,29)."
    ),
    show_all: bool = typer.Option(False, "--all", help="List every tensor, not only the ones that differ."),
) -> None:
    """Check that A and B hold the same model; exit 1 when they differ past --atol. With --integrity: check A's bytes.

    --integrity re-reads every tensor of A and checks its dtype, shape and
    CRC32C against A's integrity manifest (maxckpt-manifest.json in the HF
    dir, Megatron iter_N/, TorchTitan step-N/, Orbax step dir, or
    FILE.maxckpt-manifest.json beside a torch file); a mismatch exits 1 with
    one error line naming the tensor. A checkpoint without a manifest (one
    MaxText or another tool wrote) prints "no manifest" and gets its
    format's own checks; it exits 0 when they pass.

    MoE models also compare every layer's expert count: a conversion that
    dropped an expert fails.

    Examples:

      maxckpt verify run/checkpoints llama-hf --model llama3.1-8b

      maxckpt verify --logits run/checkpoints llama-hf --model llama3.1-8b

      maxckpt verify --logits run/checkpoints qwen3-hf --model qwen3-30b-a3b --set num_experts_per_tok=2

      maxckpt verify run/checkpoints mcore --model llama3.1-8b   (MaxText vs Megatron, through HF names)

      maxckpt verify llama-hf --integrity
    """
    if integrity:
        _verify_integrity(a, b, logits, step, show_all)
        return
    if b is None:
        raise ConfigError("verify needs two checkpoints A B (or one with --integrity)")
    source = SourceOptions(hf_config=hf_config, overrides=parse_settings(settings), maxtext_config=maxtext_config)
    sides = dict(model=model, model_b=model_b, step=step, source=source)  # the same for both checks
    if logits:
        from maxckpt.conversion.verify import verify_logits

        report = verify_logits(a, b, tokens=_tokens(tokens), atol=1e-4 if atol is None else atol, **sides)
        print_notes(report.notes)
        console.print(report.table())
        ok = report.ok
    else:
        from maxckpt.conversion.verify import verify as run_verify

        report = run_verify(a, b, atol=0.0 if atol is None else atol, **sides)
        print_notes(report.notes)
        if show_all or report.failures:
            console.print(report.table(only_failures=not show_all))
        console.print(
            f"{len(report.rows)} tensors, {len(report.failures)} differ past atol {report.atol:g}; max |a-b| = "
            f"{report.max_abs_diff:.3g}"
        )
        ok = report.ok
    if not ok:
        err_console.print("[bold red]verify failed:[/] the checkpoints differ")
        raise typer.Exit(1)
    console.print("[green]verify ok[/]")


def _verify_integrity(a: str, b: Optional[str], logits: bool, step: Optional[int], show_all: bool) -> None:
    from maxckpt.conversion.integrity_check import check_integrity

    if b is not None or logits:
        raise ConfigError("verify --integrity checks one checkpoint: pass only A (no B, no --logits)")
    report = check_integrity(a, step=step)
    if report.manifest is None:
        err_console.print(
            f"[yellow]note:[/] {escape(str(report.path))}: no manifest (written by another tool, or by a maxckpt "
            "older than manifests); checked what its format allows",
            soft_wrap=True,
        )
    if show_all or report.failures:
        console.print(report.table(only_failures=not show_all))
    for check in report.checks:
        console.print(f"checked: {escape(check)}")
    console.print(f"{len(report.rows)} tensors, {len(report.failures)} failed")
    if report.failures:
        first = report.failures[0]
        more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        raise CorruptCheckpointError(f"{report.path}: tensor {first.name}: {first.problem}{more}")
    console.print("[green]verify ok[/]" + ("" if report.manifest else " (no manifest)"))
