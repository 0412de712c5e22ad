"""`maxckpt convert SRC DST --to FORMAT`: stream a checkpoint into another format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from maxckpt.cli.console import console, err_console
from maxckpt.errors import ConfigError


def parse_settings(items: List[str]) -> dict:
    """`["rope_theta=1e6", "tie_word_embeddings=true"]` -> {"rope_theta": 1000000.0, ...} (values as JSON when they parse)."""
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: write it as KEY=VALUE, e.g. --set rope_theta=1000000")
        try:
            value = json.loads(raw)
        except ValueError:
            value = {"True": True, "False": False, "None": None}.get(raw, raw)
        out[key.strip()] = value
    return out


def print_notes(notes: List[str]) -> None:
    for note in notes:
        err_console.print(f"[yellow]note:[/] {note}", soft_wrap=True)


def convert(
    src: Path = typer.Argument(..., help="Checkpoint to read: a MaxText run dir, its checkpoints/ dir, a step or items dir; or an HF model dir."),
    dst: Path = typer.Argument(..., help="Where to write. Must not exist (or pass --overwrite); written to DST.tmp-* and renamed on success."),
    to: str = typer.Option(..., "--to", help="Target format: hf or maxtext (more as they are registered)."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model family (llama2, llama3, llama3.1, mistral, qwen3) or MaxText model name (llama3.1-8b, ...). Decides MaxText's rotary layout: pass it for MaxText sources."
    ),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Export dtype for floating tensors: bfloat16, float32 or float16 (default: keep)."),
    step: Optional[int] = typer.Option(None, "--step", help="Step to read from a run or checkpoints/ dir (default: newest committed)."),
    scan_layers: Optional[bool] = typer.Option(None, "--scan-layers/--no-scan-layers", help="MaxText output: layers stacked on axis 1 (default) or layers_{i}."),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="HF output: largest safetensors shard, e.g. 5GB, 500MB."),
    hf_config: Optional[Path] = typer.Option(None, "--hf-config", help="An HF config.json stating rope theta/scaling, norm eps, token ids, head counts."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="HF output: copy tokenizer files from this directory."),
    settings: List[str] = typer.Option([], "--set", help="Model setting KEY=VALUE (a ModelSpec field, e.g. rope_theta=1e6); repeatable."),
    read_budget: Optional[str] = typer.Option(None, "--read-budget", help="Memory for stacked MaxText layers read at once, e.g. 4GB (default: a quarter of RAM). Smaller holds less but may decode chunks several times."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST if it exists (only after the new one is complete)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Convert SRC to another checkpoint format at DST, one tensor at a time.

    Examples:

      maxckpt convert gs-run/checkpoints llama-hf --to hf --model llama3.1-8b --dtype bfloat16

      maxckpt convert llama-hf mt-params --to maxtext   (then MaxText load_parameters_path=mt-params/0/items)
    """
    from maxckpt.conversion.pipeline import convert as run_convert

    report = run_convert(
        src,
        dst,
        to=to,
        model=model,
        dtype=dtype,
        step=step,
        scan_layers=scan_layers,
        max_shard_size=max_shard_size,
        hf_config=hf_config,
        tokenizer=tokenizer,
        overrides=parse_settings(settings),
        read_budget=read_budget,
        overwrite=overwrite,
        progress=False if quiet else err_console,
    )
    print_notes(report.notes)
    console.print(report.table())
    if report.target_format == "maxtext":
        console.print(f"MaxText: load_parameters_path={Path(dst) / '0' / 'items'}")
