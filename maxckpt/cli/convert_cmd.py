"""`maxckpt convert SRC DST --to FORMAT`: stream a checkpoint into another format."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from rich.markup import escape

from maxckpt.cli.console import console, err_console
from maxckpt.bounded import loads_json
from maxckpt.errors import ConfigError

if TYPE_CHECKING:
    from maxckpt.conversion.pipeline import ConversionReport


def parse_settings(items: List[str]) -> dict:
    """`["rope_theta=1e6", "tie_word_embeddings=true"]` -> {"rope_theta": 1000000.0, ...} (values as JSON when they parse)."""
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: write it as KEY=VALUE, e.g. --set rope_theta=1000000")
        try:
            value = loads_json(raw)  # bounded: a value nested 100,000 deep is a string, not a crash
        except ValueError:
            value = {"True": True, "False": False, "None": None}.get(raw, raw)
        out[key.strip()] = value
    return out


def print_notes(notes: List[str]) -> None:
    for note in notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def convert(
    src: str = typer.Argument(..., help="Checkpoint to read (detected): a MaxText run/checkpoints/step/items dir, an HF model dir, a Megatron root or iter_N dir, a TorchTitan folder or step-N dir, or a torch .pt/.bin file or dir. Quantized HF checkpoints are read dequantized when FP8 block (F8_E4M3 + *_scale_inv, quant_method fp8 with weight_block_size: DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8) or MXFP4 (gpt-oss *_blocks/*_scales); every other method (awq, gptq, bitsandbytes, compressed-tensors, nvfp4, ...) and malformed scales are refused with one error."),
    dst: str = typer.Argument(..., help="Where to write, outside SRC. Must not exist (or pass --overwrite); written inside DST.tmp-*/ and renamed on success. --to torch: a DST ending in .pt/.pth/.bin is one file, else a sharded dir."),
    to: str = typer.Option(..., "--to", help="Target format: hf, maxtext, megatron, torchtitan or torch."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Model family (llama2, llama3, llama3.1, mistral, qwen3, mixtral, qwen3-moe, deepseek3, gpt-oss, gemma2, gemma3) or MaxText model name (llama3.1-8b, mixtral-8x7b, qwen3-30b-a3b, deepseek3-671b, gpt-oss-20b, gemma2-9b, gemma3-4b, ...). Decides what shapes cannot tell (rotary layout, routing top-k, softcaps, windows): pass it for MaxText sources."
    ),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Export dtype for floating tensors: bfloat16, float32 or float16 (default: keep; bfloat16 for a quantized source or --quantize)."),
    step: Optional[int] = typer.Option(None, "--step", help="Step of SRC to read: a MaxText step, TorchTitan step-N or Megatron iteration (default: newest committed / the tracker's)."),
    iteration: Optional[int] = typer.Option(None, "--iteration", "--out-step", help="Megatron/TorchTitan output: training step to record (iter_N / step-N). Default: the source's step (MaxText checkpoint N holds step N+1), else none."),
    release: bool = typer.Option(False, "--release", help="Megatron/TorchTitan output: record no step (Megatron release/, TorchTitan step-0, model only)."),
    megatron_spec: str = typer.Option("te", "--megatron-spec", help="Megatron output: layer spec of the run that loads it, te (Transformer Engine, Megatron-LM's default: --transformer-impl transformer_engine) or local (--transformer-impl local). Every family goes to both; they differ in the norm names of MoE and MLA layers (te: MoE layers keep pre_mlp_layernorm, MLA fuses the q/kv norms into linear_q_up_proj/linear_kv_up_proj) and in the _extra_state items. Reading takes either."),
    make_vocab_size_divisible_by: int = typer.Option(128, "--make-vocab-size-divisible-by", help="Megatron output: pad the vocabulary to a multiple of N (pass the same N to Megatron-LM)."),
    torchtitan_keys: str = typer.Option("2026", "--torchtitan-keys", help="TorchTitan output: key generation, 2026 (torchtitan 0.3+: attention.qkv_linear.wq, lm_head) or classic (attention.wq, output)."),
    compression: str = typer.Option("none", "--compression", help="MaxText output: none (fastest; MaxText and Orbax restore it) or zstd (as MaxText writes: typically 8-20% smaller, 1-3 s more CPU per GB)."),
    quantize: Optional[str] = typer.Option(None, "--quantize", help="HF output, quantized as the Hub releases: fp8-block (DeepSeek-V3/Qwen3-FP8: the layers' linears as F8_E4M3 with float32 *_scale_inv per 128x128 block, scale = block amax / 448; embeddings, norms, lm_head, routers, biases stay --dtype) or mxfp4 (gpt-oss: the experts as uint8 *_blocks/*_scales, E8M0 exponent floor(log2(amax)) - 2 per 32 values). config.json gets the quantization_config."),
    scan_layers: Optional[bool] = typer.Option(None, "--scan-layers/--no-scan-layers", help="MaxText output: layers stacked on axis 1 (default) or layers_{i}."),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="HF output: largest safetensors shard, e.g. 5GB, 500MB."),
    hf_config: Optional[Path] = typer.Option(None, "--hf-config", help="An HF config.json stating rope theta/scaling, norm eps, token ids, head counts."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="HF output: copy tokenizer files from this directory."),
    settings: List[str] = typer.Option([], "--set", help="Model setting KEY=VALUE, repeatable: a ModelSpec field (rope_theta=1e6) or MaxText's name (num_experts_per_tok=2, n_routing_groups=8, sliding_window_size=4, rope_max_timescale=5e5); with --maxtext-config, the run's own command-line overrides."),
    maxtext_config: Optional[Path] = typer.Option(None, "--maxtext-config", help="MaxText source: the config YAML its run was trained with (base_config chain, model_name), resolved in MaxText's order with --set as the run's command-line overrides; its top-k, routing groups, windows, rope and soft caps are used instead of the --model preset. A run dir holding MaxText's config.yml is read without it."),
    read_budget: Optional[str] = typer.Option(None, "--read-budget", help="Memory for stacked MaxText layers read at once, e.g. 4GB (default: a quarter of RAM). Smaller holds less but may decode chunks several times."),
    workers: Optional[str] = typer.Option(None, "--workers", "-j", help="Threads reading and decoding ahead of the writer, N >= 1 (default: the cores). The output is the same for any N; more overlap reads with writes but holds more tensors in memory at once."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST if it exists (only after the new one is complete), when DST is an empty folder or a checkpoint maxckpt recognises; never SRC, the current directory or its parents, or a folder holding .git/.hg/.svn."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help="Scale-out: HOST:PORT of process 0's jax.distributed coordinator; run the same command on every process with --num-processes and --process-id. DST must be a folder all processes see, or a gs:// or s3:// URL.", rich_help_panel="Scale-out (jax.distributed)"),
    num_processes: Optional[int] = typer.Option(None, "--num-processes", help="Scale-out: how many processes share the conversion.", rich_help_panel="Scale-out (jax.distributed)"),
    process_id: Optional[int] = typer.Option(None, "--process-id", help="Scale-out: this process's rank, 0 to N-1 (process 0 commits DST).", rich_help_panel="Scale-out (jax.distributed)"),
    distributed: bool = typer.Option(False, "--distributed", help="Scale-out with JAX's cluster auto-detection (SLURM, Open MPI, Cloud TPU, ...) instead of the three flags above.", rich_help_panel="Scale-out (jax.distributed)"),
    distributed_timeout: float = typer.Option(600.0, "--distributed-timeout", help="Scale-out: give up on a process that makes no progress for this many seconds; one whose heartbeat is silent for a quarter of it (5-100 s) is taken as dead.", rich_help_panel="Scale-out (jax.distributed)"),
) -> None:
    """Convert SRC to another checkpoint format at DST, one tensor at a time.

    Examples:

      maxckpt convert gs-run/checkpoints llama-hf --to hf --model llama3.1-8b --dtype bfloat16

      maxckpt convert llama-hf mt-params --to maxtext   (then MaxText load_parameters_path=mt-params/0/items)

      maxckpt convert run/checkpoints mcore --to megatron --model llama3.1-8b --megatron-spec te --dtype bfloat16

      maxckpt convert run/checkpoints titan --to torchtitan --model llama3.1-8b   (writes titan/step-N)

      maxckpt convert titan/step-100 model.pt --to torch

      maxckpt convert run/checkpoints mixtral-hf --to hf --model mixtral-8x7b   (MoE: one expert at a time)

      maxckpt convert run/checkpoints llama-hf --to hf --model llama3.1-8b --coordinator host0:1234 --num-processes 4 --process-id I
      (on each of 4 processes, I = 0..3: each writes a size-balanced share; hf, megatron, torchtitan and maxtext targets)

    Pairs that are not possible (every family converts between maxtext, hf and torch):

      megatron: gemma2, gemma3 (Megatron-Core has no softcapping, sandwich or (1 + w) norms).

      torchtitan: mixtral, gemma2, gemma3 (TorchTitan 0.3.0 ships no such model). qwen3-moe,
      deepseek3 and gpt-oss go to TorchTitan's qwen3 MoE, deepseek_v3 and gpt_oss models.

    Tensor bytes of hf, megatron, torchtitan and torch outputs go to the disk with O_DIRECT and are
    not left in the page cache; MAXCKPT_DIRECT_WRITES=0 writes them through it. A maxtext output
    goes through the page cache (TensorStore writes it), and its pages are dropped once on disk.
    """
    from maxckpt.conversion import allocator
    from maxckpt.conversion.pipeline import convert as run_convert

    allocator.keep_large_buffers()  # this process only converts: keep freed tensor buffers for reuse (not done for API callers)
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
        maxtext_config=maxtext_config,
        read_budget=read_budget,
        overwrite=overwrite,
        progress=False if quiet else err_console,
        iteration=iteration,
        release=release,
        megatron_spec=megatron_spec,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        torchtitan_keys=torchtitan_keys,
        compression=compression,
        quantize=quantize,
        workers=workers,
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        distributed=distributed,
        distributed_timeout=distributed_timeout,
    )
    print_notes(report.notes)
    console.print(report.table())
    for line in hand_off_lines(report, dst):
        console.print(escape(line), soft_wrap=True)


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
        from maxckpt.layouts.megatron import MegatronLayout, megatron_cli_flags

        opts = report.options
        layout = MegatronLayout(spec=opts.megatron_spec, make_vocab_size_divisible_by=opts.make_vocab_size_divisible_by)
        # The output holds no optimizer or RNG state; a release checkpoint is loaded without looking for them.
        resume = "--no-load-optim --no-load-rng" if report.step is not None else ""
        flags = " ".join([f"--load {out}", *megatron_cli_flags(report.spec, layout), resume]).strip()
        return [f"Megatron-LM: {flags}"]
    if report.target_format == "torchtitan":
        from maxckpt.layouts.torchtitan import torchtitan_model_notes

        step_dir = join(out, f"step-{report.step or 0}")
        hint = f"TorchTitan: --checkpoint.initial_load_path {step_dir} (model only)"
        return [hint, *torchtitan_model_notes(report.spec)]
    return []
