"""One directory of step checkpoints: Orbax writes them, maxckpt decides what to keep.

A tier is what MaxText's `create_orbax_checkpoint_manager` builds (a v0
`ocp.CheckpointManager` with the single item `items`, OCDBT + zarr3) with
two changes: Orbax is never allowed to delete anything (no `max_to_keep`,
no `keep_period`), because a failing deletion in Orbax 0.12.8 raises from the
next `wait_until_finished()` and drops the new step from `all_steps()`; and
the steps a tier reports come from the disk (committed ones only), not from
Orbax's in-memory list, which would still name steps retention has removed.

A tier also owns the run directory while it lives: process 0 takes its lock
(:mod:`~maxckpt.manager.run_lock`) before Orbax or the start-up cleanup
touch it. A save that fails (unwritable or full disk), synchronously or in
the background, surfaces as one :class:`~maxckpt.errors.CheckpointSaveError`
from that `save`, the next `save`, `wait` or `close`; its stuck Orbax
threads are released so the process never hangs (see
:mod:`~maxckpt.compat.orbax_threads`).
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_manager import StepAlreadyExistsError

from maxckpt.errors import CheckpointSaveError, MaxckptError
from maxckpt.compat import orbax_threads
from maxckpt.manager.manifests import ManifestJob
from maxckpt.manager.pytree_io import ITEM_NAME
from maxckpt.manager.retention import BackgroundRetention, RetentionPolicy
from maxckpt.storage.run_dirs import RunDir, StepEntry, scan_run_dir
from maxckpt.manager.run_lock import RunDirLock, unwritable_error
from maxckpt.compat import orbax_s3
from maxckpt.storage import objects
from maxckpt.storage.urls import as_path, is_url

logger = logging.getLogger("maxckpt.manager")


@dataclass(frozen=True)
class StorageOptions:
    """How arrays are written and read (MaxText's `checkpoint_storage_*` keys).

    `target_data_file_size` bounds both the OCDBT data files and the chunks
    (`SaveArgs.chunk_byte_size`), as MaxText passes it. maxckpt's default is
    64 MiB, MaxText's 2 GiB: TensorStore writes each data file with one
    thread, so with 2 GiB a state of a few GiB goes to disk as one or two
    sequential writes; at 64 MiB every array over that size gets its own file
    and the files are written (and later read) in parallel.

    `compression` (`maxckpt_storage_compression`) is zstd level 3 on every
    chunk, which MaxText always turns on. maxckpt leaves it off by default:
    on float32 states it saves about 8% of the bytes but costs more CPU time
    than the write itself (see "Performance" in docs/manager.md). The codec
    is recorded in each array's zarr metadata, so Orbax, MaxText and
    TensorStore read both kinds the same way.
    """

    use_ocdbt: bool = True
    use_zarr3: bool = True
    target_data_file_size: int = 64 * 1024**2
    concurrent_gb: int = 96
    compression: bool = False

    def handler(self) -> ocp.PyTreeCheckpointHandler:
        """The PyTree handler a tier saves with."""
        return ocp.PyTreeCheckpointHandler(
            use_ocdbt=self.use_ocdbt,
            use_zarr3=self.use_zarr3,
            use_compression=self.compression,
            save_concurrent_gb=self.concurrent_gb,
            restore_concurrent_gb=self.concurrent_gb,
        )


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
        self._primary = jax.process_index() == 0
        self._operations: set[str | None] = set()  # Orbax operation ids of this tier's saves
        self._in_flight: int | None = None  # step of the save that may still be running
        self._closed = False
        self._async = async_save
        self._manifests: dict[int, ManifestJob] = {}  # saved steps whose manifest follows their commit
        self._lock = _lock_on_process_0(spec.directory, self._primary)
        try:
            handler = storage.handler()
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
        except OSError as err:
            self._release_lock()
            raise unwritable_error(spec.directory, err, "use the checkpoint directory") from None
        except BaseException:
            self._release_lock()
            raise
        self._retention = BackgroundRetention(self.directory, spec.policy, active=self._primary)
        self._retention.retire_partials()  # under the lock: nobody else is saving here
        orbax_threads.at_exit(self)

    @property
    def name(self) -> str:
        return self.spec.name

    def due(self, step: int) -> bool:
        return self.spec.period > 0 and step % self.spec.period == 0

    def scan(self) -> RunDir:
        return scan_run_dir(self.directory, "orbax")

    def committed(self) -> tuple[StepEntry, ...]:
        return self.scan().committed

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
            saved = self._orbax_save(step, args, custom_metadata)
        except StepAlreadyExistsError:
            # Orbax's in-memory list may still name a step retention removed: resync from disk, once no
            # deletion is in flight (on a bucket a step vanishes object by object; Orbax must not list it then).
            self._retention.flush()
            self._orbax.reload()
            if step in self._orbax.all_steps():
                logger.info("maxckpt: step %d is already saved in %s; not saving it again", step, self.directory)
                return False
            saved = self._orbax_save(step, args, custom_metadata)
        if saved:
            self._retention.notify_saved(step)
        return bool(saved)

    def _orbax_save(self, step: int, args: Any, custom_metadata: dict[str, Any]) -> bool:
        # Orbax's save first waits for the previous one: its failure comes out here too.
        previous = self._in_flight
        job = ManifestJob(step, args[ITEM_NAME].item) if self._primary else None  # started once Orbax's save returns
        try:
            if previous is not None:  # Orbax's save first waits for it, unbounded: bounded here
                orbax_threads.wait_bounded(self._orbax.wait_until_finished, orbax_threads.save_timeout())
            saved = self._orbax.save(step, args=args, force=True, custom_metadata=custom_metadata)
        except (StepAlreadyExistsError, MaxckptError):
            raise
        except Exception as err:  # noqa: BLE001 - Orbax and TensorStore raise many types: one error for users
            self._operations.add(orbax_threads.current_operation_id())
            raise self._failed(err, previous if previous is not None and previous != step else step) from err
        self._operations.add(orbax_threads.current_operation_id())
        self._in_flight = step if saved else previous
        self._save_failed = False
        self._write_manifests(keep=step if self._async else None)  # the previous save has committed by now
        if saved and job is not None:
            self._manifests[step] = job.start()
            if not self._async:
                self._write_manifests()
        return bool(saved)

    def _write_manifests(self, keep: int | None = None) -> None:
        """Integrity manifests of the committed saves (all but `keep`, which may still be in flight)."""
        for step in [s for s in self._manifests if s != keep]:
            self._manifests.pop(step).write(self.directory / str(step))

    def _failed(self, err: Exception, step: int | None) -> CheckpointSaveError:
        """Release the failed save's threads; the error that says what failed and what is safe."""
        self._in_flight = None
        self._save_failed = True
        self._manifests.clear()  # which saves committed is not known: their steps go without a manifest
        released = orbax_threads.release_stuck_threads(self._operations)
        self._operations.clear()
        if released:
            logger.debug("maxckpt: released %d Orbax thread(s) of the failed save", released)
        what = f"saving step {step}" if step is not None else "a save"
        cause = _short(err)
        try:
            self._retention.retire_partials()  # the failed save's temporary folder: ours (we hold the lock)
            # Delete it now, not at some later pass: after a full disk that space is what the next save needs,
            # and a process that ends on this error (without close) must not leave it behind.
            self._retention.flush()
        except Exception as cleanup:  # noqa: BLE001 - a dead store: the next start retires it; the save error is what counts
            logger.warning("maxckpt: could not remove the failed save's partial step yet: %s", _short(cleanup))
        hint = _hint(err)
        try:
            committed = [e.step for e in self.committed()]
        except Exception:  # noqa: BLE001 - the message must not fail
            committed = []
        kept = f"the newest committed checkpoint is step {committed[-1]}" if committed else "no step is committed yet"
        return CheckpointSaveError(
            f"{what} to {os.fspath(self.directory)} failed: {type(err).__name__}: {cause}; {hint}. "
            f"Committed checkpoints are untouched ({kept}); the step was not saved"
        )

    def wait(self) -> None:
        """Block until saves in flight are committed (CheckpointSaveError if one failed), then prune."""
        try:
            self._wait_orbax()
        finally:
            self._retention.flush()

    def _wait_orbax(self) -> None:
        reported = self._in_flight is None and getattr(self, "_save_failed", False)
        try:
            orbax_threads.wait_bounded(self._orbax.wait_until_finished, self._wait_limit(reported))
        except MaxckptError:
            raise
        except Exception as err:  # noqa: BLE001 - see _orbax_save
            if reported:
                # Orbax raises a failure again when waited on from another thread: it was reported already.
                logger.info("maxckpt: the failed save, again: %s", _short(err))
                return
            raise self._failed(err, self._in_flight) from err
        self._in_flight = None
        self._write_manifests()

    @staticmethod
    def _wait_limit(reported: bool) -> float:
        """How long to wait for Orbax: the save timeout, or a few seconds once its failure was reported."""
        return min(5.0, orbax_threads.save_timeout()) if reported else orbax_threads.save_timeout()

    def close(self) -> None:
        """Finish (or fail) the save in flight, stop retention and Orbax, unlock the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait_orbax()
        finally:
            try:
                self._retention.close()
                try:
                    orbax_threads.wait_bounded(
                        self._orbax.close, self._wait_limit(getattr(self, "_save_failed", False))
                    )
                except MaxckptError:
                    raise
                except Exception as err:  # noqa: BLE001 - Orbax re-raises a failure already reported by wait
                    if not getattr(self, "_save_failed", False):
                        raise self._failed(err, None) from err
                    logger.info("maxckpt: Orbax's close after the failed save: %s", _short(err))
            finally:
                self._release_lock()

    def at_exit(self) -> None:
        """The interpreter is exiting without close(): finish or fail the save in flight, never hang."""
        if self._closed:
            return
        try:
            self._wait_orbax()
        except MaxckptError as err:
            logger.error("maxckpt: %s", err)
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()


def _lock_on_process_0(directory: str, primary: bool) -> RunDirLock | None:
    """Process 0 locks the run directory; every process learns whether it could.

    The other processes of a multi-process job are the same writer, so they
    do not lock. Were process 0 alone to fail (directory locked or
    unwritable), the others would wait for it at Orbax's first barrier for
    minutes: they all stop at once instead.
    """
    lock, failure = None, None
    if primary and not is_url(directory):
        try:
            lock = RunDirLock.acquire(directory)
        except MaxckptError as err:
            failure = err
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        failed = bool(multihost_utils.broadcast_one_to_all(np.int32(failure is not None)))
        if failed and failure is None:
            raise CheckpointSaveError(
                f"process 0 could not start saving to {directory} (its error says why); this process stops too"
            )
    if failure is not None:
        raise failure
    return lock


def _short(err: Exception) -> str:
    """The error's own words, short: TensorStore messages repeat long paths before the reason."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f": {err.filename}" if err.filename else "")
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= 240 else f"{text[:120]} ... {text[-110:]}"


def _hint(err: Exception) -> str:
    text = f"{err}".lower()
    errno_ = getattr(err, "errno", None)
    if errno_ in (errno.ENOSPC, errno.EDQUOT) or "no space left" in text or "quota" in text:
        return "free space on that file system, then save again"
    if errno_ == errno.EROFS or "read-only file system" in text:
        return "the directory is on a read-only file system: pick a writable one"
    if errno_ in (errno.EPERM, errno.EACCES) or "permission denied" in text:
        return "make the directory writable for this user"
    if isinstance(err, (TimeoutError, ConnectionError)) or any(
        m in text for m in ("could not connect", "connect to the endpoint", "retry attempts failed", "cannot reach")
    ):
        return ("the store did not answer: check the network and the endpoint, then save again "
                "(MAXCKPT_STORAGE_TIMEOUT, MAXCKPT_STORAGE_RETRIES and MAXCKPT_SAVE_TIMEOUT bound the wait)")
    return "check that the directory exists and is writable, then save again"
