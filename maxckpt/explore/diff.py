"""Diff two checkpoints of any formats: tensors added, removed, reshaped, changed, unchanged.

By default both sides are opened with :func:`maxckpt.open_checkpoint` and
compared through their layouts, under HF names and shapes (the hub every
format maps to), so a MaxText step can be diffed against its HF, Megatron or
TorchTitan export, or against another step. `native=True` compares the
stored tensors by their own names instead (both sides in the same format):
that is how optimizer state and step counters of two Orbax training steps are
diffed too. With `native=None` (the default) two checkpoints of the same
format that are not models maxckpt can map (any other Orbax train state) are
compared natively, with a note.

Per tensor: the largest absolute difference and the relative difference
``||a - b|| / ||a||`` (L2 over the whole tensor; 0 when both are zero, inf
when only `a` is), computed in float64 one tensor (or block of rows) at a
time. NaNs in the same places on both sides count as equal.

It extends :class:`maxckpt.conversion.verify.TensorDiff` (the rows `maxckpt
verify` reports) with a status and the relative difference.

>>> report = diff_checkpoints("run/checkpoints/100", "run/checkpoints/200", model="llama3.1")  # doctest: +SKIP
>>> [(r.name, r.status, r.rel_diff) for r in report.changed][:1]                              # doctest: +SKIP
[('lm_head.weight', 'changed', 0.0132)]
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
from rich.markup import escape
from rich.table import Table

from maxckpt.units import check_tolerance
from maxckpt.conversion.checkpoint import Checkpoint, open_checkpoint
from maxckpt.conversion.verify import TensorDiff, abs_diff
from maxckpt.errors import MaxckptError
from maxckpt.formats.hf.quantization import read_compared
from maxckpt.explore.stats import DEFAULT_BUDGET, row_blocks
from maxckpt.explore.tree import natural_key
from maxckpt.tensors import Index, TensorInfo

ADDED, REMOVED, RESHAPED, CHANGED, UNCHANGED = "added", "removed", "reshaped", "changed", "unchanged"
STATUSES = (CHANGED, RESHAPED, ADDED, REMOVED, UNCHANGED)


@dataclass
class TensorChange(TensorDiff):
    """One tensor name of either side: its status and, when comparable, how much it moved."""

    status: str = ""
    rel_diff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        def num(v: float | None) -> float | str | None:
            return v if v is None or math.isfinite(v) else str(v)  # JSON has no inf/nan

        return {
            "name": self.name,
            "status": self.status,
            "shape_a": None if self.shape_a is None else list(self.shape_a),
            "shape_b": None if self.shape_b is None else list(self.shape_b),
            "dtype_a": self.dtype_a,
            "dtype_b": self.dtype_b,
            "max_abs_diff": num(self.max_abs_diff),
            "rel_diff": num(self.rel_diff),
        }


@dataclass
class DiffReport:
    """Every tensor of A and B with its status (see :func:`diff_checkpoints`)."""

    a: str
    b: str
    format_a: str
    format_b: str
    names: str  # "hf" (through the layouts) or "native" (stored names)
    atol: float
    rows: list[TensorChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _having(self, status: str) -> list[TensorChange]:
        return [r for r in self.rows if r.status == status]

    @property
    def added(self) -> list[TensorChange]:
        return self._having(ADDED)

    @property
    def removed(self) -> list[TensorChange]:
        return self._having(REMOVED)

    @property
    def reshaped(self) -> list[TensorChange]:
        return self._having(RESHAPED)

    @property
    def changed(self) -> list[TensorChange]:
        return self._having(CHANGED)

    @property
    def unchanged(self) -> list[TensorChange]:
        return self._having(UNCHANGED)

    @property
    def identical(self) -> bool:
        """True when every tensor is on both sides, same shape, within `atol`."""
        return bool(self.rows) and all(r.status == UNCHANGED for r in self.rows)

    @property
    def max_abs_diff(self) -> float:
        diffs = [r.max_abs_diff for r in self.rows if r.max_abs_diff is not None]
        return max(diffs) if diffs else float("nan")

    def counts(self) -> dict[str, int]:
        return {s: len(self._having(s)) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what `maxckpt diff --json` prints."""
        mad = self.max_abs_diff
        return {
            "a": self.a,
            "b": self.b,
            "format_a": self.format_a,
            "format_b": self.format_b,
            "names": self.names,
            "atol": self.atol,
            "identical": self.identical,
            "counts": self.counts(),
            "max_abs_diff": None if math.isnan(mad) else (mad if math.isfinite(mad) else str(mad)),
            "tensors": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self, show_unchanged: bool = False) -> Table:
        """Changed, reshaped, added and removed tensors (and unchanged ones when asked)."""
        names = "compared under HF names, through the layouts" if self.names == "hf" else "compared by stored names"
        title = f"{self.a} ({self.format_a})  vs  {self.b} ({self.format_b})"
        table = Table(
            title=escape(title),
            title_justify="left",
            caption=f"{names}; rel. diff = ||a-b|| / ||a||",
            caption_justify="left",
        )
        for col, justify in (
            ("tensor", "left"),
            ("status", "left"),
            ("shape", "left"),
            ("dtype", "left"),
            ("max |a-b|", "right"),
            ("rel. diff", "right"),
        ):
            table.add_column(col, justify=justify, overflow="fold" if col == "tensor" else "ellipsis")
        style = {CHANGED: "yellow", RESHAPED: "red", ADDED: "green", REMOVED: "red", UNCHANGED: "dim"}
        for r in self.rows:
            if r.status == UNCHANGED and not show_unchanged:
                continue
            shape = (
                str(list(r.shape_a or r.shape_b or ()))
                if r.shape_a == r.shape_b or None in (r.shape_a, r.shape_b)
                else f"{list(r.shape_a)} -> {list(r.shape_b)}"
            )
            dtype = (
                r.dtype_a if r.dtype_a == r.dtype_b or "-" in (r.dtype_a, r.dtype_b) else f"{r.dtype_a} -> {r.dtype_b}"
            )
            if r.dtype_a == "-":
                dtype = r.dtype_b
            mad = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
            rel = "-" if r.rel_diff is None else f"{r.rel_diff:.3g}"
            table.add_row(escape(r.name), f"[{style[r.status]}]{r.status}[/]", shape, dtype, mad, rel)
        return table

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{c[s]} {s}" for s in STATUSES if c[s]]
        mad = self.max_abs_diff
        tail = "" if math.isnan(mad) else f"; max |a-b| {mad:.3g}"
        return f"{len(self.rows)} tensors: " + ", ".join(parts) + tail


