"""Retention: which checkpoints to keep, and deleting the rest without ever hurting training.

The policy is the one MaxText users know (keep the newest N committed
checkpoints) plus an archive rule (keep every K-th step forever). It runs on a
:class:`~maxckpt.storage.run_dirs.RunDir`, so the same code prunes a live
MaxText run from the manager and any run directory from `maxckpt prune`.

Rules that hold whatever the numbers:

- only *committed* checkpoints count; a step being written or cut short by a
  crash is never counted and never removed by the policy;
- the newest committed checkpoint is never removed (nor one pinned by the
  layout: Megatron's tracker target, the HF Trainer's best model);
- a deletion is a rename out of sight, then a recursive delete, so a process
  killed in the middle leaves a ``*.maxckpt-deleting`` folder that nothing
  lists as a checkpoint (and the next pass finishes off), never a
  half-deleted step that Orbax or a restart would pick up;
- a failed deletion never raises into training: `FileNotFoundError` means
  someone else removed it; any other `OSError` is one warning naming the
  path and the error, and the path is retried on the next pass.

Orbax 0.12.8's own deletion raises from `wait_until_finished()` and drops the
newest step from `all_steps()` when one old step cannot be deleted; the
manager therefore never lets Orbax delete anything and uses this module.

>>> plan = plan_retention(scan_run_dir(run), RetentionPolicy(keep=3))   # doctest: +SKIP
>>> delete_checkpoints(plan.remove).failed                              # doctest: +SKIP
{}
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable

from etils import epath

from maxckpt.errors import CheckpointNotFoundError, ConfigError
from maxckpt.storage import deletion
from maxckpt.storage.run_dirs import (
    COMMIT_FILE,
    COMMITTED,
    DELETING,
    DELETING_SUFFIX,
    LAYOUTS_IN_WORDS,
    ORBAX_TMP_SUFFIX,
    PARTIAL,
    RunDir,
    StepEntry,
    scan_run_dir,
)
from maxckpt.storage.urls import is_url

logger = logging.getLogger("maxckpt.retention")

KEEP, REMOVE, LEAVE = "keep", "remove", "leave"


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the newest `keep` committed checkpoints, and every step divisible by `keep_period`.

    `keep=None` keeps everything (MaxText's default). The newest committed
    checkpoint is kept whatever the numbers say.

    >>> RetentionPolicy(keep=2, keep_period=1000)
    RetentionPolicy(keep=2, keep_period=1000)
    """

    keep: int | None = None
    keep_period: int | None = None

    def __post_init__(self) -> None:
        for name in ("keep", "keep_period"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"retention {name}: expected a positive integer or None, got {value!r}")


@dataclass(frozen=True)
class Decision:
    """What retention does with one entry, and why."""

    entry: StepEntry
    action: str  # keep | remove | leave
    reason: str


@dataclass(frozen=True)
class RetentionPlan:
    """The decision for every step entry of one run directory."""

    run: RunDir
    policy: RetentionPolicy
    decisions: tuple[Decision, ...]

    @property
    def remove(self) -> tuple[StepEntry, ...]:
        return tuple(d.entry for d in self.decisions if d.action == REMOVE)

    @property
    def keep(self) -> tuple[StepEntry, ...]:
        return tuple(d.entry for d in self.decisions if d.action == KEEP)


