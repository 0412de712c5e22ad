"""The tensor tree of one checkpoint, from metadata only: what `maxckpt inspect` shows.

Every stored tensor with shape, dtype and bytes, in the checkpoint's own
names (for Orbax: the whole train state - params, opt_state, step, nnx_aux -
not only what a layout maps), grouped as model parameters, optimizer state
or other state, with totals. Only metadata is read (Orbax `_METADATA` and
zarr headers, safetensors headers, DCP `.metadata`), so it takes the same
time on a 70B checkpoint as on a tiny one. `stats=True` additionally reads
every tensor, block by block, for mean/std/absmax and NaN counts.

>>> tree = inspect_checkpoint("runs/llama/checkpoints")        # doctest: +SKIP
>>> tree.totals().parameters, tree.totals().bytes_by_dtype      # doctest: +SKIP
(8030261248, {'float32': 96363134976})
>>> [s.path for s in tree.collapse(2)]                          # doctest: +SKIP
['opt_state/0', 'opt_state/2', 'params/params', 'step']
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from maxckpt.conversion.checkpoint import open_checkpoint
from maxckpt.errors import MaxckptError, UnsupportedModelError
from maxckpt.explore.stats import DEFAULT_BUDGET, TensorStats, tensor_stats
from maxckpt.units import human_bytes, human_count
from maxckpt.tensors import TensorInfo

PARAMS, OPTIMIZER, OTHER = "params", "optimizer", "other"
GROUPS = (PARAMS, OPTIMIZER, OTHER)

# First path components that name optimizer state / other training state, across frameworks
# (MaxText/optax, TorchTitan, Megatron, HF Trainer); everything else is a model parameter.
_OPTIMIZER_ROOTS = {"opt_state", "optimizer", "optim", "optimizer_state", "optimizer_states"}
_OTHER_ROOTS = {
    "step", "nnx_aux", "train_state", "rng_state", "rng", "rngs", "dataloader", "lr_scheduler",
    "lr_schedulers", "scheduler", "args", "iteration", "checkpoint_version",
}


def tensor_group(name: str, sep: str = "/") -> str:
    """`params`, `optimizer` or `other` for a stored tensor name.

    >>> tensor_group("opt_state/0/mu/params/decoder/decoder_norm/scale"), tensor_group("step")
    ('optimizer', 'other')
    >>> tensor_group("model.layers.0.mlp.up_proj.weight", ".")
    'params'
    """
    parts = name.split(sep)
    if parts[0] in _OPTIMIZER_ROOTS:
        return OPTIMIZER
    if parts[0] in _OTHER_ROOTS or parts[-1].endswith("_extra_state"):
        return OTHER
    return PARAMS


def natural_key(name: str) -> list[Any]:
    """Sort key that puts `layers.2` before `layers.10`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class TensorEntry:
    """One stored tensor (metadata), with statistics when they were asked for."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    size: int
    group: str
    chunk_shape: tuple[int, ...] | None = None
    stats: TensorStats | None = None
    quantization: str | None = None  # a quantized checkpoint's codes or scales: the method, and the weight they hold

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.nbytes,
            "size": self.size,
            "group": self.group,
            "chunk_shape": None if self.chunk_shape is None else list(self.chunk_shape),
        }
        if self.stats is not None:
            out["stats"] = self.stats.to_dict()
        if self.quantization is not None:
            out["quantization"] = self.quantization
        return out


@dataclass(frozen=True)
class Subtree:
    """The tensors under one path prefix (`--depth`), summed."""

    path: str
    tensors: int
    size: int
    nbytes: int
    dtypes: tuple[str, ...]
    groups: tuple[str, ...]
    shape: tuple[int, ...] | None = None  # set when the subtree is one tensor of that exact name

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "tensors": self.tensors,
            "size": self.size,
            "bytes": self.nbytes,
            "dtypes": list(self.dtypes),
            "groups": list(self.groups),
            "shape": None if self.shape is None else list(self.shape),
        }


@dataclass(frozen=True)
class GroupTotal:
    tensors: int = 0
    size: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Totals:
    """Totals over a tree: `parameters` counts the elements of the model parameters only."""

    tensors: int
    size: int
    bytes: int
    parameters: int
    bytes_by_dtype: dict[str, int]
    groups: dict[str, GroupTotal]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": self.tensors,
            "size": self.size,
            "bytes": self.bytes,
            "parameters": self.parameters,
            "bytes_by_dtype": dict(self.bytes_by_dtype),
            "groups": {g: {"tensors": t.tensors, "size": t.size, "bytes": t.nbytes} for g, t in self.groups.items()},
        }


@dataclass
class TensorTree:
    """The stored tensors of one checkpoint (see :func:`inspect_checkpoint`)."""

    path: str
    format: str
    step: int | None
    sep: str
    entries: list[TensorEntry]
    objects: list[str] = field(default_factory=list)  # non-tensor items (DCP bytes items)
    filter: str | None = None
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------- queries

    def totals(self) -> Totals:
        by_dtype: dict[str, int] = {}
        groups = {g: GroupTotal() for g in GROUPS}
        for e in self.entries:
            by_dtype[e.dtype] = by_dtype.get(e.dtype, 0) + e.nbytes
            g = groups[e.group]
            groups[e.group] = GroupTotal(g.tensors + 1, g.size + e.size, g.nbytes + e.nbytes)
        return Totals(
            tensors=len(self.entries),
            size=sum(e.size for e in self.entries),
            bytes=sum(e.nbytes for e in self.entries),
            parameters=groups[PARAMS].size,
            bytes_by_dtype=dict(sorted(by_dtype.items())),
            groups=groups,
        )

    def filtered(self, pattern: str | None) -> "TensorTree":
        """The tensors whose full name matches the glob `pattern` (`*` also crosses separators)."""
        if not pattern:
            return self
        kept = [e for e in self.entries if fnmatch.fnmatchcase(e.name, pattern)]
        notes = list(self.notes)
        if not kept:
            notes.append(
                f"no tensor name matches {pattern!r} (of {len(self.entries)}; names look like {self.entries[0].name!r})"
                if self.entries
                else f"no tensor matches {pattern!r}"
            )
        return TensorTree(self.path, self.format, self.step, self.sep, kept, self.objects, pattern, notes)

    def collapse(self, depth: int) -> list[Subtree]:
        """One row per path prefix of `depth` components, with per-subtree totals.

        >>> t = TensorTree("x", "hf", None, ".", [
        ...     TensorEntry("model.a.w", (2,), "float32", 8, 2, "params"),
        ...     TensorEntry("model.b.w", (3,), "float32", 12, 3, "params")])
        >>> [(s.path, s.tensors, s.nbytes) for s in t.collapse(1)]
        [('model', 2, 20)]
        """
        if depth < 1:
            raise MaxckptError(f"depth {depth}: a subtree has at least 1 name component; pass depth >= 1")
        acc: dict[str, list[TensorEntry]] = {}
        for e in self.entries:
            key = self.sep.join(e.name.split(self.sep)[:depth])
            acc.setdefault(key, []).append(e)
        out = []
        for key, members in acc.items():
            single = len(members) == 1 and members[0].name == key
            out.append(
                Subtree(
                    path=key,
                    tensors=len(members),
                    size=sum(m.size for m in members),
                    nbytes=sum(m.nbytes for m in members),
                    dtypes=tuple(sorted({m.dtype for m in members})),
                    groups=tuple(g for g in GROUPS if any(m.group == g for m in members)),
                    shape=members[0].shape if single else None,
                )
            )
        return out

    # ------------------------------------------------------------- output

    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        """JSON-ready: what `maxckpt inspect --json` prints."""
        out: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "step": self.step,
            "filter": self.filter,
            "totals": self.totals().to_dict(),
            "tensors": [e.to_dict() for e in self.entries],
            "objects": list(self.objects),
            "notes": list(self.notes),
        }
        if depth is not None:
            out["depth"] = depth
            out["subtrees"] = [s.to_dict() for s in self.collapse(depth)]
        return out

    def to_json(self, depth: int | None = None) -> str:
        return json.dumps(self.to_dict(depth), indent=2)

    def _title(self) -> str:
        step = "" if self.step is None else f", step {self.step}"
        flt = "" if not self.filter else f", filter {self.filter!r}"
        return escape(f"{self.path}  ({self.format}{step}{flt})")

    def table(self, depth: int | None = None) -> Table:
        """Every tensor, or with `depth` one row per subtree with its totals."""
        table = Table(title=self._title(), title_justify="left")
        if depth is not None:
            for col, justify in (
                ("subtree", "left"),
                ("tensors", "right"),
                ("shape", "left"),
                ("dtype", "left"),
                ("elements", "right"),
                ("bytes", "right"),
                ("group", "left"),
            ):
                table.add_column(col, justify=justify, overflow="fold" if col == "subtree" else "ellipsis")
            for s in self.collapse(depth):
                shape = "-" if s.shape is None else str(list(s.shape))
                table.add_row(
                    escape(s.path),
                    str(s.tensors),
                    shape,
                    ", ".join(s.dtypes),
                    human_count(s.size),
                    human_bytes(s.nbytes),
                    escape(", ".join(s.groups)),
                )
            return table
        stats = any(e.stats is not None for e in self.entries)
        for col, justify in (
            ("tensor", "left"),
            ("shape", "left"),
            ("dtype", "left"),
            ("bytes", "right"),
            ("group", "left"),
        ):
            table.add_column(col, justify=justify, overflow="fold" if col == "tensor" else "ellipsis")
        if stats:
            for col in ("mean", "std", "absmax", "nan"):
                table.add_column(col, justify="right")
        quantized = any(e.quantization for e in self.entries)
        if quantized:
            table.add_column("quantization", overflow="fold")
        for e in self.entries:
            cells = [escape(e.name), str(list(e.shape)), e.dtype, human_bytes(e.nbytes), escape(e.group)]
            if stats:
                s = e.stats
                cells += ["-"] * 4 if s is None else [f"{s.mean:.4g}", f"{s.std:.4g}", f"{s.absmax:.4g}", _nan_cell(s)]
            if quantized:
                cells.append(escape(e.quantization or ""))
            table.add_row(*cells)
        return table

    def totals_table(self) -> Table:
        """Parameters, bytes by dtype, and params vs optimizer vs other state."""
        t = self.totals()
        table = Table(title="totals", title_justify="left")
        for col, justify in (("", "left"), ("tensors", "right"), ("elements", "right"), ("bytes", "right")):
            table.add_column(col, justify=justify)
        for g in GROUPS:
            gt = t.groups[g]
            if gt.tensors:
                label = "model parameters" if g == PARAMS else ("optimizer state" if g == OPTIMIZER else "other state")
                table.add_row(label, str(gt.tensors), f"{gt.size:,}", human_bytes(gt.nbytes))
        table.add_section()
        table.add_row("[bold]all[/]", str(t.tensors), f"{t.size:,}", human_bytes(t.bytes))
        table.add_section()
        for dtype, nbytes in t.bytes_by_dtype.items():
            table.add_row(f"dtype {dtype}", "", "", human_bytes(nbytes))
        return table

    def print(self, console: Console, depth: int | None = None) -> None:
        """Both tables and the notes, as `maxckpt inspect` prints them."""
        console.print(self.table(depth))
        console.print(self.totals_table())
        t = self.totals()
        console.print(
            f"{t.parameters:,} model parameters ({human_count(t.parameters)}), {human_bytes(t.bytes)} "
            f"in {t.tensors} tensors"
        )
        if self.objects:
            shown = ", ".join(self.objects[:3]) + (", ..." if len(self.objects) > 3 else "")
            console.print(f"[dim]{len(self.objects)} non-tensor item(s) not listed: {escape(shown)}[/]")
        for note in self.notes:
            console.print(f"[yellow]note:[/] {escape(note)}")


def _nan_cell(s: TensorStats) -> str:
    text = str(s.nan_count) + (f" (+{s.inf_count} inf)" if s.inf_count else "")
    return f"[red]{text}[/]" if s.nan_count or s.inf_count else text


# ------------------------------------------------------------------ building


def _separator(names: Iterable[str]) -> str:
    return "/" if any("/" in n for n in names) else "."


def _entries(infos: dict[str, TensorInfo], sep: str) -> list[TensorEntry]:
    out = []
    for name in sorted(infos, key=natural_key):
        info = infos[name]
        out.append(
            TensorEntry(
                name=name,
                shape=tuple(int(d) for d in info.shape),
                dtype=str(np.dtype(info.dtype)),
                nbytes=int(info.nbytes),
                size=int(info.size),
                group=tensor_group(name, sep),
                chunk_shape=None if info.chunk_shape is None else tuple(int(c) for c in info.chunk_shape),
            )
        )
    return out


def inspect_checkpoint(
    path: str | os.PathLike,
    *,
    step: int | None = None,
    format: str | None = None,
    filter: str | None = None,
    stats: bool = False,
    budget: int = DEFAULT_BUDGET,
    progress: Console | None = None,
    model: str | None = None,
    maxtext_config: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TensorTree:
    """The tensor tree of the checkpoint at `path` (any registered format, detected).

    For a run or `checkpoints/` dir the newest committed step is shown
    (`step` picks another). `filter` is a glob on the stored names;
    `stats=True` reads the (filtered) tensors in blocks of `budget` bytes and
    attaches :class:`~maxckpt.explore.stats.TensorStats`; `progress` is a
    console for a progress bar while doing so.

    A MaxText source given `maxtext_config`, `model` or `overrides` (or whose run dir holds a record of its
    config) gets notes naming the model settings a conversion would use and where they came from
    (:mod:`maxckpt.conversion.run_settings`), from metadata alone; another format refuses `maxtext_config`.
    """
    with open_checkpoint(path, format=format, step=step, model=model, overrides=overrides,
                         maxtext_config=maxtext_config) as ckpt:
        reader = ckpt.reader
        infos = ckpt.tensors()
        sep = _separator(infos)
        objects = list(reader.objects()) if hasattr(reader, "objects") else []
        source = getattr(reader, "items_dir", None) or getattr(reader, "path", None) or path
        # The step the directory is named for; `ckpt.step` would read MaxText's `step` array (data).
        tree = TensorTree(
            os.fspath(source), ckpt.format.name, getattr(reader, "step", None), sep, _entries(infos, sep), objects
        )
        tree.entries, tree.notes = _quantization(ckpt, tree.entries)  # a quantized HF checkpoint: how, or why refused
        tree.notes += _settings_notes(ckpt, asked=bool(model or maxtext_config or overrides))
        tree = tree.filtered(filter)
        if stats:
            tree.entries = _with_stats(reader, tree.entries, infos, budget, progress)
    return tree


def _settings_notes(ckpt, asked: bool) -> list[str]:
    """The model settings a conversion of a MaxText `ckpt` would use and where they came from (its notes), when
    the user asked (--maxtext-config, --model, --set) or the run dir records its config; else none."""
    from maxckpt.conversion import run_settings

    if ckpt.format.name != "maxtext":
        if asked:  # --maxtext-config (or MaxText-only --set keys) describe a MaxText run
            overrides = ckpt.options.overrides
            run_settings.refuse_for(ckpt.format.name, ckpt.options.maxtext_config,
                                    run_settings.split_overrides(overrides)[1])
        return []
    if not asked:
        from maxckpt.config.maxtext_run import run_config_file

        if run_config_file(ckpt.path) is None:
            return []
        try:
            ckpt.spec
        except MaxckptError as err:
            return [f"the model settings a conversion would use cannot be settled: {err}"]
    spec = ckpt.spec  # with flags: their errors (a config of another model, ...) are the answer
    return [f"a conversion would read this checkpoint as {spec.family}", *ckpt.notes]


def _quantization(ckpt, entries: list[TensorEntry]) -> tuple[list[TensorEntry], list[str]]:
    """A quantized HF checkpoint's entries with the method per codes and scales tensor, and a note.

    The codes count the parameters they hold (two FP4 codes a byte), the scales none; a method maxckpt does not
    read is listed as stored, with why convert, verify and diff refuse it as the note.
    """
    try:
        plan = ckpt.quantization
    except UnsupportedModelError as err:
        return entries, [str(err)]
    except MaxckptError:  # a damaged config.json matters only once the model settings are needed
        return entries, []
    if not plan:
        return entries, []
    codes, scales = {p.codes: p for p in plan.values()}, {p.scales: p for p in plan.values()}
    out = []
    for e in entries:
        if e.name in codes:
            p = codes[e.name]
            e = replace(e, size=math.prod(p.shape), quantization=f"{p.label} codes of {p.name} {list(p.shape)}")
        elif e.name in scales:
            e = replace(e, size=0, quantization=f"{scales[e.name].label} scales of {scales[e.name].name}")
        out.append(e)
    note = (
        f"quantized checkpoint ({ckpt.describe_quantization()}): convert, verify and diff read these weights "
        "dequantized; elements and parameters count the weights' values, not bytes of codes (scales count none)"
    )
    return out, [note]


def _with_stats(
    reader, entries: list[TensorEntry], infos: dict[str, TensorInfo], budget: int, console: Console | None
) -> list[TensorEntry]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(e.nbytes for e in entries)
    bar = None
    if console is not None:
        bar = Progress(
            TextColumn("statistics"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
    out = []
    with bar if bar is not None else contextlib.nullcontext():
        task = bar.add_task("stats", total=total) if bar is not None else None
        for e in entries:
            on_block = (lambda n: bar.advance(task, n)) if bar is not None else None
            s = tensor_stats(lambda index, n=e.name: reader.read(n, index), infos[e.name], budget, on_block)
            out.append(replace(e, stats=s))
    return out