# ----------------------------------------------------------------- comparing


class _PairAccumulator:
    """max |a-b| and the squared norms, merged block by block."""

    def __init__(self) -> None:
        self.max_abs = 0.0
        self.diff_sq = 0.0
        self.a_sq = 0.0

    def update(self, xa: np.ndarray, xb: np.ndarray) -> None:
        a = np.asarray(xa, np.float64)
        b = np.asarray(xb, np.float64)
        if a.size == 0:
            return
        d = abs_diff(a, b)  # the one comparison rule, shared with `maxckpt verify`
        with np.errstate(over="ignore"):
            self.max_abs = max(self.max_abs, float(d.max()))
            self.diff_sq += float(np.sum(d * d))
            self.a_sq += float(np.sum(np.where(np.isfinite(a), a, 0.0) ** 2))

    def relative(self) -> float:
        if self.diff_sq == 0:
            return 0.0
        if self.a_sq == 0:
            return math.inf
        return math.sqrt(self.diff_sq) / math.sqrt(self.a_sq)


Reader = Callable[[Index | None], np.ndarray]


def compare_pair(
    name: str,
    info_a: TensorInfo,
    read_a: Reader,
    info_b: TensorInfo,
    read_b: Reader,
    atol: float = 0.0,
    budget: int = DEFAULT_BUDGET,
) -> TensorChange:
    """Compare one tensor present on both sides (block by block when it is large)."""
    da, db = str(np.dtype(info_a.dtype)), str(np.dtype(info_b.dtype))
    if tuple(info_a.shape) != tuple(info_b.shape):
        return TensorChange(
            name, tuple(info_a.shape), tuple(info_b.shape), da, db, None, False, "shape mismatch", RESHAPED
        )
    acc = _PairAccumulator()
    for index in row_blocks(info_a if info_a.nbytes >= info_b.nbytes else info_b, budget):
        acc.update(read_a(index), read_b(index))
    ok = acc.max_abs <= atol
    return TensorChange(
        name,
        tuple(info_a.shape),
        tuple(info_b.shape),
        da,
        db,
        acc.max_abs,
        ok,
        "" if ok else "differs",
        UNCHANGED if ok else CHANGED,
        acc.relative(),
    )


