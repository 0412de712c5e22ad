"""The checkpointer MaxText gets: Orbax's own, with maxckpt deciding what to keep.

MaxText 0.2.5 checkpoints through Orbax v1's `ocp.training.Checkpointer`
(built in `maxtext.common.checkpointing.create_orbax_checkpoint_manager`)
and checks `isinstance(manager, ocp.training.Checkpointer)` before it
restores. :class:`MaxckptCheckpointer` therefore *is* that class, built with
MaxText's own context (OCDBT, zarr3, chunk sizes) and save decision policy,
so every save, restore, `latest`, `checkpoints`, `wait`, `metadata` and the
`items`/`iter` checkpointables behave and land on disk exactly as in plain
MaxText. What changes:

- Orbax never deletes (`PreserveAll`): maxckpt's
  :class:`~maxckpt.manager.retention.BackgroundRetention` prunes, counting
  committed steps only, on process 0 only, crash-safely, with
  `maxckpt_keep_period` on top of `max_num_checkpoints_to_keep`;
- process 0 holds the run directory's lock (`.maxckpt.lock`, as maxckpt's
  own manager does), so a second run started on the same directory by
  mistake is refused instead of destroying this one's saves;
- temporary folders left by a save that was killed are moved aside before
  the first save (they are never listed as checkpoints);
- `checkpoints`/`latest` drop steps retention has removed (Orbax's list is
  cached in memory and would still name them);
- a SIGTERM (single-process runs) is remembered, and
  :mod:`maxckpt.maxtext.patch` turns it into a checkpoint at the next step
  and MaxText's own clean stop.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
from etils import epath
from orbax.checkpoint import v1 as ocp

from maxckpt.manager.retention import BackgroundRetention, RetentionPolicy
from maxckpt.manager.tier import _lock_on_process_0
from maxckpt.storage.urls import as_path

logger = logging.getLogger("maxckpt.maxtext")


class MaxckptCheckpointer(ocp.training.Checkpointer):
    """`ocp.training.Checkpointer` whose retention is maxckpt's (see the module doc)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        context: Any,
        save_decision_policy: Any,
        policy: RetentionPolicy,
        use_async: bool = True,
    ) -> None:
        directory = epath.Path(as_path(directory))
        self.policy = policy
        primary = jax.process_index() == 0
        # Before anything is touched: a second writer on this directory is refused here (local paths).
        self._lock = _lock_on_process_0(os.fspath(directory), primary)
        try:
            self.retention = BackgroundRetention(directory, policy, active=primary)
            # Before Orbax lists the directory: a killed save's `<step>.orbax-checkpoint-tmp-*` goes away.
            self.retired_partials = [os.fspath(p) for p in self.retention.retire_partials()]
            super().__init__(
                directory,
                context=context,
                save_decision_policy=save_decision_policy,
                preservation_policy=ocp.training.preservation_policies.PreserveAll(),
                cleanup_tmp_directories=False,
            )
        except BaseException:
            self._release_lock()
            raise
        self.use_async = use_async  # read by MaxText's save_checkpoint, as on its own manager
        self.saved_steps: list[int] = []  # saves started by this process, in order
        self.sigterm_received = False
        self.preempted_step: int | None = None

    # --- saving -------------------------------------------------------------------------------

    def save_checkpointables_async(self, step: int, checkpointables: dict[str, Any], **kwargs: Any) -> Any:
        """Orbax's save; then retention prunes once `step` is committed (in the background)."""
        response = super().save_checkpointables_async(step, checkpointables, **kwargs)
        if response is not None:
            self.saved_steps.append(int(step))
            self.retention.notify_saved(int(step))
        return response

    # --- what is on disk ---------------------------------------------------------------------

    @property
    def checkpoints(self) -> Any:
        """Orbax's list without the steps retention removed since it was read.

        The newest entry stays as Orbax has it: it may be a save in flight
        (not on disk under its final name yet), and retention never removes
        the newest step.
        """
        found = list(super().checkpoints)
        if len(found) <= 1 or self.policy.keep is None:  # nothing was removed: no need to look
            return found
        return [c for c in found[:-1] if epath.Path(c.path).exists()] + found[-1:]

    def committed_steps(self) -> list[int]:
        """Committed steps on disk, oldest first (what a restart can resume from)."""
        from maxckpt.storage.run_dirs import scan_run_dir

        return [e.step for e in scan_run_dir(self.directory, "orbax").committed]

    # --- waiting and closing ------------------------------------------------------------------

    def wait(self) -> None:
        """Block until saves in flight are committed, then until retention has pruned after them."""
        try:
            super().wait()
        finally:
            self.retention.flush()

    def close(self) -> None:
        try:
            super().close()
        finally:
            try:
                self.retention.close()
            finally:
                self._release_lock()

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
