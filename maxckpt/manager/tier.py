"""One directory of step checkpoints: Orbax writes them, maxckpt decides what to keep.

A tier is what MaxText's `create_orbax_checkpoint_manager` builds (a v0
`ocp.CheckpointManager` with the single item `items`, OCDBT + zarr3) with
two changes: Orbax is never allowed to delete anything (no `max_to_keep`,
no `keep_period`), because a failing deletion in Orbax 0.12.8 raises from the
next `wait_until_finished()` and drops the new step from `all_steps()`; and
the steps a tier reports come from the disk (committed ones only), not from
Orbax's in-memory list, which would still name steps retention has removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.checkpoint_manager import StepAlreadyExistsError

from maxckpt.manager.pytree_io import ITEM_NAME
from maxckpt.manager.retention import BackgroundRetention, RetentionPolicy
from maxckpt.manager.run_dirs import StepEntry, scan_run_dir
from maxckpt.storage import objects, orbax_s3
from maxckpt.storage.urls import as_path

logger = logging.getLogger("maxckpt.manager")


@dataclass(frozen=True)
class StorageOptions:
    """How arrays are written and read (MaxText's `checkpoint_storage_*` keys)."""

    use_ocdbt: bool = True
    use_zarr3: bool = True
    target_data_file_size: int = 2 * 1024**3
    concurrent_gb: int = 96


@dataclass(frozen=True)
class TierSpec:
    """Where a tier writes, how often, and what it keeps."""

    name: str  # "persistent" or "local"
    directory: str
    period: int
    policy: RetentionPolicy


class StorageTier:
    """Saves to one directory on a period, prunes it in the background, lists it from disk."""

    def __init__(self, spec: TierSpec, *, async_save: bool, storage: StorageOptions) -> None:
        self.spec = spec
        self.directory = as_path(spec.directory)
        objects.require_bucket(self.directory)  # a missing bucket is one clear error, not an Orbax traceback
        self.storage = storage
        handler = ocp.PyTreeCheckpointHandler(
            use_ocdbt=storage.use_ocdbt,
            use_zarr3=storage.use_zarr3,
            save_concurrent_gb=storage.concurrent_gb,
            restore_concurrent_gb=storage.concurrent_gb,
        )
        self._orbax = ocp.CheckpointManager(
            self.directory,
            item_names=(ITEM_NAME,),
            item_handlers={ITEM_NAME: handler},
            options=ocp.CheckpointManagerOptions(
                create=True,
                enable_async_checkpointing=async_save,
                max_to_keep=None,  # Orbax never deletes: maxckpt's retention does (see module doc)
                cleanup_tmp_directories=False,  # done by retire_partials, crash-safely
                temporary_path_class=orbax_s3.temporary_path_class(self.directory),  # S3 cannot rename
            ),
        )
        self._retention = BackgroundRetention(self.directory, spec.policy, active=jax.process_index() == 0)
        self._retention.retire_partials()

    @property
    def name(self) -> str:
        return self.spec.name

    def due(self, step: int) -> bool:
        return self.spec.period > 0 and step % self.spec.period == 0

    def committed(self) -> tuple[StepEntry, ...]:
        return scan_run_dir(self.directory, "orbax").committed

    def save(self, step: int, state: Any, custom_metadata: dict[str, Any]) -> bool:
        """Start saving `state` as `step`; False when that step is already saved.

        Whether it is already saved is Orbax's answer, asked inside Orbax's
        save after the saves in flight have committed: a step still being
        written asynchronously (the periodic save of the last step, then the
        final save of the same step) counts as saved, and every JAX process
        gets the same answer at the same point. A process that looked at the
        disk on its own could skip a save the others start and leave them
        waiting at Orbax's barrier.
        """
        chunk = self.storage.target_data_file_size
        args = ocp.args.Composite(
            **{
                ITEM_NAME: ocp.args.PyTreeSave(
                    item=state,
                    save_args=jax.tree_util.tree_map(lambda _: ocp.SaveArgs(chunk_byte_size=chunk), state),
                    ocdbt_target_data_file_size=chunk,
                )
            }
        )
        try:
            saved = self._orbax.save(step, args=args, force=True, custom_metadata=custom_metadata)
        except StepAlreadyExistsError:
            # Orbax's in-memory list may still name a step retention removed: resync from disk, once no
            # deletion is in flight (on a bucket a step vanishes object by object; Orbax must not list it then).
            self._retention.flush()
            self._orbax.reload()
            if step in self._orbax.all_steps():
                logger.info("maxckpt: step %d is already saved in %s; not saving it again", step, self.directory)
                return False
            saved = self._orbax.save(step, args=args, force=True, custom_metadata=custom_metadata)
        if saved:
            self._retention.notify_saved(step)
        return bool(saved)

    def wait(self) -> None:
        """Block until saves in flight are committed (raises if one failed), then prune."""
        try:
            self._orbax.wait_until_finished()
        finally:
            self._retention.flush()

    def close(self) -> None:
        try:
            self._orbax.wait_until_finished()
        finally:
            self._retention.close()
            self._orbax.close()
