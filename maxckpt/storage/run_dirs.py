"""Recognise a run directory's layout and list its checkpoints, committed or not.

Why: retention, `maxckpt prune` and the manager all decide from this one listing of *which entries are
checkpoints, of which step, and are they complete*; a step still being written or cut short by a crash never
counts, since the newest committed one is what a restart resumes from. Layouts: orbax (MaxText), torchtitan,
megatron, specforge, hf_trainer; local folders and ``gs://`` / ``s3://`` URLs alike. Symbolic links are listed as
skipped, never followed. See docs/design/run-dirs.md for what each layout's commit is.

>>> run = scan_run_dir("/runs/llama/checkpoints")       # doctest: +SKIP
>>> [(s.step, s.state) for s in run.steps]              # doctest: +SKIP
[(100, 'committed'), (200, 'committed'), (300, 'partial')]
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from etils import epath

from maxckpt.errors import CheckpointNotFoundError, MaxckptError
from maxckpt.storage import objects
from maxckpt.storage.urls import as_path, is_url

ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"
DELETING_SUFFIX = ".maxckpt-deleting"
DELETION_RECORD_KIND = "maxckpt deletion"  # bucket deletion records (maxckpt.storage.deletion) say so
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
LOCK_NAME = ".maxckpt.lock"  # see maxckpt.manager.run_lock

COMMITTED, PARTIAL, DELETING = "committed", "partial", "deleting"

_DELETING_RE = re.compile(r"^(?P<base>.+?)" + re.escape(DELETING_SUFFIX) + r"(-[0-9a-f]+)?$")


@dataclass(frozen=True)
class StepEntry:
    """One checkpoint (or attempt at one) in a run directory.

    `state` is ``"committed"`` (complete: counts as a checkpoint),
    ``"partial"`` (being written, or cut short: never counts, never resumed
    from) or ``"deleting"`` (left over from an interrupted deletion).
    `why` says, for entries that are not committed, what is missing.
    """

    step: int
    path: epath.Path
    layout: str
    state: str
    why: str = ""
    epoch: int | None = None
    release: bool = False  # Megatron's release/: no iteration (step is 0), never pruned

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED

    @property
    def partial(self) -> bool:
        return self.state != COMMITTED


@dataclass(frozen=True)
class OtherEntry:
    """An entry that is not a checkpoint step: a sidecar file or something unknown.

    Nothing in maxckpt ever deletes or rewrites these.
    """

    path: epath.Path
    what: str  # e.g. "Megatron tracker"; "" when not recognised
    link_target: str | None = None  # set for a symbolic link: where it points

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_link(self) -> bool:
        return self.link_target is not None

    @property
    def recognised(self) -> bool:
        return bool(self.what)


@dataclass(frozen=True)
class RunDir:
    """The checkpoints of one run directory, sorted by step.

    `pinned` maps entry names that must never be removed to the reason (the
    step Megatron's tracker names, the HF Trainer's best model).
    """

    path: epath.Path
    layout: str | None
    steps: tuple[StepEntry, ...]
    others: tuple[OtherEntry, ...] = ()
    pinned: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def committed(self) -> tuple[StepEntry, ...]:
        return tuple(s for s in self.steps if s.committed)

    @property
    def links(self) -> tuple[OtherEntry, ...]:
        """Symbolic links in the run directory: skipped, never followed, renamed or deleted."""
        return tuple(o for o in self.others if o.is_link)

    @property
    def latest(self) -> StepEntry | None:
        """The newest committed checkpoint, the one a restart resumes from (release/ only when alone)."""
        committed = self.committed
        return committed[-1] if committed else None

    def step(self, step: int) -> StepEntry | None:
        """The committed entry of `step` (an iteration: never Megatron's release/), or None."""
        for entry in self.committed:
            if entry.step == step and not entry.release:
                return entry
        return None


# --- one matcher per layout -------------------------------------------------------------

# Entry names of each layout; `tmp` marks the writer's own temporary name.
NAME_PATTERNS: Mapping[str, re.Pattern[str]] = {
    "orbax": re.compile(r"(?P<step>\d+)(?P<tmp>" + re.escape(ORBAX_TMP_SUFFIX) + r".*)?"),
    "torchtitan": re.compile(r"step-(?P<step>\d+)"),
    "megatron": re.compile(r"iter_(?P<step>\d{7,})|(?P<release>release)"),
    "specforge": re.compile(r"epoch_(?P<epoch>\d+)_step_(?P<step>\d+)"),
    "hf_trainer": re.compile(r"(?P<tmp>tmp-)?checkpoint-(?P<step>\d+)"),
}


def _has(path: epath.Path, *names: str) -> bool:
    return any((path / name).exists() for name in names)


def _orbax_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str] | None:
    if tmp:
        return PARTIAL, "Orbax temporary directory: a save in progress or cut short"
    if (path / COMMIT_FILE).exists():
        return COMMITTED, ""
    # A bare integer folder is only an Orbax step if it looks like one.
    if _has(path, "_CHECKPOINT_METADATA", "items"):
        return PARTIAL, f"no {COMMIT_FILE}: the save never finished"
    return None


