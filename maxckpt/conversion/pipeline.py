"""The streaming conversion: source container -> source layout -> HF -> target layout -> target container.

One tensor (or one layer piece of a stacked tensor) is computed and written
at a time, so memory stays near the largest tensor whatever the model size.
Output goes into a temporary sibling folder `<dst>.tmp-*` and is renamed to
`dst` only when everything (tensors and sidecar files) is written: a failed or
interrupted conversion never leaves a half-written `dst`, and an existing
`dst` is replaced only with `overwrite=True`, after success, and only when it
is safe to lose (see :mod:`maxckpt.conversion.staging`).

>>> report = convert("run/checkpoints", "llama-hf", to="hf", model="llama3.1-8b")  # doctest: +SKIP
>>> report.tensors, report.megabytes_per_second                                  # doctest: +SKIP
(291, 412.7)
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.markup import escape
from rich.table import Table

from maxckpt import integrity
from maxckpt.storage.bounded import special_kind
from maxckpt.containers.base import TensorWriter
from maxckpt.units import human_bytes
from maxckpt.conversion import distributed as dist
from maxckpt.conversion.checkpoint import open_checkpoint
from maxckpt.conversion.options import Distributed, SourceOptions
from maxckpt.conversion import allocator
from maxckpt.conversion.scheduling import inflight_budget, run_ordered, validate_workers
from maxckpt.conversion.staging import check_destination, staged_output
from maxckpt.conversion.writing import write_and_close, written_info
from maxckpt.errors import ConversionError
from maxckpt.formats.manifests import manifest_dir
from maxckpt.formats.maxtext.params import float32_rounding_note
from maxckpt.formats import (  # noqa: F401 - MegatronOptions: the docstring's
    TARGET_OPTIONS, ConversionOptions, Format, MegatronOptions, TargetOptions, get_format,
)
from maxckpt.families import require_bridge
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import LazyTensor
from maxckpt.storage import outputs
from maxckpt.storage.urls import as_path, is_url, normalize, normalize_optional

DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
}


def parse_dtype(dtype: str | np.dtype | None) -> np.dtype | None:
    """'bfloat16' / 'float32' / 'float16' (or a numpy dtype) -> numpy dtype."""
    if dtype is None:
        return None
    if not isinstance(dtype, str):
        return np.dtype(dtype)
    name = DTYPES.get(dtype.lower())
    if name is None:
        raise ConversionError(f"unsupported dtype {dtype!r}; use bfloat16, float32 or float16")
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class ConversionReport:
    """What a conversion did: counts, sizes, time, memory, and notes for the user."""

    source: Path
    destination: Path
    source_format: str
    target_format: str
    spec: ModelSpec
    step: int | None = None  # the training step written (targets that record one), else None
    options: ConversionOptions | None = None  # what the conversion was asked for
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    peak_rss: int = 0
    bytes_read: int = 0  # source bytes this process asked its reader for (of several processes: its share)
    notes: list[str] = field(default_factory=list)

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def table(self) -> Table:
        """The summary as a rich table."""
        table = Table(
            title=escape(f"{self.source_format} -> {self.target_format}: {self.destination}"), title_justify="left"
        )
        for column in ("tensors", "bytes", "seconds", "MB/s", "peak RSS"):
            table.add_column(column, justify="right")
        table.add_row(
            str(self.tensors),
            human_bytes(self.bytes),
            f"{self.seconds:.2f}",
            f"{self.megabytes_per_second:.1f}",
            human_bytes(self.peak_rss),
        )
        return table


def _progress(console: Console | None) -> Progress | None:
    if console is None:
        return None
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=False),
        TransferSpeedColumn(),
        TextColumn("{task.fields[done]}/{task.fields[count]} tensors"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )




Step = tuple[LazyTensor, int | None]  # a whole tensor (None), or piece k of a stacked one


def write_order(tensors: Mapping[str, LazyTensor], layer_major: bool = False) -> list[Step]:
    """The order tensors and pieces are computed and written in.

    Tensor by tensor (each stacked one piece by piece) by default. With
    `layer_major` (a writer that takes pieces in any order, and a source that
    stores layers one by one), piece k of every stacked tensor comes before
    piece k + 1 of any: the pieces of one layer are then computed together,
    so a fused source tensor (Megatron's q/k/v, gate/up) is read once for
    all its parts instead of once per output tensor.
    """
    if not layer_major:
        return [
            step
            for t in tensors.values()
            for step in ([(t, None)] if t.pieces is None else [(t, k) for k in range(len(t.pieces))])
        ]
    whole = [(t, None) for t in tensors.values() if t.pieces is None]
    stacked = [t for t in tensors.values() if t.pieces]  # a tensor of no pieces has no step (its writer creates it)
    rounds = max((len(t.pieces) for t in stacked), default=0)
    return whole + [(t, k) for k in range(rounds) for t in stacked if k < len(t.pieces)]


def _units(order: list[Step], hash_ahead: Callable | None = None) -> Iterator[tuple[int, Callable[[], np.ndarray]]]:
    """(bytes, compute) for each step of `order`.

    Each unit ends with its result in C order, so the copy a transposed view
    needs happens on a reader thread, not in the writer (which then only moves bytes).
    `hash_ahead(name, shape, index, array)` (the integrity manifest's) hashes it there too.
    """
    for t, k in order:
        if k is None:
            yield t.nbytes, _contiguous(t.read, hash_ahead and functools.partial(hash_ahead, t.name, t.shape, None))
        else:
            ahead = hash_ahead and functools.partial(hash_ahead, t.name, t.shape, t.pieces[k][0])
            yield t.nbytes // len(t.pieces), _contiguous(t.pieces[k][1], ahead)


def stored_as_is(out: Mapping[str, LazyTensor], stored: Mapping[str, LazyTensor]) -> dict[str, LazyTensor]:
    """`out`, where a tensor is stored under the same name, shape and dtype in the source: that one, chunk by chunk.

    Why: between two checkpoints of one format and layout (MaxText -> MaxText
    to drop the optimizer state, say) the HF round trip is the identity, yet
    it would transpose every kernel twice, re-scale the query kernel (one ulp
    off at some head dims) and cut stacked tensors into layers whose chunks
    span all layers. Copied in the source's own chunks instead, each chunk is
    read once and written as one chunk of the same shape, bit for bit.
    """
    from maxckpt.containers.orbax import chunk_boxes

    result = dict(out)
    for name, t in out.items():
        s = stored.get(name)
        if (
            s is None
            or not s.shape
            or not s.chunk_shape
            or s.shape != t.shape
            or np.dtype(s.dtype) != np.dtype(t.dtype)
        ):
            continue
        boxes = [
            tuple(slice(lo, hi) for lo, hi in box)
            for box in chunk_boxes([(0, d) for d in s.shape], tuple(s.chunk_shape))
        ]
        result[name] = replace(s, pieces=tuple((box, functools.partial(s.read, box)) for box in boxes))
    return result


def _contiguous(
    fn: Callable[[], np.ndarray], then: Callable[[np.ndarray], None] | None = None
) -> Callable[[], np.ndarray]:
    if then is None:
        return lambda: np.ascontiguousarray(fn())

    def compute() -> np.ndarray:
        array = np.ascontiguousarray(fn())
        then(array)
        return array

    return compute


def write_tensors(
    writer: TensorWriter,
    tensors: Mapping[str, LazyTensor],
    progress: Progress | None = None,
    *,
    workers: int = 1,
    read_budget: int | None = None,
    layer_major: bool = False,
    hash_ahead: Callable | None = None,
) -> int:
    """Write `tensors` (stacked ones piece by piece); returns bytes written.

    Up to `workers` threads read and compute the next tensors or pieces while
    this thread writes the current one (see :mod:`maxckpt.conversion.scheduling`);
    results arrive in order, so the output does not depend on `workers`.
    `layer_major` interleaves the pieces of stacked tensors (see
    :func:`write_order`); it needs a writer with `write_piece` (one that
    created every array up front) and is ignored otherwise.
    """
    total = sum(t.nbytes for t in tensors.values())
    task = progress.add_task("converting", total=total, done=0, count=len(tensors)) if progress else None
    order = write_order(tensors, layer_major and hasattr(writer, "write_piece"))
    largest = max((each for each, _ in _units(order)), default=0)
    budget = inflight_budget(read_budget, largest)
    outstanding = getattr(writer, "pending_bytes", None)
    if outstanding is not None:  # queued writes share the budget with the reads ahead (see OrbaxWriter)
        writer.max_pending_bytes = budget
    stream = run_ordered(_units(order, hash_ahead), workers=workers, budget=budget, outstanding=outstanding)
    written, done = 0, 0
    trimmer = allocator.Trimmer()  # the mmap threshold is the caller's to raise (the CLI does): see allocator

    def finished(t: LazyTensor) -> None:
        nonlocal written, done
        written += t.nbytes
        done += 1
        trimmer.wrote(t.nbytes)
        if progress is not None:
            progress.update(task, done=done)

    try:
        if layer_major and hasattr(writer, "write_piece"):
            for t in tensors.values():
                if t.pieces is not None and not t.pieces:  # an empty stacked tensor still gets its array
                    writer.write_pieces(t.name, t.shape, t.dtype, [])
                    finished(t)
            for t, k in order:
                part = _checked(t, next(stream))
                if k is None:
                    writer.write(t.name, part)
                else:
                    writer.write_piece(t.name, t.pieces[k][0], part)
                if progress is not None:
                    progress.advance(task, part.nbytes)
                del part
                if k is None or k == len(t.pieces) - 1:
                    finished(t)
        else:
            for t in tensors.values():
                if t.pieces is not None:

                    def pieces(t=t):
                        for index, _ in t.pieces:
                            part = _checked(t, next(stream))
                            if progress is not None:
                                progress.advance(task, part.nbytes)
                            yield index, part

                    writer.write_pieces(t.name, t.shape, t.dtype, pieces())
                else:
                    writer.write(t.name, _checked(t, next(stream)))
                    if progress is not None:
                        progress.advance(task, t.nbytes)
                finished(t)
    finally:
        stream.close()  # a failed write stops the readers here (and waits for them), not at garbage collection
        allocator.trim()  # what the conversion freed goes back to the system now
    return written


def _checked(t: LazyTensor, array: np.ndarray) -> np.ndarray:
    # Writers would cast silently (numpy assignment); a dtype the layout did not promise is a bug to surface.
    if array.dtype != np.dtype(t.dtype):
        raise ConversionError(f"tensor {t.name}: computed dtype {array.dtype}, expected {np.dtype(t.dtype)}")
    return array


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    to: str,
    model: str | None = None,
    dtype: str | np.dtype | None = None,
    step: int | None = None,
    overwrite: bool = False,
    options: TargetOptions | None = None,
    source: SourceOptions | None = None,
    workers: int | None = None,
    progress: bool | Console = False,
    distributed: Distributed | None = None,
) -> ConversionReport:
    """Convert checkpoint `src` to format `to` at `dst`, streaming one tensor at a time.

    The source format is detected. `model` (a family such as `llama3.1` or a
    MaxText model name such as `llama3.1-8b`) settles what shapes cannot tell;
    `dtype` casts floating tensors; `step` picks the source's step.
    `options` are the target's knobs, one class per format
    (:mod:`maxckpt.formats`: `MaxTextOptions`, `HFOptions`, `MegatronOptions`,
    `TorchTitanOptions`, `TorchOptions`; None: its defaults). Megatron and
    TorchTitan targets record a training step: the source's (MaxText `step`,
    TorchTitan `train_state.step`, Megatron iteration) unless their
    `iteration` says otherwise; `release=True` records none. A `torch` target whose
    `dst` ends in `.pt`/`.pth`/`.bin` is one file, otherwise a sharded dir.
    `source` says how to read the source (:class:`SourceOptions`: `--hf-config`,
    `--set`, `--maxtext-config`, `--read-budget`). `workers` threads read and
    decode ahead of the writer (default: the cores); the output is the same for any value.

    `distributed` (:class:`Distributed`) shares the work between several
    processes (jax.distributed): `coordinator="host:port", num_processes=N,
    process_id=I` on each, or `auto=True` for JAX's cluster auto-detection;
    each writes a size-balanced share into DST (a folder they all see, or a gs:// or s3:// bucket),
    and process 0 commits it once all succeeded (:mod:`maxckpt.conversion.distributed`).

    >>> convert("ckpt/checkpoints", "out-hf", to="hf", model="qwen3-0.6b", dtype="bfloat16")  # doctest: +SKIP
    >>> convert("ckpt/checkpoints", "out-mcore", to="megatron", model="llama3.1-8b",
    ...         options=MegatronOptions(spec="local"))  # doctest: +SKIP
    """
    scale_out = distributed or Distributed()
    request = dist.distributed_request(scale_out.coordinator, scale_out.num_processes, scale_out.process_id,
                                       scale_out.auto, scale_out.timeout)
    target = get_format(to)
    if not target.writable:
        raise ConversionError(f"format {to!r} can be read but not written")
    knobs = _target_options(to, options)
    run = functools.partial(
        _convert, src, dst, target=target, model=model, dtype=dtype, step=step, overwrite=overwrite, knobs=knobs,
        source=source or SourceOptions(), workers=workers, progress=progress,
    )
    if request is not None:
        dist.refuse_target(target, dst)
        return dist.run(request, lambda group: run(group=group))
    return run(group=None)


def _target_options(to: str, options: Any) -> TargetOptions:
    """`options` when they are the knobs of target `to`, its defaults for None; another target's are refused."""
    cls = TARGET_OPTIONS[to]
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise ConversionError(
            f"options {type(options).__name__} are another target's knobs; --to {to} takes {cls.__name__}"
        )
    return options


def _convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    target: Any,
    model: str | None,
    dtype: str | np.dtype | None,
    step: int | None,
    overwrite: bool,
    knobs: TargetOptions,
    source: SourceOptions,
    workers: int | None,
    progress: bool | Console,
    group: Any,
) -> ConversionReport:
    """:func:`convert` in this process: all of it, or (`group`: several processes) this process's share."""
    quantize = getattr(knobs, "quantize", None)
    workers = validate_workers(workers)
    src, dst = normalize(src), normalize(dst)
    hf_config = normalize_optional(source.hf_config)
    # On a bucket DST of several processes only process 0 judges an existing DST: it removes it (--overwrite)
    # while the others start, so what they would see is no verdict. The others check only that DST is no source.
    check_destination(src, dst, overwrite and (group is None or group.rank == 0 or not is_url(dst)))
    _check_destination_folder(dst)
    export_dtype = parse_dtype(dtype)
    options = ConversionOptions(
        model=model,
        step=step,
        dtype=export_dtype,
        hf_config=Path(hf_config) if hf_config else None,
        overrides=dict(source.overrides or {}),
        maxtext_config=Path(normalize_optional(source.maxtext_config)) if source.maxtext_config else None,
        read_budget=source.read_budget,
        target=_normalized(knobs),
        torch_single_file=Path(dst).suffix in (".pt", ".pth", ".bin"),
    )
    console = progress if isinstance(progress, Console) else (Console(stderr=True) if progress else None)
    started = time.perf_counter()
    with open_checkpoint(src, format=source.format, options=options) as ckpt:
        checker = integrity.watch_source(ckpt)  # a source with a manifest: every tensor read is checked against it
        spec = ckpt.spec
        # a preset's values, for the sidecars to record
        options = replace(options, assumed_settings=ckpt.assumed_settings)
        require_bridge(ckpt.format.name, spec.family, "from")
        require_bridge(target.name, spec.family, "to")
        notes = list(ckpt.notes)
        # the tensors left unquantized, as releases store them
        if export_dtype is None and quantize and not ckpt.quantization:
            export_dtype = parse_dtype("bfloat16")
            options = replace(options, dtype=export_dtype)
        elif export_dtype is None and ckpt.quantization:  # FP8 / MXFP4 are read dequantized in float32 (exact)
            ckpt.dequantized_dtype = parse_dtype("bfloat16")
        if ckpt.quantization:
            written = (
                "float32, exact"
                if quantize or export_dtype == np.float32
                else np.dtype(export_dtype or ckpt.dequantized_dtype).name
            )
            notes.append(f"quantized source ({ckpt.describe_quantization()}) dequantized to {written}" + (
                "; pass --dtype float32 for the exact values" if export_dtype is None else ""))
        if target.records_step:
            iteration, release = knobs.iteration, knobs.release  # type: ignore[union-attr]
            step_out = iteration if iteration is not None else (None if release else ckpt.step)
            options = replace(options, recorded_step=step_out)
            if iteration is None and step_out is not None:
                notes.append(
                    f"training step {step_out} of the source carried over to the {target.name} output; "
                    "pass --iteration N to choose another or --release to record none"
                )
        hf = ckpt.hf_tensors(None if quantize else export_dtype)  # quantized from the values as read, not rounded first
        out = target.layout(options).from_hf(hf, spec)
        if ckpt.format.name == target.name:
            out = stored_as_is(out, ckpt.lazy_tensors())
        quantized: set[str] = set()
        if quantize:
            from maxckpt.formats.hf.quantization import quantize_tensors

            out, quantized = quantize_tensors(out, spec.family, quantize)
            notes.append(f"--quantize {quantize}: {len(quantized) // 2} tensors stored quantized, with their scales")
        if export_dtype is not None:
            out = {n: t if n in quantized else tf.lazy_cast(t, export_dtype) for n, t in out.items()}
        written_dtype = export_dtype or _main_dtype(out)
        if "maxtext" in (ckpt.format.name, target.name) and ckpt.format.name != target.name:
            # the model is float32 and stays so: the MaxText <-> HF scale factors round (formats/maxtext/layout.py)
            if _main_dtype(hf) == np.float32 and written_dtype == np.float32:
                rounding = float32_rounding_note(spec)
                if rounding is not None:
                    notes.append(rounding)
        infos = [written_info(t) for t in out.values()]
        layer_major = not ckpt.format.stacked_layers  # see write_order: Megatron's fused tensors are then read once
        report = ConversionReport(
            as_path(src),
            as_path(dst),
            ckpt.format.name,
            target.name,
            spec,
            step=options.recorded_step,
            options=options,
            notes=notes,
        )
        bar = _progress(console)
        manifest = integrity.Manifest()
        hashed = functools.partial(
            _hashed_write, manifest=manifest, checker=checker, shapes={n: (t.shape, t.dtype) for n, t in out.items()},
            workers=workers, read_budget=options.read_budget, layer_major=layer_major,
        )
        if group is not None:  # one of several processes: write this one's share (maxckpt.conversion.distributed)
            with bar if bar is not None else contextlib.nullcontext():
                count, report.bytes = dist.write_output(
                    group,
                    dst=dst,
                    overwrite=overwrite,
                    notes=notes,
                    target=_merging_manifests(target, out, options, group.size),
                    spec=spec,
                    tensors=out,
                    options=options,
                    sidecar_options=replace(options, dtype=written_dtype),
                    progress=bar,
                    write=functools.partial(hashed, part_of=group.rank),
                    read_within=getattr(ckpt.layout, "read_within_layers", None),
                )
            report.tensors, report.seconds, report.peak_rss = count, time.perf_counter() - started, peak_rss_bytes()
            report.bytes_read = ckpt.bytes_read
            notes.append(
                f"process {group.rank} of {group.size} wrote {count} of {len(out)} tensors "
                f"({human_bytes(report.bytes)}) and read {report.bytes_read:,} bytes of the source "
                f"(peak RSS {human_bytes(report.peak_rss)})"
            )
            return report
        with staged_output(dst, overwrite, notes, native=target.name in outputs.NATIVE_FORMATS) as tmp:
            writer = target.open_writer(tmp, spec, infos, options)
            with bar if bar is not None else contextlib.nullcontext():
                report.bytes = write_and_close(writer, lambda: hashed(writer, out, bar))
            target.write_sidecars(tmp, spec, replace(options, dtype=written_dtype))
            folder = manifest_dir(tmp, target.name, options)
            if folder is not None:  # committed with the output (a bucket's journal and markers included)
                integrity.write_file(folder / integrity.MANIFEST_NAME, manifest.to_json())
        if manifest_dir(dst, target.name, options) is None:  # one torch file: its sidecar, once it is in place
            integrity.write_sidecar(dst, manifest)
        report.bytes_read = ckpt.bytes_read
    report.tensors = len(out)
    report.seconds = time.perf_counter() - started
    report.peak_rss = peak_rss_bytes()
    return report


def _hashed_write(
    writer: TensorWriter,
    tensors: Mapping[str, LazyTensor],
    progress: Progress | None,
    *,
    manifest: integrity.Manifest,
    checker: integrity.CheckingReader | None,
    shapes: Mapping[str, tuple],
    part_of: int | None = None,
    **kwargs: Any,
) -> int:
    """:func:`write_tensors`, hashing every tensor into `manifest` on its way to `writer` (see \
:mod:`maxckpt.integrity`).

    Then what the source's manifest could not check on the fly is checked
    (`checker`), still before the writer closes, so a damaged source fails
    the conversion before anything is committed. `part_of`: this process's
    rank in a multi-process conversion, whose hashes go to a part file that
    process 0 merges (:func:`_merging_manifests`).
    """
    if checker is not None:  # a tensor the source check hashed, passed through unchanged, is not hashed again
        manifest.known_crc = checker.known_crc
    hashing = integrity.HashingWriter(writer, manifest, shapes)
    written = write_tensors(hashing, tensors, progress, hash_ahead=manifest.hash_ahead, **kwargs)
    hashing.end_pieces()
    if checker is not None:
        checker.finish()
    if part_of is not None:
        integrity.write_part(integrity.output_dir_of(writer), part_of, manifest)
    return written


def _merging_manifests(target: Format, tensors: Mapping[str, LazyTensor], options: ConversionOptions,
                       processes: int) -> Format:
    """`target` whose sidecar step (process 0, once every share is written) also merges the processes' manifests."""

    class Merging(type(target)):  # type: ignore[misc, valid-type]
        def write_sidecars(self, tmp, spec, sidecar_options):
            super().write_sidecars(tmp, spec, sidecar_options)
            folder = manifest_dir(tmp, target.name, options)
            merged = integrity.merge_parts(folder, tensors, processes)
            integrity.write_file(folder / integrity.MANIFEST_NAME, merged.to_json())

    return Merging()


def _check_destination_folder(dst: Path) -> None:
    """DST's nearest existing ancestor must be a folder; under a file or a device, mkdir said only "File exists"."""
    if is_url(dst):
        return
    for parent in Path(dst).parents:
        if parent.is_dir():
            return
        if parent.exists():
            raise ConversionError(
                f"cannot write {dst}: {parent} is {special_kind(parent) or 'a regular file'}, not a folder; "
                "choose a destination inside a folder. Nothing was written"
            )


def _normalized(knobs: TargetOptions) -> TargetOptions:
    """`knobs` with a tokenizer path normalised as the source's paths are (absolute, or a bucket URL)."""
    tokenizer = getattr(knobs, "tokenizer", None)
    return knobs if tokenizer is None else replace(knobs, tokenizer=Path(normalize_optional(tokenizer)))


def _main_dtype(tensors: Mapping[str, LazyTensor]) -> np.dtype | None:
    """The dtype holding most floating bytes (what config.json's torch_dtype should say)."""
    sizes: dict[np.dtype, int] = {}
    for t in tensors.values():
        if tf.is_float(t.dtype):
            sizes[np.dtype(t.dtype)] = sizes.get(np.dtype(t.dtype), 0) + t.nbytes
    return max(sizes, key=sizes.get) if sizes else None
