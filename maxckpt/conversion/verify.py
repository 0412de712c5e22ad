"""Check a conversion: tensor by tensor through the layouts, or by logits.

`verify(a, b)` opens both checkpoints (any formats), maps both to HF names
and shapes, and compares every tensor (max absolute difference, in float32;
bfloat16 -> float32 is exact). Missing or extra tensors and shape mismatches
fail too. `verify_logits(a, b)` runs maxckpt's JAX reference of MaxText's
forward pass on `a` and transformers on `b`, on the same tokens.

>>> report = verify("run/checkpoints", "llama-hf", model="llama3.1-8b")  # doctest: +SKIP
>>> report.ok, report.max_abs_diff                                      # doctest: +SKIP
(True, 0.0)
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import re
from typing import Mapping

import numpy as np
from rich.markup import escape
from rich.table import Table

from maxckpt.units import check_tolerance
from maxckpt.conversion.checkpoint import Checkpoint, open_checkpoint
from maxckpt.conversion.options import SourceOptions
from maxckpt.errors import ConversionError
from maxckpt.formats.hf.quantization import read_compared
from maxckpt.storage.urls import as_path
from maxckpt.tensors import LazyTensor

_FUSED_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.down_proj$")

DEFAULT_TOKENS = (1, 5, 9, 13, 17, 21, 25, 29)  # the fixtures' tokens


@dataclass
class TensorDiff:
    name: str
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str
    dtype_b: str
    max_abs_diff: float | None  # None: not comparable (missing, shape mismatch)
    ok: bool
    problem: str = ""


@dataclass
class VerifyReport:
    a: Path
    b: Path
    atol: float
    rows: list[TensorDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows) and bool(self.rows)

    @property
    def failures(self) -> list[TensorDiff]:
        return [r for r in self.rows if not r.ok]

    @property
    def max_abs_diff(self) -> float:
        diffs = [r.max_abs_diff for r in self.rows if r.max_abs_diff is not None]
        return max(diffs) if diffs else float("nan")

    def table(self, only_failures: bool = False) -> Table:
        table = Table(title=escape(f"{self.a}  vs  {self.b}  (atol {self.atol:g})"), title_justify="left")
        for col, justify in (
            ("tensor (HF name)", "left"),
            ("shape", "left"),
            ("dtypes", "left"),
            ("max |a-b|", "right"),
            ("", "left"),
        ):
            table.add_column(col, justify=justify)
        for r in self.rows:
            if only_failures and r.ok:
                continue
            shape = str(r.shape_a) if r.shape_a == r.shape_b else f"{r.shape_a} vs {r.shape_b}"
            dtypes = r.dtype_a if r.dtype_a == r.dtype_b else f"{r.dtype_a} vs {r.dtype_b}"
            diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
            table.add_row(
                escape(r.name),
                shape,
                dtypes,
                diff,
                "[green]ok[/]" if r.ok else f"[red]{escape(r.problem or 'FAIL')}[/]",
            )
        return table


def _open(path, *, model, step, source: SourceOptions) -> Checkpoint:
    """One side of a comparison: a MaxText config (and MaxText-only `--set` keys) only reach a MaxText side."""
    from maxckpt.formats import detect_format
    from maxckpt.conversion.run_settings import split_overrides

    overrides, maxtext_config = dict(source.overrides or {}), source.maxtext_config
    if (maxtext_config is not None or split_overrides(overrides)[1]) and detect_format(path).name != "maxtext":
        maxtext_config, overrides = None, split_overrides(overrides)[0]
    return open_checkpoint(path, model=model, step=step, hf_config=source.hf_config, overrides=overrides,
                           maxtext_config=maxtext_config)


@contextlib.contextmanager
def _open_pair(
    a, b, model, model_b, step, source: SourceOptions | None
) -> Iterator[tuple[Checkpoint, Checkpoint]]:
    """Both sides of a comparison: `step` picks A's step (B's newest), `model_b` overrides B's family; the
    source options (config, `--set`, MaxText config) hold for both."""
    source = source or SourceOptions()
    with _open(a, model=model, step=step, source=source) as ca:
        with _open(b, model=model_b or model, step=None, source=source) as cb:
            yield ca, cb


def abs_diff(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """|a - b| elementwise, by the rule every comparison in maxckpt uses.

    Equal values (inf == inf) and NaNs at the same places do not differ; a
    NaN on one side only is infinitely different.

    >>> abs_diff(np.array([1.0, np.inf, np.nan, np.nan]), np.array([1.5, np.inf, np.nan, 0.0])).tolist()
    [0.5, 0.0, 0.0, inf]
    """
    same = (xa == xb) | (np.isnan(xa) & np.isnan(xb))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(xa - xb))
    diff[np.isnan(diff)] = np.inf
    return diff


def max_abs_diff(xa: np.ndarray, xb: np.ndarray) -> float:
    """max |a - b| by :func:`abs_diff`'s rule (0 for empty tensors).

    >>> max_abs_diff(np.array([1.0, np.inf, np.nan]), np.array([1.5, np.inf, np.nan]))
    0.5
    """
    return float(abs_diff(xa, xb).max()) if xa.size else 0.0


def compare_tensors(a: Checkpoint, b: Checkpoint, atol: float = 0.0) -> list[TensorDiff]:
    """Per-tensor comparison of two opened checkpoints in HF terms (one tensor pair in memory at a time)."""
    hf_a, hf_b = a.hf_tensors(), b.hf_tensors()
    rows: list[TensorDiff] = []
    for name, ta in hf_a.items():
        tb = hf_b.get(name)
        if tb is None:
            rows.append(TensorDiff(name, ta.shape, None, str(np.dtype(ta.dtype)), "-", None, False, "missing in B"))
            continue
        if ta.shape != tb.shape:
            rows.append(
                TensorDiff(
                    name,
                    ta.shape,
                    tb.shape,
                    str(np.dtype(ta.dtype)),
                    str(np.dtype(tb.dtype)),
                    None,
                    False,
                    "shape mismatch",
                )
            )
            continue
        xa, xb = read_compared(a, name, ta, tb.dtype), read_compared(b, name, tb, ta.dtype)  # dequantized, as converted
        diff = max_abs_diff(xa, xb)
        rows.append(
            TensorDiff(name, ta.shape, tb.shape, str(np.dtype(ta.dtype)), str(np.dtype(tb.dtype)), diff, diff <= atol)
        )
    for name, tb in hf_b.items():
        if name not in hf_a:
            rows.append(TensorDiff(name, None, tb.shape, "-", str(np.dtype(tb.dtype)), None, False, "missing in A"))
    rows.extend(expert_count_rows(a, b, hf_a, hf_b))
    return rows


def experts_per_layer(ckpt: Checkpoint, hf: Mapping[str, LazyTensor]) -> dict[int, int]:
    """HF layer -> routed experts the checkpoint holds (named per expert, or a fused [X, ...] tensor)."""
    from maxckpt.formats.hf import layout as hfl

    counts = hfl.expert_counts(hf)
    for name, t in hf.items():
        m = _FUSED_EXPERTS.match(name)
        if m:
            counts[int(m.group(1))] = t.shape[0]
    return counts


def expert_count_rows(a: Checkpoint, b: Checkpoint, hf_a, hf_b) -> list[TensorDiff]:
    """One row per MoE layer: both sides hold the spec's number of experts (a dropped expert fails)."""
    if not (a.spec.num_experts or b.spec.num_experts):
        return []
    counts_a, counts_b = experts_per_layer(a, hf_a), experts_per_layer(b, hf_b)
    rows = []
    for layer in sorted(set(counts_a) | set(counts_b)):
        ca, cb = counts_a.get(layer, 0), counts_b.get(layer, 0)
        ok = ca == cb == a.spec.num_experts == b.spec.num_experts
        problem = "" if ok else f"experts: {ca} vs {cb} (specs say {a.spec.num_experts} and {b.spec.num_experts})"
        rows.append(
            TensorDiff(f"model.layers.{layer} experts", (ca,), (cb,), "-", "-", None if not ok else 0.0, ok, problem)
        )
    return rows