def _torchtitan_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str]:
    if _has(path, ".metadata", "model.safetensors.index.json", "model.safetensors"):
        return COMMITTED, ""
    return PARTIAL, "no .metadata: the DCP save never finished"


def _megatron_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str] | None:
    complete = (path / ".metadata").exists() or any(
        child.name.startswith("mp_rank_") and (child / "model_optim_rng.pt").exists() for child in path.iterdir()
    )
    if path.name == "release":
        # Only a complete one is a checkpoint: any run may hold a folder of that name.
        return (COMMITTED, "") if complete else None
    if not complete:
        return PARTIAL, "no .metadata or mp_rank_*/model_optim_rng.pt: the save never finished"
    tracker = ctx.get("megatron_tracker")
    if isinstance(tracker, int) and step > tracker:
        return PARTIAL, f"newer than {MEGATRON_TRACKER} ({tracker}): not finalised"
    return COMMITTED, ""


def _specforge_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str]:
    weights = _has(path, "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if (path / "training_state.pt").exists() and weights:
        return COMMITTED, ""
    return PARTIAL, "training_state.pt or the model weights are missing"


def _hf_trainer_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str]:
    if tmp:
        return PARTIAL, "HF Trainer temporary directory: a save in progress or cut short"
    if (path / "trainer_state.json").exists():
        return COMMITTED, ""
    return PARTIAL, "no trainer_state.json: the save never finished"


MATCHERS: Mapping[str, Callable[[epath.Path, bool, int, dict], tuple[str, str] | None]] = {
    "orbax": _orbax_state,
    "torchtitan": _torchtitan_state,
    "megatron": _megatron_state,
    "specforge": _specforge_state,
    "hf_trainer": _hf_trainer_state,
}
LAYOUTS = tuple(MATCHERS)
# The entry names above in words, for messages that tell a user where to point a command.
LAYOUTS_IN_WORDS = (
    "MaxText/Orbax <step>/, TorchTitan step-N/, Megatron iter_NNNNNNN/, SpecForge epoch_E_step_S/ "
    "or HF Trainer checkpoint-N/ folders"
)

# Files a layout keeps next to its steps: recognised, never touched.
_SIDECARS: Mapping[str, Mapping[str, str]] = {
    "orbax": {"_ROOT_METADATA": "Orbax root metadata", "metadata": "Orbax root metadata"},
    "megatron": {
        MEGATRON_TRACKER: "Megatron tracker",
        "release": "Megatron release folder without a complete checkpoint",
        "progress.txt": "Megatron progress log",
    },
}


# Files any run directory may hold next to its steps.
_COMMON_SIDECARS: Mapping[str, str] = {LOCK_NAME: "maxckpt run-directory lock (who is saving here)"}