def plan_retention(run: RunDir, policy: RetentionPolicy) -> RetentionPlan:
    """Decide, for each entry of `run`, whether `policy` keeps or removes it.

    Partial entries are left alone (a writer may still be busy with them);
    leftovers of interrupted deletions are removed.
    """
    committed = [s for s in run.steps if s.state == COMMITTED and not s.release]
    newest = committed[-1] if committed else None
    window = {id(s) for s in committed[-policy.keep:]} if policy.keep else set()
    decisions: list[Decision] = []
    for entry in run.steps:
        if entry.release and entry.state != DELETING:
            decisions.append(Decision(entry, KEEP, "Megatron release checkpoint: never counted or removed"))
        elif entry.state == DELETING:
            decisions.append(Decision(entry, REMOVE, entry.why))
        elif entry.state != COMMITTED:
            decisions.append(Decision(entry, LEAVE, f"partial, never counted: {entry.why}"))
        elif entry is newest:
            decisions.append(Decision(entry, KEEP, "newest committed checkpoint"))
        elif policy.keep is None:
            decisions.append(Decision(entry, KEEP, "no limit on the number kept"))
        elif id(entry) in window:
            decisions.append(Decision(entry, KEEP, f"among the newest {policy.keep}"))
        elif policy.keep_period and entry.step % policy.keep_period == 0:
            decisions.append(Decision(entry, KEEP, f"step is a multiple of keep_period={policy.keep_period}"))
        elif entry.name in run.pinned:
            decisions.append(Decision(entry, KEEP, run.pinned[entry.name]))
        else:
            decisions.append(Decision(entry, REMOVE, f"older than the newest {policy.keep}"))
    return RetentionPlan(run, policy, tuple(decisions))


# --- deleting ---------------------------------------------------------------------------


def retire(path: epath.Path) -> epath.Path:
    """Take a checkpoint out of sight in one atomic step; return where it went.

    Locally that is a rename to ``<name>.maxckpt-deleting``: no lister (ours,
    Orbax's, a restarting run's) sees the step any more, whatever happens
    next. Object stores cannot rename atomically; there the intent is
    recorded as an object first (:mod:`maxckpt.storage.deletion`).
    """
    if path.name.endswith(DELETING_SUFFIX) or DELETING_SUFFIX + "-" in path.name:
        return path  # already retired by an earlier, interrupted pass
    if is_url(path):
        return deletion.record_intent(path)
    target = path.parent / (path.name + DELETING_SUFFIX)
    if target.exists():  # the same step was retired before and saved again
        target = path.parent / f"{path.name}{DELETING_SUFFIX}-{uuid.uuid4().hex[:8]}"
    os.rename(os.fspath(path), os.fspath(target))
    return target


def destroy(path: epath.Path) -> None:
    """Recursively delete a retired checkpoint."""
    if is_url(path):
        deletion.finish(path)
    else:
        shutil.rmtree(os.fspath(path))


def remove_checkpoint(path: epath.Path) -> None:
    """Remove one checkpoint folder crash-safely: :func:`retire`, then :func:`destroy`.

    A symbolic link is refused (an OSError, reported like any failed deletion):
    the scan never offers one, this is the last line of defence.
    """
    if not is_url(path) and os.path.islink(os.fspath(path)):
        raise OSError(errno.ELOOP, "is a symlink; maxckpt never renames or deletes links", os.fspath(path))
    destroy(retire(path))


@dataclass
class DeletionResult:
    """Paths removed, and paths that could not be removed with the error."""

    removed: list[epath.Path] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def delete_checkpoints(
    entries: Iterable[StepEntry],
    *,
    remover: Callable[[epath.Path], None] = remove_checkpoint,
    warned: set[tuple[str, str]] | None = None,
) -> DeletionResult:
    """Remove `entries`; never raises for an `OSError`.

    A `FileNotFoundError` means someone else removed the entry already: fine.
    Any other `OSError` logs one warning naming the path and the error (once
    per path and error when `warned` is shared across calls) and is reported
    in :attr:`DeletionResult.failed`, so the caller can retry later.
    """
    result = DeletionResult()
    for entry in entries:
        try:
            remover(entry.path)
        except FileNotFoundError:
            result.removed.append(entry.path)  # someone else removed it: the goal is reached
        except OSError as err:
            result.failed[os.fspath(entry.path)] = f"{type(err).__name__}: {err}"
            # The same failure on the same step again (retired under a new name since): warn once.
            key = (os.fspath(entry.path).split(DELETING_SUFFIX)[0], str(err).split(DELETING_SUFFIX)[0])
            if warned is None or key not in warned:
                logger.warning(
                    "maxckpt retention could not remove %s (%s: %s); training goes on and the "
                    "deletion is retried on the next save",
                    os.fspath(entry.path), type(err).__name__, err,
                )
                if warned is not None:
                    warned.add(key)
        else:
            result.removed.append(entry.path)
    return result