def verify(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    atol: float = 0.0,
    model: str | None = None,
    model_b: str | None = None,
    step: int | None = None,
    source: SourceOptions | None = None,
) -> VerifyReport:
    """Compare checkpoints `a` and `b` tensor by tensor; `report.ok` is False past `atol`.

    `model` names the family of both (`model_b`, when given, of `b` alone); `source` says what shapes cannot
    tell, for both: an HF config, model settings (`--set`, e.g. a MoE's top-k) and the config the MaxText side's
    run was trained with.
    MoE checkpoints also compare each layer's expert count (and the specs').
    """
    atol = check_tolerance("atol", atol)
    report = VerifyReport(as_path(a), as_path(b), atol)
    with _open_pair(a, b, model, model_b, step, source) as (ca, cb):
        report.notes = [f"A: {n}" for n in ca.notes] + [f"B: {n}" for n in cb.notes]
        report.rows = compare_tensors(ca, cb, atol)
    return report


# ------------------------------------------------------------------- logits


@dataclass
class LogitsReport:
    a: Path
    b: Path
    tokens: list[list[int]]
    logits_a: np.ndarray
    logits_b: np.ndarray
    atol: float
    notes: list[str] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return float(np.max(np.abs(self.logits_a - self.logits_b)))

    @property
    def ok(self) -> bool:
        return self.logits_a.shape == self.logits_b.shape and self.max_abs_diff <= self.atol

    def table(self) -> Table:
        table = Table(title="logits: maxckpt JAX reference (A) vs transformers (B)", title_justify="left")
        for col in ("A", "B", "tokens", "max |A-B|", "max |A|", "atol", ""):
            table.add_column(col)
        table.add_row(
            escape(str(self.a)),
            escape(str(self.b)),
            str(sum(len(t) for t in self.tokens)),
            f"{self.max_abs_diff:.3g}",
            f"{float(np.max(np.abs(self.logits_a))):.3g}",
            f"{self.atol:g}",
            "[green]ok[/]" if self.ok else "[red]FAIL[/]",
        )
        return table