# What `maxckpt convert` writes beside its output on a bucket (maxckpt.storage.outputs).
_CONVERSION_MARKERS: Mapping[str, str] = {
    ".maxckpt-complete": "maxckpt conversion marker",
    ".maxckpt-writing": "maxckpt conversion in progress (or cut short)",
}


def _read_megatron_tracker(root: epath.Path) -> int | str | None:
    tracker = root / MEGATRON_TRACKER
    if not tracker.is_file():
        return None  # absent, or a folder of that name: no iteration is named
    try:
        from maxckpt.storage.bounded import open_regular

        with open_regular(tracker) as f:
            text = f.read(256).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None  # unreadable or binary: it names no iteration, so none is protected by it
    return int(text) if text.isdigit() else text


def _hf_best_model(root: epath.Path, steps: Iterable[StepEntry]) -> str | None:
    """The entry name HF Trainer's newest trainer_state.json calls the best model."""
    committed = [s for s in steps if s.committed]
    if not committed:
        return None
    try:
        from maxckpt.storage.bounded import read_json_object

        state = read_json_object(os.path.join(os.fspath(committed[-1].path), "trainer_state.json"))
    except (OSError, ValueError):
        return None  # absent, damaged or not an object: it names no best model
    best = state.get("best_model_checkpoint")
    return os.path.basename(str(best).rstrip("/")) if best else None


def _parse_name(name: str, layouts: Iterable[str]) -> tuple[str, re.Match[str]] | None:
    for layout in layouts:
        m = NAME_PATTERNS[layout].fullmatch(name)
        if m:
            return layout, m
    return None


SKIPPED_LINK = "skipped symlink: maxckpt never follows, renames or deletes links in a run directory"


def _link_target(path: epath.Path) -> str | None:
    """Where `path` points when it is a symbolic link (local paths only), else None."""
    if is_url(path):
        return None
    try:
        return os.readlink(os.fspath(path)) if os.path.islink(os.fspath(path)) else None
    except OSError:
        return None


def _entry(path: epath.Path, layouts: Iterable[str], ctx: dict) -> StepEntry | None:
    """The step entry `path` is in one of `layouts`, or None."""
    deleting = _DELETING_RE.match(path.name)
    parsed = _parse_name(deleting.group("base") if deleting else path.name, layouts)
    if parsed is None:
        return None
    try:
        if not path.is_dir():
            return None
    except OSError:
        return None
    layout, m = parsed
    release = bool(m.groupdict().get("release"))
    step = 0 if release else int(m.group("step"))
    epoch = int(m.group("epoch")) if "epoch" in m.groupdict() else None
    if deleting:
        return StepEntry(step, path, layout, DELETING, "left over from an interrupted deletion", epoch, release)
    try:
        state = MATCHERS[layout](path, bool(m.groupdict().get("tmp")), step, ctx)
    except OSError as err:  # an unreadable entry: never counted, never removed
        return StepEntry(step, path, layout, PARTIAL, f"cannot be read ({err.strerror or err})", epoch)
    if state is None:
        return None
    return StepEntry(step, path, layout, state[0], state[1], epoch, release)


def deletion_state(step_dir: str | os.PathLike) -> str:
    """What the bucket deletion record beside `step_dir` proves about the step as it is now.

    "unproven": the record is unreadable or not maxckpt's (another tool's, or
    one naming another step), or the step is committed and the record names
    another version of its commit file or none (a stray or copied record, one
    older than a save of the step, or one from an older maxckpt, which
    fingerprinted nothing). "uncommitted": a maxckpt record and no commit
    file (a deletion removes it first; an uncommitted step is no checkpoint),
    so finishing loses nothing committed. "proven": the commit file is the
    very version the record fingerprinted when the deletion began.
    """
    p = as_path(step_dir)
    try:
        raw = objects.read_bytes(os.fspath(p.parent / (p.name + DELETING_SUFFIX)))
        record = json.loads(raw) if len(raw) <= 64 * 1024 else None
    except (OSError, ValueError, UnicodeDecodeError):
        return "unproven"
    ours = isinstance(record, dict) and record.get("deleting") == p.name and (
        record.get("kind") == DELETION_RECORD_KIND or {"since", "host", "pid"} <= set(record)  # older maxckpt
    )
    if not ours:
        return "unproven"
    current = objects.fingerprint(os.fspath(p / COMMIT_FILE))
    if current is None:
        return "uncommitted"
    return "proven" if record.get("kind") == DELETION_RECORD_KIND and record.get("commit") == current else "unproven"