# --- pruning any run directory ------------------------------------------------------------


@dataclass(frozen=True)
class PruneResult:
    """What `prune` decided and, unless it was a dry run, what it removed."""

    plan: RetentionPlan
    deletion: DeletionResult | None  # None for a dry run


def prune(
    directory: str | os.PathLike,
    keep: int,
    keep_period: int | None = None,
    *,
    dry_run: bool = False,
    layout: str | None = None,
) -> PruneResult:
    """Apply the retention policy to any run directory maxckpt recognises.

    Entries that are not checkpoints of the recognised layout are never
    touched; a folder without any recognisable checkpoint is refused. Unlike
    `maxckpt ls`, prune never descends into a run's `checkpoints/` on its
    own: it deletes, so it acts only on the folder it was given.

    >>> prune("/runs/llama/checkpoints", keep=3, dry_run=True).plan.remove   # doctest: +SKIP
    """
    run = scan_run_dir(directory, layout)
    if not run.path.exists():
        raise CheckpointNotFoundError(f"{run.path}: no such directory")
    if run.layout is None or not run.steps:
        listing = ", ".join(o.name + (" (symlink, skipped)" if o.is_link else "") for o in run.others[:8]) or "nothing"
        nested = run.path / "checkpoints"
        hint = f"; did you mean {nested}?" if nested.is_dir() and scan_run_dir(nested).steps else ""
        raise CheckpointNotFoundError(
            f"{run.path} holds no checkpoints maxckpt recognises (found: {listing}){hint}; "
            f"prune understands {LAYOUTS_IN_WORDS}: point it at the folder holding them"
        )
    plan = plan_retention(run, RetentionPolicy(keep=keep, keep_period=keep_period))
    if dry_run:
        return PruneResult(plan, None)
    return PruneResult(plan, delete_checkpoints(plan.remove))


# --- retention in the background of a training run ----------------------------------------