def transformers_logits(ckpt: Checkpoint, tokens: Sequence[Sequence[int]]) -> np.ndarray:
    """Logits of transformers' model for `ckpt` (float32, CPU).

    An HF directory loads through `AutoModelForCausalLM.from_pretrained`, which
    must report no missing or unexpected keys (a quantized one: its float32
    dequantized export); other formats load their HF view into a model built
    from the spec's config.
    """
    try:
        import torch
        import transformers
    except ImportError as err:  # transformers is the `hf` extra
        raise ConversionError("verify --logits needs transformers and torch: pip install 'maxckpt[hf]'") from err
    from maxckpt.formats.hf import layout as hfl
    from maxckpt.formats.hf.config import config_json

    path = ckpt.path
    if ckpt.format.name == "hf" and ckpt.quantization:
        # FP8 / MXFP4: transformers loads maxckpt's float32 dequantization (checked against transformers' own in the
        # tests); its FP8 loader needs accelerate and takes partial blocks as shape / scale grid, not DeepSeek's 128.
        import tempfile

        from maxckpt.conversion.options import SourceOptions
        from maxckpt.conversion.pipeline import convert

        with tempfile.TemporaryDirectory(prefix="maxckpt-dequantized-") as tmp:
            convert(
                path, Path(tmp) / "hf", to="hf", dtype="float32", source=SourceOptions(hf_config=ckpt.options.hf_config)
            )
            with open_checkpoint(Path(tmp) / "hf") as plain:
                return transformers_logits(plain, tokens)
    if ckpt.format.name == "hf" and path.is_dir() and (path / "config.json").is_file():
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, output_loading_info=True
        )
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            raise ConversionError(f"{path}: transformers loaded it with {bad}")
    else:
        config = transformers.AutoConfig.for_model(
            **{k: v for k, v in config_json(ckpt.spec).items() if k != "transformers_version"}
        )
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {n: torch.from_numpy(np.ascontiguousarray(t.read(), np.float32)) for n, t in ckpt.hf_tensors().items()}
        result = model.load_state_dict(state, strict=False)
        missing = set(result.missing_keys) - ({hfl.LM_HEAD} if ckpt.spec.tie_word_embeddings else set())
        if missing or result.unexpected_keys:
            raise ConversionError(
                f"{path}: state dict does not fit transformers' model (missing {sorted(missing)}, unexpected "
                f"{result.unexpected_keys})"
            )
        if ckpt.spec.tie_word_embeddings:
            model.tie_weights()
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor(np.asarray(tokens, np.int64))).logits
    return out.float().numpy()


