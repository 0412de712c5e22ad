"""`maxckpt convert SRC DST --to FORMAT`: stream a checkpoint into another format.

The flags of the targets' knobs, the source's settings and scale-out are built from the fields of their
options classes (:mod:`maxckpt.formats`, :mod:`maxckpt.conversion.options`), where each is declared once
with its help; this module declares the conversion's own parameters and where each flag shows in `--help`.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from rich.markup import escape

from maxckpt.cli.console import console, err_console
from maxckpt.conversion.options import Distributed, SourceOptions, parse_settings
from maxckpt.errors import ConversionError
from maxckpt.formats import TARGET_OPTIONS, MegatronOptions
from maxckpt.formats.fields import FIELD_DEFAULT, default_of, knobs
from maxckpt.families import impossible_pairs_text, model_help

if TYPE_CHECKING:
    from maxckpt.conversion.pipeline import ConversionReport

__all__ = ["convert", "hand_off_lines", "parse_settings", "print_notes"]

# Where the knobs' flags show in `--help`, after --step (by parameter name); a knob not named here comes
# after them, in the order of its class and field.
HELP_ORDER = (
    "iteration", "release", "megatron_spec", "make_vocab_size_divisible_by", "torchtitan_keys", "compression",
    "quantize", "scan_layers", "max_shard_size", "hf_config", "tokenizer", "set", "maxtext_config", "read_budget",
)
_KNOB_CLASSES = (*TARGET_OPTIONS.values(), SourceOptions)


def print_notes(notes: List[str]) -> None:
    """Each note of a conversion (or a verify) as one `note:` line on stderr."""
    for note in notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def _own_parameters(
    src: str = typer.Argument(..., help=(
        "Checkpoint to read (detected): a MaxText run/checkpoints/step/items dir, an HF model dir, a Megatron root "
        "or iter_N dir, a TorchTitan folder or step-N dir, or a torch .pt/.bin file or dir. Quantized HF checkpoints "
        "are read dequantized when FP8 block (F8_E4M3 + *_scale_inv, quant_method fp8 with weight_block_size: "
        "DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8) or MXFP4 (gpt-oss *_blocks/*_scales); every other method (awq, gptq, "
        "bitsandbytes, compressed-tensors, nvfp4, ...) and malformed scales are refused with one error.")),
    dst: str = typer.Argument(..., help=(
        "Where to write, outside SRC. Must not exist (or pass --overwrite); written inside DST.tmp-*/ and renamed "
        "on success. --to torch: a DST ending in .pt/.pth/.bin is one file, else a sharded dir.")),
    to: str = typer.Option(..., "--to", help="Target format: hf, maxtext, megatron, torchtitan or torch."),
    model: Optional[str] = typer.Option(
        None, "--model", help=model_help()
    ),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=(
        "Export dtype for floating tensors: bfloat16, float32 or float16 (default: keep; bfloat16 for a quantized "
        "source or --quantize).")),
    step: Optional[int] = typer.Option(None, "--step", help=(
        "Step of SRC to read: a MaxText step, TorchTitan step-N or Megatron iteration (default: newest committed / "
        "the tracker's).")),
    workers: Optional[str] = typer.Option(None, "--workers", "-j", help=(
        "Threads reading and decoding ahead of the writer, N >= 1 (default: the cores). The output is the same for "
        "any N; more overlap reads with writes but holds more tensors in memory at once.")),
    overwrite: bool = typer.Option(False, "--overwrite", help=(
        "Replace DST if it exists (only after the new one is complete), when DST is an empty folder or a checkpoint "
        "maxckpt recognises; never SRC, the current directory or its parents, or a folder holding .git/.hg/.svn.")),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """The parameters of `maxckpt convert` that are the conversion's own, not a format's knobs."""


def _knob_parameters(classes: tuple[type, ...]) -> list[inspect.Parameter]:
    """One CLI parameter per knob with flags; a knob several classes share (--iteration, --max-shard-size) once."""
    found: dict[str, tuple[Any, Any]] = {}
    for cls in classes:
        for f, k in knobs(cls):
            if not k.flags:
                continue
            default = default_of(f) if k.cli_default is FIELD_DEFAULT else k.cli_default
            if found.setdefault(k.name, (k, default)) != (k, default):
                raise TypeError(f"{cls.__name__}.{f.name}: --{k.name} is declared differently by another options class")
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=k.type,
                          default=typer.Option(default, *k.flags, help=k.help, rich_help_panel=k.panel))
        for name, (k, default) in found.items()
    ]


def _signature() -> inspect.Signature:
    """`maxckpt convert`'s parameters in `--help` order: SRC DST --to --model --dtype --step, the knobs, the rest."""
    own = list(inspect.signature(_own_parameters, eval_str=True).parameters.values())
    placed = {name: i for i, name in enumerate(HELP_ORDER)}
    generated = sorted(_knob_parameters(_KNOB_CLASSES), key=lambda p: placed.get(p.name, len(placed)))
    params = [*own[:6], *generated, *own[6:], *_knob_parameters((Distributed,))]
    return inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params], return_annotation=None)