def _spare_newest(
    found: dict[str, list[StepEntry]], proven: set[str], records: Mapping[str, epath.Path], unknown: list, ctx: dict
) -> None:
    """The newest committed step is never deleted: a proven record of a still-committed step newer than
    every committed one is set aside (the step listed as it is, the record as an unknown entry)."""
    for lay, entries in found.items():
        newest = max((e.step for e in entries if e.state == COMMITTED), default=-1)
        doomed = [e for e in entries if e.state == DELETING and e.path.name in proven and e.step > newest]
        if not doomed:
            continue
        spared = max(doomed, key=lambda e: e.step)
        entry = _entry(spared.path, (lay,), ctx)
        if entry is not None and entry.state == COMMITTED:
            entries[entries.index(spared)] = entry
            unknown.append(records[spared.path.name])


def scan_run_dir(directory: str | os.PathLike, layout: str | None = None) -> RunDir:
    """List the checkpoints of `directory` (committed, partial, being deleted).

    With `layout=None` the layout is recognised from the entry names; a folder
    that mixes layouts is refused, since removing "the oldest" of two unrelated
    runs would be wrong. With an explicit layout, entries of other layouts are
    reported as not recognised (and so never touched). A missing directory is
    an empty run.

    >>> scan_run_dir("/runs/llama/checkpoints").latest.step   # doctest: +SKIP
    5000
    """
    root = epath.Path(as_path(directory))
    if layout is not None and layout not in MATCHERS:
        raise MaxckptError(f"unknown run layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if not root.exists():
        return RunDir(root, layout, ())
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{root} is a file, not a run directory of checkpoints")
    try:
        children = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as err:
        raise CheckpointNotFoundError(f"cannot list {root}: {err.strerror or err}") from None
    ctx = {"megatron_tracker": _read_megatron_tracker(root)}
    found: dict[str, list[StepEntry]] = {}
    unknown: list[epath.Path] = []
    links: dict[str, str] = {}
    # Deletion records on a bucket: `<name>.maxckpt-deleting` objects beside the steps they doom. A record
    # dooms its step only when it names the step as it is now (deletion_state); any other is left alone.
    records = (
        {c.name[: -len(DELETING_SUFFIX)]: c for c in children if c.name.endswith(DELETING_SUFFIX) and not c.is_dir()}
        if is_url(root)
        else {}
    )
    names = {c.name for c in children}
    states = {base: (deletion_state(root / base) if base in names else "gone") for base in records}
    doomed = {base for base, state in states.items() if state != "unproven"}
    for child in children:
        base = child.name[: -len(DELETING_SUFFIX)] if child.name.endswith(DELETING_SUFFIX) else None
        is_record = base is not None and records.get(base) is child
        if is_record and base not in doomed:
            unknown.append(child)  # proves no deletion: shown as is, never acted on
            continue
        if is_record or child.name in doomed:
            base = base if is_record else child.name
            if is_record and base in names:
                continue  # the record; its step is listed below (or above) as deleting
            parsed = _parse_name(base, (layout,) if layout else LAYOUTS)
            if parsed is None:
                unknown.append(child)
                continue
            lay, m = parsed
            release = bool(m.groupdict().get("release"))
            step = 0 if release else int(m.group("step"))
            epoch = int(m.group("epoch")) if "epoch" in m.groupdict() else None
            entry = StepEntry(step, root / base, lay, DELETING, "deletion recorded, not finished", epoch, release)
            found.setdefault(entry.layout, []).append(entry)
            continue
        target = _link_target(child)
        if target is not None:
            links[child.name] = target
            unknown.append(child)
            continue
        entry = _entry(child, (layout,) if layout else LAYOUTS, ctx)
        if entry is None:
            unknown.append(child)
        else:
            found.setdefault(entry.layout, []).append(entry)
    _spare_newest(found, {b for b, state in states.items() if state == "proven"}, records, unknown, ctx)
    if len(found) > 1:
        summary = "; ".join(f"{name}: {', '.join(e.name for e in entries[:3])}" for name, entries in found.items())
        raise MaxckptError(
            f"{root} mixes checkpoints of several layouts ({summary}); refusing to guess which run "
            f"they belong to: move them into separate folders, or name the layout to use "
            f"(`--layout` of `maxckpt ls` and `maxckpt prune`; one of {', '.join(LAYOUTS)})"
        )
    chosen = layout or next(iter(found), None)
    steps = sorted(
        found.get(chosen, []), key=lambda s: (not s.release, s.step, s.epoch or 0, s.state != COMMITTED, s.name)
    )
    sidecars = {**_COMMON_SIDECARS, **_CONVERSION_MARKERS, **_SIDECARS.get(chosen or "", {})}
    others = tuple(
        OtherEntry(p, SKIPPED_LINK, links[p.name]) if p.name in links else OtherEntry(p, sidecars.get(p.name, ""))
        for p in unknown
    )
    pinned: dict[str, str] = {}
    notes: list[str] = []
    tracker = ctx["megatron_tracker"]
    if chosen == "megatron" and tracker is not None:
        if isinstance(tracker, int):
            name = f"iter_{tracker:07d}"
            if any(s.name == name for s in steps):
                pinned[name] = f"{MEGATRON_TRACKER} points here"
            else:
                notes.append(f"{MEGATRON_TRACKER} names iteration {tracker}, which is not in {root}")
    if chosen == "hf_trainer":
        best = _hf_best_model(root, steps)
        if best and any(s.name == best for s in steps):
            pinned[best] = "best model in trainer_state.json"
    return RunDir(root, chosen, tuple(steps), others, pinned, tuple(notes))


def require_committed(directory: str | os.PathLike, step: int | None = None) -> None:
    """Refuse, with the reason, to read `step` (or the newest step) of a run whose step is not committed.

    What `--step N` of every reading command (`inspect`, `convert`, `verify`,
    `diff`) goes through before a format is even chosen, so "that step exists
    but its save never finished" is said once, the same way for every layout,
    with the committed steps to pick from. `directory` may be a run directory
    or a MaxText run dir holding `checkpoints/`; anything else (a step folder,
    an HF model dir, a file) passes through untouched, as does a run whose
    asked step is committed.
    """
    root = os.fspath(directory)
    if is_url(root) or not os.path.isdir(root):
        return
    try:
        run = scan_run_dir(root)
        if not run.steps and os.path.isdir(os.path.join(root, "checkpoints")):
            run = scan_run_dir(os.path.join(root, "checkpoints"))
    except MaxckptError:
        return  # a mixed folder: the reader that is picked says what it makes of it
    if not run.steps:
        return
    if step is None:
        if run.committed:
            return
        partial = "; ".join(f"{s.name}: {s.why}" for s in run.steps[-3:])
        raise CheckpointNotFoundError(
            f"{run.path} holds no committed checkpoint: every step in it is partial ({partial}); "
            "a save that never finished cannot be read"
        )
    if run.step(step) is not None:
        return
    raise CheckpointNotFoundError(f"{run.path}: {missing_step(run, step)}")


def missing_step(run: RunDir, step: int) -> str:
    """Why `step` of `run` cannot be read, with the committed steps to pick from (no path prefix)."""
    listing = ", ".join(str(s.step) for s in run.committed) or "none"
    same = [s for s in run.steps if s.step == step]
    if not same:
        return f"no step {step}; committed steps: {listing}"
    entry = same[-1]
    name = "" if entry.name == str(step) else f" ({entry.name})"
    return f"step {step}{name} exists but is not committed: {entry.why}; committed steps: {listing}"
