"""Recognise a run directory's layout and list its checkpoints, committed or not.

Retention, `maxckpt prune` and the manager all decide from the same listing,
so one question is answered in one place: *which entries of this folder are
checkpoints, of which step, and are they complete?* A step that is still being
written, or was cut short by a crash, must never count as a checkpoint: the
newest *committed* one is what a restart resumes from.

Layouts recognised (one per run directory):

============  ==========================  =====================================
layout        entry names                 committed when
============  ==========================  =====================================
orbax         ``<step>`` (MaxText)        ``commit_success.txt`` is present;
                                          ``<step>.orbax-checkpoint-tmp*`` is
                                          a save in progress or a crashed one
torchtitan    ``step-<N>``                DCP's ``.metadata`` (written last)
megatron      ``iter_<NNNNNNN>``          ``.metadata`` (torch_dist) or
                                          ``mp_rank_*/model_optim_rng.pt``, and
                                          not newer than
                                          ``latest_checkpointed_iteration.txt``
specforge     ``epoch_<E>_step_<S>``      ``training_state.pt`` plus the model
                                          weights (``save_pretrained``)
hf_trainer    ``checkpoint-<N>``          ``trainer_state.json``;
                                          ``tmp-checkpoint-<N>`` is partial
============  ==========================  =====================================

In every layout, ``<entry>.maxckpt-deleting*`` is a checkpoint maxckpt was
removing when the process died: already out of sight, safe to finish off. On
a bucket (where nothing can be renamed) ``<entry>.maxckpt-deleting`` is a
small object recording the intent, and ``<entry>`` itself is reported as
*deleting* (see :mod:`maxckpt.storage.deletion`).

Paths are local folders or ``gs://`` / ``s3://`` URLs alike.

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
from maxckpt.storage.urls import as_path, is_url

ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"
DELETING_SUFFIX = ".maxckpt-deleting"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"

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

    @property
    def name(self) -> str:
        return self.path.name

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
    def latest(self) -> StepEntry | None:
        """The newest committed checkpoint, the one a restart resumes from."""
        committed = self.committed
        return committed[-1] if committed else None

    def step(self, step: int) -> StepEntry | None:
        """The committed entry of `step`, or None."""
        for entry in self.committed:
            if entry.step == step:
                return entry
        return None


# --- one matcher per layout -------------------------------------------------------------

# Entry names of each layout; `tmp` marks the writer's own temporary name.
NAME_PATTERNS: Mapping[str, re.Pattern[str]] = {
    "orbax": re.compile(r"(?P<step>\d+)(?P<tmp>" + re.escape(ORBAX_TMP_SUFFIX) + r".*)?"),
    "torchtitan": re.compile(r"step-(?P<step>\d+)"),
    "megatron": re.compile(r"iter_(?P<step>\d{7,})"),
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


def _megatron_state(path: epath.Path, tmp: bool, step: int, ctx: dict) -> tuple[str, str]:
    complete = (path / ".metadata").exists() or any(
        child.name.startswith("mp_rank_") and (child / "model_optim_rng.pt").exists() for child in path.iterdir()
    )
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
    "megatron": {MEGATRON_TRACKER: "Megatron tracker", "release": "Megatron release checkpoint", "progress.txt": "Megatron progress log"},
}


# What `maxckpt convert` writes beside its output on a bucket (maxckpt.storage.outputs).
_CONVERSION_MARKERS: Mapping[str, str] = {
    ".maxckpt-complete": "maxckpt conversion marker",
    ".maxckpt-writing": "maxckpt conversion in progress (or cut short)",
}


def _read_megatron_tracker(root: epath.Path) -> int | str | None:
    tracker = root / MEGATRON_TRACKER
    if not tracker.exists():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else text


def _hf_best_model(root: epath.Path, steps: Iterable[StepEntry]) -> str | None:
    """The entry name HF Trainer's newest trainer_state.json calls the best model."""
    committed = [s for s in steps if s.committed]
    if not committed:
        return None
    try:
        state = json.loads((committed[-1].path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    best = state.get("best_model_checkpoint")
    return os.path.basename(str(best).rstrip("/")) if best else None


def _parse_name(name: str, layouts: Iterable[str]) -> tuple[str, re.Match[str]] | None:
    for layout in layouts:
        m = NAME_PATTERNS[layout].fullmatch(name)
        if m:
            return layout, m
    return None


def _entry(path: epath.Path, layouts: Iterable[str], ctx: dict) -> StepEntry | None:
    """The step entry `path` is in one of `layouts`, or None."""
    deleting = _DELETING_RE.match(path.name)
    parsed = _parse_name(deleting.group("base") if deleting else path.name, layouts)
    if parsed is None or not path.is_dir():
        return None
    layout, m = parsed
    step = int(m.group("step"))
    epoch = int(m.group("epoch")) if "epoch" in m.groupdict() else None
    if deleting:
        return StepEntry(step, path, layout, DELETING, "left over from an interrupted deletion", epoch)
    state = MATCHERS[layout](path, bool(m.groupdict().get("tmp")), step, ctx)
    if state is None:
        return None
    return StepEntry(step, path, layout, state[0], state[1], epoch)


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
    ctx = {"megatron_tracker": _read_megatron_tracker(root)}
    found: dict[str, list[StepEntry]] = {}
    unknown: list[epath.Path] = []
    children = sorted(root.iterdir(), key=lambda p: p.name)
    # Deletion records on a bucket: `<name>.maxckpt-deleting` objects beside the steps they doom.
    doomed = {c.name[: -len(DELETING_SUFFIX)]: c for c in children if c.name.endswith(DELETING_SUFFIX) and is_url(root) and not c.is_dir()}
    names = {c.name for c in children}
    for child in children:
        if child.name in doomed or (child.name.endswith(DELETING_SUFFIX) and child.name[: -len(DELETING_SUFFIX)] in doomed):
            base = child.name if child.name in doomed else child.name[: -len(DELETING_SUFFIX)]
            if child.name != base and base in names:
                continue  # the record; its step is listed below (or above) as deleting
            parsed = _parse_name(base, (layout,) if layout else LAYOUTS)
            if parsed is None:
                unknown.append(child)
                continue
            lay, m = parsed
            epoch = int(m.group("epoch")) if "epoch" in m.groupdict() else None
            entry = StepEntry(int(m.group("step")), root / base, lay, DELETING, "deletion recorded, not finished", epoch)
            found.setdefault(entry.layout, []).append(entry)
            continue
        entry = _entry(child, (layout,) if layout else LAYOUTS, ctx)
        if entry is None:
            unknown.append(child)
        else:
            found.setdefault(entry.layout, []).append(entry)
    if len(found) > 1:
        summary = "; ".join(f"{name}: {', '.join(e.name for e in entries[:3])}" for name, entries in found.items())
        raise MaxckptError(
            f"{root} mixes checkpoints of several layouts ({summary}); refusing to guess which run "
            f"they belong to: move them into separate folders, or name the layout to use "
            f"(`--layout` of `maxckpt ls` and `maxckpt prune`; one of {', '.join(LAYOUTS)})"
        )
    chosen = layout or next(iter(found), None)
    steps = sorted(found.get(chosen, []), key=lambda s: (s.step, s.epoch or 0, s.state != COMMITTED, s.name))
    sidecars = {**_CONVERSION_MARKERS, **_SIDECARS.get(chosen or "", {})}
    others = tuple(OtherEntry(p, sidecars.get(p.name, "")) for p in unknown)
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
