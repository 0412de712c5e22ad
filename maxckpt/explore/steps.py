"""The step table of a run directory: what `maxckpt ls` shows, as plain data.

For every checkpoint entry of a run (any layout :mod:`maxckpt.storage.run_dirs`
recognises: MaxText/Orbax ``<step>/``, TorchTitan ``step-N/``, Megatron
``iter_NNNNNNN/``, SpecForge ``epoch_E_step_S/``, HF Trainer
``checkpoint-N/``): its step, whether it is committed, its size on disk, the
items it holds, when it was saved, and - given a retention policy - whether
the next retention pass would delete it. The retention decision is
:func:`maxckpt.manager.retention.plan_retention` itself, so `ls` shows exactly
what the manager and `maxckpt prune` would do.

>>> table = list_steps("runs/llama", keep=3)              # doctest: +SKIP
>>> [(r.step, r.state, r.retention) for r in table.rows]  # doctest: +SKIP
[(0, 'committed', 'delete next'), (100, 'committed', 'keep'), ...]
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from maxckpt.storage.bounded import read_json_object
from maxckpt.errors import CheckpointNotFoundError
from maxckpt.units import human_bytes
from maxckpt.manager.retention import KEEP, REMOVE, RetentionPolicy, plan_retention
from maxckpt.storage.run_dirs import COMMIT_FILE, COMMITTED, LAYOUTS_IN_WORDS, RunDir, StepEntry, scan_run_dir
from maxckpt.storage import objects
from maxckpt.storage.urls import as_path

if TYPE_CHECKING:
    from maxckpt.config import CheckpointConfig

DELETE_NEXT = "delete next"
_CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
# The file each layout writes last: its mtime is the save time when nothing better is recorded.
_LAST_WRITTEN = (COMMIT_FILE, ".metadata", "trainer_state.json", "training_state.pt")


@dataclass(frozen=True)
class StepRow:
    """One checkpoint entry of a run directory.

    `saved_at` is a Unix time: Orbax's commit timestamp from
    `_CHECKPOINT_METADATA` when there is one (`time_source="commit"`),
    else the modification time of the file the writer wrote last
    (`time_source="mtime"`). `retention` is None when no policy was given,
    else ``"keep"``, ``"delete next"`` or ``"left alone"`` (partial entries).
    """

    step: int
    name: str
    path: str
    state: str
    bytes: int
    items: tuple[str, ...]
    saved_at: float | None
    time_source: str
    retention: str | None = None
    reason: str = ""
    epoch: int | None = None
    release: bool = False  # Megatron's release/ (no iteration; `step` is 0)

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED

    @property
    def saved_at_iso(self) -> str | None:
        if self.saved_at is None:
            return None
        return _dt.datetime.fromtimestamp(self.saved_at, _dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class StepTable:
    """The checkpoints of one run directory (see :func:`list_steps`)."""

    path: str
    layout: str
    rows: list[StepRow]
    policy: RetentionPolicy | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def committed_steps(self) -> list[int]:
        """Committed iterations (Megatron's release/ has none: see its row)."""
        return [r.step for r in self.rows if r.committed and not r.release]

    @property
    def delete_next(self) -> list[int]:
        """Steps the configured retention would delete on its next pass."""
        return [r.step for r in self.rows if r.retention == DELETE_NEXT]

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what `maxckpt ls --json` prints."""
        rows = []
        for r in self.rows:
            row = asdict(r)
            row["items"] = list(r.items)
            row["saved_at_iso"] = r.saved_at_iso
            rows.append(row)
        policy = None if self.policy is None else {"keep": self.policy.keep, "keep_period": self.policy.keep_period}
        return {
            "path": self.path,
            "layout": self.layout,
            "policy": policy,
            "steps": rows,
            "committed_steps": self.committed_steps,
            "delete_next": self.delete_next,
            "total_bytes": self.total_bytes,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> Table:
        """A rich table: one row per checkpoint entry."""
        caption = (
            f"{sum(r.committed for r in self.rows)} committed of {len(self.rows)}, "
            f"{human_bytes(self.total_bytes)} on disk"
        )
        if self.policy is not None:
            nxt = ", ".join(map(str, self.delete_next)) or "nothing"
            caption += f"; retention ({_policy_text(self.policy)}) deletes next: {nxt}"
        table = Table(
            title=escape(f"{self.path}  ({self.layout})"),
            title_justify="left",
            caption=escape(caption),
            caption_justify="left",
        )
        table.add_column("step", justify="right")
        table.add_column("state")
        table.add_column("size", justify="right")
        table.add_column("items")
        table.add_column("saved (local time)", no_wrap=True)
        if self.policy is not None:
            table.add_column("retention", no_wrap=True)
            table.add_column("why", overflow="fold")
        for r in self.rows:
            state = "[green]committed[/]" if r.committed else f"[yellow]{r.state}[/]"
            when = "-" if r.saved_at is None else _dt.datetime.fromtimestamp(r.saved_at).strftime("%Y-%m-%d %H:%M:%S")
            if r.time_source == "mtime" and r.saved_at is not None:
                when += " (mtime)"
            cells = [
                "release" if r.release else str(r.step),
                state,
                human_bytes(r.bytes),
                escape(", ".join(r.items)) or "-",
                when,
            ]
            if self.policy is not None:
                style = {KEEP: "green", DELETE_NEXT: "bold red"}.get(r.retention or "", "yellow")
                cells += [f"[{style}]{r.retention}[/]", escape(r.reason)]
            table.add_row(*cells)
        return table


def _policy_text(policy: RetentionPolicy) -> str:
    keep = "all" if policy.keep is None else f"newest {policy.keep}"
    return keep + (f" + every {policy.keep_period}th step" if policy.keep_period else "")


# ------------------------------------------------------------------ per entry


def dir_bytes(path: Path) -> int:
    """Bytes of every file below `path` (apparent size; entries vanishing meanwhile are skipped)."""
    return objects.total_bytes(path)


def _orbax_commit_time(path: Path) -> float | None:
    try:
        meta = read_json_object(path / _CHECKPOINT_METADATA)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):  # not what Orbax writes: fall back to the file times
        return None
    stamp = meta.get("commit_timestamp_nsecs") or meta.get("init_timestamp_nsecs")
    return stamp / 1e9 if isinstance(stamp, (int, float)) and stamp > 0 else None


def _save_time(entry: StepEntry) -> tuple[float | None, str]:
    path = as_path(entry.path)
    if entry.layout == "orbax":
        stamp = _orbax_commit_time(path)
        if stamp is not None:
            return stamp, "commit"
    for name in _LAST_WRITTEN:
        try:
            return objects.mtime(path / name), "mtime"
        except OSError:
            continue
    try:
        return objects.mtime(path), "mtime"
    except OSError:
        return None, "mtime"


def _items(entry: StepEntry) -> tuple[str, ...]:
    """What the entry holds: Orbax items, the top-level keys of a DCP state, or the files of an HF-style folder."""
    path = as_path(entry.path)
    try:
        children = sorted(path.iterdir(), key=lambda p: p.name)
    except OSError:
        return ()
    if entry.layout == "orbax":
        return tuple(c.name for c in children if c.is_dir() and ((c / "_METADATA").exists() or c.name == "items"))
    if entry.layout in ("torchtitan", "megatron") and (path / ".metadata").is_file():
        try:
            from maxckpt.containers.dcp import load_metadata

            keys = load_metadata(path).state_dict_metadata
        except Exception:  # noqa: BLE001 - a listing shows what it can; inspect reports the error
            return ()
        return tuple(sorted({k.split(".", 1)[0] for k in keys}))
    return tuple(c.name for c in children if not c.name.startswith("."))


def resolve_run_dir(path: str | os.PathLike, layout: str | None = None) -> RunDir:
    """The run directory at `path`, or the `checkpoints/` folder inside a MaxText run dir
    (or inside the only run of a folder of runs, such as the demo's output).

    `layout` picks one layout in a folder that mixes several (see
    :func:`~maxckpt.storage.run_dirs.scan_run_dir`). A path holding no
    checkpoint maxckpt recognises is an error naming what it found.
    """
    p = as_path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"{p}: no such directory")
    if not p.is_dir():
        raise CheckpointNotFoundError(
            f"{p} is a file; `ls` lists a run directory (use `maxckpt inspect` for one checkpoint)"
        )
    run = scan_run_dir(p, layout)
    if run.steps:
        return run
    # A MaxText run dir holds checkpoints/; a folder of runs (the demo's --dir) may hold one such
    # run (with several, the user must pick one).
    runs = sorted(p.glob("*/checkpoints"))
    for nested in [p / "checkpoints", *(runs if len(runs) == 1 else [])]:
        inner = scan_run_dir(nested, layout) if nested.is_dir() else None
        if inner is not None and inner.steps:
            return inner
    found = ", ".join(o.name + (" (symlink, skipped)" if o.is_link else "") for o in run.others[:6]) or "nothing"
    raise CheckpointNotFoundError(
        f"{p} holds no checkpoints maxckpt recognises (found: {found}); point `ls` at the folder holding "
        f"{LAYOUTS_IN_WORDS}, or at a MaxText run dir with checkpoints/"
    )


def list_steps(
    run_dir: str | os.PathLike,
    *,
    keep: int | None = None,
    keep_period: int | None = None,
    config: CheckpointConfig | None = None,
    layout: str | None = None,
) -> StepTable:
    """The step table of `run_dir`; with a policy, which steps retention would delete next.

    The policy is `keep`/`keep_period`, or a :class:`~maxckpt.CheckpointConfig`'s
    `max_num_checkpoints_to_keep` / `maxckpt_keep_period` (explicit numbers win).
    Without either, the retention column is left out. `layout` picks one
    layout in a folder that mixes several.

    >>> list_steps("runs/llama/checkpoints", keep=2).delete_next   # doctest: +SKIP
    [100, 200]
    """
    run = resolve_run_dir(run_dir, layout)
    if config is not None:
        keep = keep if keep is not None else config.max_num_checkpoints_to_keep
        keep_period = keep_period if keep_period is not None else config.maxckpt_keep_period
    policy = None
    if keep is not None or keep_period is not None or config is not None:
        policy = RetentionPolicy(keep=keep, keep_period=keep_period)
    decisions = {}
    if policy is not None:
        decisions = {id(d.entry): d for d in plan_retention(run, policy).decisions}
    rows = []
    for entry in run.steps:
        saved_at, source = _save_time(entry)
        retention, reason = None, entry.why
        d = decisions.get(id(entry))
        if d is not None:
            retention = {KEEP: KEEP, REMOVE: DELETE_NEXT}.get(d.action, "left alone")
            reason = d.reason
        rows.append(
            StepRow(
                step=entry.step,
                name=entry.name,
                path=os.fspath(entry.path),
                state=entry.state,
                bytes=dir_bytes(as_path(entry.path)),
                items=_items(entry),
                saved_at=saved_at,
                time_source=source,
                retention=retention,
                reason=reason,
                epoch=entry.epoch,
                release=entry.release,
            )
        )
    notes = list(run.notes)
    notes += [f"{link.name} -> {link.link_target}: {link.what}" for link in run.links]
    recorded = _recorded_settings(run.path)
    if recorded:
        notes.append(recorded)
    return StepTable(os.fspath(run.path), run.layout or "", rows, policy, notes)


# What a run's record of its MaxText config states that decides the model (the rest: training and data keys).
_RECORD_KEYS = ("model_name", "decoder_block", "num_experts", "num_experts_per_tok", "n_routing_groups",
                "topk_routing_group", "sliding_window_size", "rope_type", "rope_max_timescale")


def _recorded_settings(path: Any) -> str | None:
    """A note naming the run's record of its MaxText config (maxckpt maxtext train's, or MaxText's config.yml)
    and the model keys it states, which `convert` reads without flags; None for a run without one."""
    from maxckpt.config.maxtext_run import read_run_config_file, run_config_file
    from maxckpt.errors import MaxckptError

    found = run_config_file(path)
    if found is None:
        return None
    try:
        values = read_run_config_file(found).values
    except (OSError, MaxckptError) as err:
        return f"the run's config record {found} cannot be read ({err}); convert will name what it assumes"
    shown = ", ".join(f"{k}={values[k]}" for k in _RECORD_KEYS if k in values)
    return f"model settings recorded in {found} ({shown}); convert and verify read them without --model or --set"
