"""What the demo did, as plain data, and its closing summary (rich tables plus the commands to explore)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from maxckpt.units import human_bytes


@dataclass
class ExportResult:
    """One conversion of the final step, and its check against the source."""

    format: str
    path: str
    tensors: int
    bytes: int
    seconds: float
    tensor_max_abs_diff: float  # through the layouts, vs the MaxText checkpoint


@dataclass
class DemoResult:
    directory: str
    run_dir: str
    checkpoint_dir: str
    config: str
    steps: int
    period: int
    keep: int | None
    keep_period: int | None
    crash_step: int
    resumed_from: int | None
    committed_at_crash: list[int]
    partial_at_crash: list[int]
    saved_steps: list[int]
    resumed_saves: list[int]  # saved by the resumed process
    kept_steps: list[int]
    pruned_steps: list[int]
    lost_steps: list[int]
    run_bytes: int
    losses: dict[int, float]
    final_step: int
    train_seconds: float
    exports: list[ExportResult] = field(default_factory=list)
    logits_max_abs_diff: float = math.nan
    logits_max_abs: float = math.nan
    logits_atol: float = 1e-4
    seconds: float = 0.0

    @property
    def logits_ok(self) -> bool:
        return self.logits_max_abs_diff <= self.logits_atol

    @property
    def exports_exact(self) -> bool:
        return all(e.tensor_max_abs_diff == 0.0 for e in self.exports)

    @property
    def ok(self) -> bool:
        return self.logits_ok and self.exports_exact and self.final_step in self.kept_steps

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["losses"] = {str(k): v for k, v in self.losses.items()}
        out["ok"] = self.ok
        return out

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    # ------------------------------------------------------------- tables

    def checkpoint_table(self) -> Table:
        table = Table(title="checkpoints", title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        retention = f"newest {self.keep}" + (f" + every {self.keep_period}th step" if self.keep_period else "")
        table.add_row("policy", f"async saves every {self.period} steps, keep {retention}")
        table.add_row("saves started", f"{len(self.saved_steps)}: {_steps(self.saved_steps)}")
        table.add_row(
            "crash",
            f"SIGKILL after step {self.crash_step}; committed then: {_steps(self.committed_at_crash)}; partial: "
            f"{_steps(self.partial_at_crash) or 'none'}",
        )
        table.add_row(
            "resumed from",
            "nothing (fresh start)" if self.resumed_from is None else f"step {self.resumed_from}, in a new process",
        )
        if self.lost_steps:
            again = set(self.lost_steps) & set(self.resumed_saves)
            lost = (
                _steps(self.lost_steps)
                + " (partial: moved aside on resume"
                + (", then saved again by the resumed run)" if again else ")")
            )
        else:
            lost = "none (the save in flight had committed)"
        table.add_row("cut short by the crash", lost)
        table.add_row("pruned by retention", _steps(self.pruned_steps) or "none")
        table.add_row("kept", f"{_steps(self.kept_steps)}  ({human_bytes(self.run_bytes)} on disk)")
        first, last = self.losses.get(0), self.losses.get(self.final_step)
        if first is not None and last is not None:
            table.add_row(
                "loss",
                f"{first:.3f} at step 0 -> {last:.3f} at step {self.final_step}  ({self.train_seconds:.1f} s wall "
                "time, both processes)",
            )
        return table

    def export_table(self) -> Table:
        table = Table(title=f"exports of step {self.final_step}", title_justify="left")
        for col, justify in (
            ("format", "left"),
            ("path", "left"),
            ("tensors", "right"),
            ("bytes", "right"),
            ("seconds", "right"),
            ("max |diff| vs source", "right"),
        ):
            table.add_column(col, justify=justify, no_wrap=col == "path")
        for e in self.exports:
            diff = (
                f"[green]{e.tensor_max_abs_diff:.3g}[/]"
                if e.tensor_max_abs_diff == 0
                else f"[red]{e.tensor_max_abs_diff:.3g}[/]"
            )
            table.add_row(
                e.format, escape(rel_path(e.path)), str(e.tensors), human_bytes(e.bytes), f"{e.seconds:.2f}", diff
            )
        status = "[green]ok[/]" if self.logits_ok else "[red]FAIL[/]"
        table.caption = (
            f"HF export's logits in transformers vs maxckpt's JAX reference of MaxText: max |diff| "
            f"{self.logits_max_abs_diff:.3g} (|logits| up to {self.logits_max_abs:.3g}, "
            f"atol {self.logits_atol:g}) {status}"
        )
        table.caption_justify = "left"
        return table

    def commands(self) -> list[str]:
        """Commands to explore the result, with paths as the user can type them."""
        run, ckpts = rel_path(self.run_dir), rel_path(self.checkpoint_dir)
        first = min(self.kept_steps)
        q = shlex.quote
        model = "--model llama3.1"
        out = [
            f"maxckpt ls {q(run)} --config {q(rel_path(self.config))}",
            f"maxckpt inspect {q(ckpts)} --depth 3",
            f"maxckpt inspect {q(os.path.join(run, 'export', 'hf'))} --filter '*layers.0.*' --stats",
            f"maxckpt diff {q(os.path.join(ckpts, str(first)))} {q(os.path.join(ckpts, str(self.final_step)))} {model}",
        ]
        if any(e.format == "megatron" for e in self.exports):
            out.append(f"maxckpt diff {q(ckpts)} {q(os.path.join(run, 'export', 'megatron'))} {model} --all")
        notebooks = _notebooks_dir()
        if not os.path.isdir(notebooks):
            return out  # an installed package without the repository's notebooks/
        # The notebooks extra has the kernel, not a notebook UI: say how to get one.
        lab = "jupyter lab" if importlib.util.find_spec("jupyterlab") else "pip install jupyterlab && jupyter lab"
        explore = q(rel_path(os.path.join(notebooks, "explore_checkpoint.ipynb")))
        out.append(f"{lab} {explore}  (with MAXCKPT_NOTEBOOK_RUN_DIR={q(os.path.abspath(self.run_dir))} set)")
        out.append(
            f"{q(rel_path(os.path.join(notebooks, 'convert_and_verify.ipynb')))}  "
            "(converts the newest step to HF and Megatron, compares logits)"
        )
        return out

    def renderable(self) -> Group:
        return Group(self.checkpoint_table(), self.export_table())


def _notebooks_dir() -> str:
    """The repository's notebooks/ folder (next to the package in a source checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "notebooks")


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in sorted(set(steps)))


def rel_path(path: str) -> str:
    """`path` relative to the working directory when it lies below it (shorter commands to copy)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