class BackgroundRetention:
    """Applies a policy to one Orbax run directory in a daemon thread.

    The training loop calls :meth:`notify_saved` after starting a save; the
    thread waits until that step is committed on disk (async saves commit
    later), then prunes. Because the policy only counts committed steps, a
    pass can never remove more than it should, whenever it runs. Training
    never waits for a deletion, and no error in here reaches it.

    Only the primary process deletes: build it with `active=False` elsewhere.
    """

    _POLL_START_S = 0.02
    _POLL_MAX_S = 1.0

    def __init__(self, directory: str | os.PathLike, policy: RetentionPolicy, *, active: bool = True) -> None:
        self.directory = epath.Path(directory)
        self.policy = policy
        self.active = active
        self._cond = threading.Condition()
        self._want: int | None = None  # newest saved step not yet pruned after
        self._flush_requested = 0
        self._flush_done = 0
        self._stopping = False
        self._warned: set[tuple[str, str]] = set()
        self._thread: threading.Thread | None = None
        if active:
            self._thread = threading.Thread(target=self._loop, name="maxckpt-retention", daemon=True)
            self._thread.start()

    def retire_partials(self) -> list[epath.Path]:
        """Move Orbax temporary folders of crashed saves out of sight now; the thread deletes them.

        Called once before the first save: a crashed run's
        ``<step>.orbax-checkpoint-tmp`` must be gone before Orbax writes that
        step again, and renaming is instant where deleting is not. Only
        temporary folders go: a ``<step>`` folder without
        ``commit_success.txt`` is what an Orbax old enough not to write the
        marker on local disks left after a *complete* save, and Orbax still
        lists it as a checkpoint; it is partial to maxckpt, so never removed.
        """
        if not self.active:
            return []
        moved = []
        for entry in scan_run_dir(self.directory, "orbax").steps:
            if is_url(entry.path) and entry.state != COMMITTED:
                self._finish_now(entry)
                continue
            if entry.state != PARTIAL or ORBAX_TMP_SUFFIX not in entry.name:
                continue
            try:
                moved.append(retire(entry.path))
            except FileNotFoundError:
                pass  # gone already
            except OSError as err:
                logger.warning("maxckpt could not move aside the partial checkpoint %s (%s)", entry.path, err)
        with self._cond:
            self._flush_requested += 1 if moved else 0
            self._cond.notify_all()
        return moved

    def _finish_now(self, entry: StepEntry) -> None:
        """On a bucket, delete a crashed save or an interrupted deletion now, before Orbax saves again.

        Nothing can be renamed out of the way there, and Orbax writes a step in
        place: a background deletion of `<step>/` racing a new save of the same
        step would eat the new save. At start-up no save is in flight, so the
        previous run's debris goes first.
        """
        try:
            remove_checkpoint(entry.path)
        except OSError as err:
            logger.warning("maxckpt could not remove the %s checkpoint %s (%s); retried on the next start",
                           entry.state, entry.path, err)

    def notify_saved(self, step: int) -> None:
        """A save of `step` has started (or finished): prune once it is committed."""
        if not self.active:
            return
        with self._cond:
            self._want = step if self._want is None else max(self._want, step)
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Saves are finished: prune now and wait for that pass to end."""
        if not self.active:
            return
        with self._cond:
            self._flush_requested += 1
            goal = self._flush_requested
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._flush_done >= goal or not self._alive(), timeout)

    def close(self) -> None:
        """Finish pending work and stop the thread."""
        if not self.active or self._thread is None:
            return
        self.flush()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._thread = None

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _committed(self, step: int) -> bool:
        try:
            return (self.directory / str(step) / COMMIT_FILE).exists()
        except Exception:  # noqa: BLE001 - a flaky file system must not end the thread: ask again next poll
            return False

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._want is not None or self._flush_requested > self._flush_done or self._stopping
                )
                if self._stopping and self._want is None and self._flush_requested <= self._flush_done:
                    return
                step = self._want
            self._wait_for_commit(step)
            with self._cond:
                flush_goal = self._flush_requested
                if self._want == step:
                    self._want = None
            self._run_pass()
            with self._cond:
                self._flush_done = max(self._flush_done, flush_goal)
                self._cond.notify_all()

    def _wait_for_commit(self, step: int | None) -> None:
        """Poll until `step` is committed, a flush asks to go ahead, or a newer save starts.

        Orbax starts a save only once the previous one has finished, so a
        newer save means `step` is done (committed, or failed): prune now.
        Waiting for the newer one instead would starve retention whenever a
        save takes about as long as a training step.
        """
        delay = self._POLL_START_S
        while step is not None and not self._committed(step):
            with self._cond:
                if self._flush_requested > self._flush_done or self._stopping or self._want != step:
                    return
                self._cond.wait(delay)
            delay = min(delay * 2, self._POLL_MAX_S)

    def _run_pass(self) -> None:
        try:
            run = scan_run_dir(self.directory, "orbax")
            for link in run.links:
                key = (os.fspath(link.path), "symlink")
                if key not in self._warned:
                    self._warned.add(key)
                    logger.warning(
                        "maxckpt retention: %s is a symlink (-> %s); it is left alone: maxckpt never follows, "
                        "renames or deletes links in a run directory", os.fspath(link.path), link.link_target,
                    )
            plan = plan_retention(run, self.policy)
            delete_checkpoints(plan.remove, warned=self._warned)
        except Exception:  # noqa: BLE001 - a retention bug must never stop training
            logger.exception("maxckpt retention pass on %s failed; training goes on", self.directory)