def maxtext_params(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The MaxText view of an opened checkpoint of any format, as float32 arrays, for the reference forward.

    Names are MaxText paths without `params/params/`, plus the non-RNG `nnx_aux`
    leaves under their stored names (DeepSeek's routing bias): what
    :func:`maxckpt.reference.reference_logits` takes. A MaxText checkpoint is read
    as stored; another format is mapped through HF into the scanned MaxText layout.

    >>> with open_checkpoint("llama-hf") as ckpt:                                 # doctest: +SKIP
    ...     logits = reference_logits(maxtext_params(ckpt), ckpt.spec, [[1, 5, 9]])
    """
    from maxckpt.formats.maxtext.layout import MaxTextLayout
    from maxckpt.formats.maxtext.params import AUX_PREFIX, PARAMS_PREFIX
    from maxckpt.reference import read_maxtext_params

    if ckpt.format.name == "maxtext":
        return read_maxtext_params(ckpt)
    mapped = MaxTextLayout(scan_layers=True).from_hf(ckpt.hf_tensors(), ckpt.spec)
    return {
        (name if name.startswith(AUX_PREFIX) else name[len(PARAMS_PREFIX):]): np.asarray(t.read(), np.float32)
        for name, t in mapped.items()
        if name.startswith((PARAMS_PREFIX, AUX_PREFIX))
    }


def verify_logits(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    tokens: Sequence[Sequence[int]] | Sequence[int] | None = None,
    atol: float = 1e-4,
    model: str | None = None,
    model_b: str | None = None,
    step: int | None = None,
    source: SourceOptions | None = None,
) -> LogitsReport:
    """Run the JAX reference of MaxText's forward on `a` and transformers on `b`; compare logits.

    `source` holds for both sides, as for :func:`verify` (e.g. a MoE's top-k, which no shape shows).
    """
    from maxckpt.reference import reference_logits

    atol = check_tolerance("atol", atol)
    with _open_pair(a, b, model, model_b, step, source) as (ca, cb):
        vocab = ca.spec.vocab_size
        toks = [list(t % vocab for t in DEFAULT_TOKENS)] if tokens is None else tokens
        if toks and isinstance(toks[0], (int, np.integer)):
            toks = [list(toks)]  # type: ignore[list-item]
        bad = [t for row in toks for t in row if not 0 <= t < vocab]
        if bad:
            raise ConversionError(f"token {bad[0]} is outside the vocabulary (size {vocab})")
        logits_a = reference_logits(maxtext_params(ca), ca.spec, toks)
        logits_b = transformers_logits(cb, toks)
        notes = [f"A: {n}" for n in ca.notes] + [f"B: {n}" for n in cb.notes]
    return LogitsReport(as_path(a), as_path(b), [list(map(int, r)) for r in toks], logits_a, logits_b, atol, notes)