def _compare_all(
    infos_a: Mapping[str, TensorInfo], read_a: Callable[[str, Index | None], np.ndarray],
    infos_b: Mapping[str, TensorInfo], read_b: Callable[[str, Index | None], np.ndarray],
    atol: float, budget: int, pattern: str | None,
) -> list[TensorChange]:
    names = sorted(set(infos_a) | set(infos_b), key=natural_key)
    if pattern:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    rows = []
    for name in names:
        ia, ib = infos_a.get(name), infos_b.get(name)
        if ib is None:
            rows.append(
                TensorChange(
                    name, tuple(ia.shape), None, str(np.dtype(ia.dtype)), "-", None, False, "missing in B", REMOVED
                )
            )
        elif ia is None:
            rows.append(
                TensorChange(
                    name, None, tuple(ib.shape), "-", str(np.dtype(ib.dtype)), None, False, "missing in A", ADDED
                )
            )
        else:
            rows.append(
                compare_pair(name, ia, lambda i, n=name: read_a(n, i), ib, lambda i, n=name: read_b(n, i), atol, budget)
            )
    return rows


def _native_fallback(ca: Checkpoint, cb: Checkpoint) -> str | None:
    """Why two checkpoints of one format cannot be compared as models (None when they can)."""
    ca.check_convertible(), cb.check_convertible()  # quantized: refused, or compared dequantized, never code by code
    try:
        ca.spec, cb.spec  # noqa: B018 - settling the specs is the question asked here
    except MaxckptError as err:  # Checkpoint.spec turns a tree that is no Llama model into one
        return str(err)
    return None


def diff_checkpoints(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    model: str | None = None,
    model_b: str | None = None,
    step_a: int | None = None,
    step_b: int | None = None,
    native: bool | None = None,
    atol: float = 0.0,
    filter: str | None = None,
    budget: int = DEFAULT_BUDGET,
) -> DiffReport:
    """Compare checkpoints `a` and `b` tensor by tensor (see the module docstring).

    `model` names the model family of both (`model_b` of `b` alone) where a
    format cannot tell it (MaxText); `step_a`/`step_b` pick steps of run
    dirs; `filter` is a glob on the compared names.
    """
    atol = check_tolerance("atol", atol)
    notes: list[str] = []
    with (
        open_checkpoint(a, model=model, step=step_a) as ca,
        open_checkpoint(b, model=model_b or model, step=step_b) as cb,
    ):
        fmt_a, fmt_b = ca.format.name, cb.format.name
        if native is None:
            reason = _native_fallback(ca, cb) if fmt_a == fmt_b else None
            native = reason is not None
            if native:
                notes.append(f"not comparable as models ({reason}); compared the stored tensors by name")
        if native:
            if fmt_a != fmt_b:
                raise MaxckptError(
                    f"--native compares stored names, which differ between formats: {a} is {fmt_a}, {b} is {fmt_b}; "
                    "drop --native to compare them through the layouts (HF names)"
                )
            rows = _compare_all(ca.tensors(), ca.read, cb.tensors(), cb.read, atol, budget, filter)
        else:
            notes += [f"A: {n}" for n in ca.notes] + [f"B: {n}" for n in cb.notes]
            ha, hb = ca.hf_tensors(), cb.hf_tensors()
            rows = _compare_all(
                # a weight read dequantized is compared as converted: rounded to the other side's narrower dtype
                {n: t.info for n, t in ha.items()},
                lambda n, i: read_compared(ca, n, ha[n], hb[n].dtype if n in hb else ha[n].dtype),
                {n: t.info for n, t in hb.items()},
                lambda n, i: read_compared(cb, n, hb[n], ha[n].dtype if n in ha else hb[n].dtype),
                atol,
                2**62,
                filter,  # HF-view tensors are computed whole (one layer's tensor at a time)
            )
    return DiffReport(os.fspath(a), os.fspath(b), fmt_a, fmt_b, "native" if native else "hf", atol, rows, notes)