def _refuse_other_targets(values: dict[str, Any], to: str) -> None:
    """A knob that only its own target takes (--quantize) is refused with another --to; the rest are ignored there."""
    own = TARGET_OPTIONS.get(to)
    if own is None:
        return  # an unknown --to is the pipeline's error
    mine = {k.name for _, k in knobs(own)}
    for cls in TARGET_OPTIONS.values():
        for f, k in knobs(cls):
            if k.refused_elsewhere and k.name not in mine and values.get(k.name) != default_of(f):
                raise ConversionError(
                    f"{k.flags[0]} {values[k.name]} {k.refused_elsewhere}; it cannot be used with --to {to}"
                )


def convert(**values: Any) -> None:
    """Convert SRC to another checkpoint format at DST, one tensor at a time.

    Examples:

      maxckpt convert gs-run/checkpoints llama-hf --to hf --model llama3.1-8b --dtype bfloat16

      maxckpt convert llama-hf mt-params --to maxtext   (then MaxText load_parameters_path=mt-params/0/items)

      maxckpt convert run/checkpoints mcore --to megatron --model llama3.1-8b --megatron-spec te --dtype bfloat16

      maxckpt convert run/checkpoints titan --to torchtitan --model llama3.1-8b   (writes titan/step-N)

      maxckpt convert titan/step-100 model.pt --to torch

      maxckpt convert run/checkpoints mixtral-hf --to hf --model mixtral-8x7b   (MoE: one expert at a time)

      maxckpt convert run/checkpoints llama-hf --to hf --model llama3.1-8b --coordinator host0:1234 \
--num-processes 4 --process-id I
      (on each of 4 processes, I = 0..3: each writes a size-balanced share; \
hf, megatron, torchtitan and maxtext targets)

    {impossible_pairs}

    Tensor bytes of hf, megatron, torchtitan and torch outputs go to the disk with O_DIRECT and are
    not left in the page cache; MAXCKPT_DIRECT_WRITES=0 writes them through it. A maxtext output
    goes through the page cache (TensorStore writes it), and its pages are dropped once on disk.
    """
    from maxckpt.conversion import allocator
    from maxckpt.conversion.pipeline import convert as run_convert

    allocator.keep_large_buffers()  # this process only converts: keep freed tensor buffers (not done for API callers)
    to = values["to"]
    targets = {name: cls.from_cli(values) for name, cls in TARGET_OPTIONS.items()}  # each checks its knobs, as given
    _refuse_other_targets(values, to)
    report = run_convert(
        values["src"],
        values["dst"],
        to=to,
        model=values["model"],
        dtype=values["dtype"],
        step=values["step"],
        overwrite=values["overwrite"],
        options=targets.get(to),
        source=SourceOptions.from_cli(values),
        workers=values["workers"],
        progress=False if values["quiet"] else err_console,
        distributed=Distributed.from_cli(values),
    )
    print_notes(report.notes)
    console.print(report.table())
    for line in hand_off_lines(report, values["dst"]):
        console.print(escape(line), soft_wrap=True)


convert.__doc__ = (convert.__doc__ or "").replace(
    "{impossible_pairs}", textwrap.indent(impossible_pairs_text(), "    ").strip()
)  # generated from the family registry, like --model's help
convert.__signature__ = _signature()  # type: ignore[attr-defined]  # typer reads the parameters from here
convert.__annotations__ = {p.name: p.annotation for p in convert.__signature__.parameters.values()}  # type: ignore[attr-defined]


def hand_off_lines(report: "ConversionReport", dst: str | os.PathLike[str]) -> List[str]:
    """What to tell the framework that loads the output (its flags), after a conversion.

    Paths are joined with storage.urls.join, not pathlib: `Path("gs://b/x")` is `gs:/b/x`, a hint
    that loads nothing. Local paths are shown absolute (MaxText and Orbax refuse relative ones).
    """
    from maxckpt.storage.urls import join

    out = join(dst)
    if report.target_format == "maxtext":
        return [f"MaxText: load_parameters_path={join(out, '0', 'items')}"]
    if report.target_format == "megatron":
        from maxckpt.formats.megatron.args import megatron_cli_flags
        from maxckpt.formats.megatron.layout import MegatronLayout

        knobs = report.options.knobs(MegatronOptions)
        layout = MegatronLayout(spec=knobs.spec, make_vocab_size_divisible_by=knobs.make_vocab_size_divisible_by)
        # The output holds no optimizer or RNG state; a release checkpoint is loaded without looking for them.
        resume = "--no-load-optim --no-load-rng" if report.step is not None else ""
        flags = " ".join([f"--load {out}", *megatron_cli_flags(report.spec, layout), resume]).strip()
        return [f"Megatron-LM: {flags}"]
    if report.target_format == "torchtitan":
        from maxckpt.formats.torchtitan.notes import torchtitan_model_notes

        step_dir = join(out, f"step-{report.step or 0}")
        hint = f"TorchTitan: --checkpoint.initial_load_path {step_dir} (model only)"
        return [hint, *torchtitan_model_notes(report.spec)]
    return []
