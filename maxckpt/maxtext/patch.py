"""Route MaxText's trainer to maxckpt: its checkpoint manager factory and save hook, replaced.

MaxText 0.2.5 builds its checkpoint manager in
`maxtext.utils.train_utils.create_checkpoint_manager`, which calls
`maxtext.common.checkpointing.create_orbax_checkpoint_manager` through the
module attribute; the training loop saves through
`checkpointing.maybe_save_checkpoint`, also through the module attribute.
:func:`install` replaces exactly these two attributes:

- the factory returns a :class:`~maxckpt.maxtext.checkpointer.MaxckptCheckpointer`
  built from MaxText's own arguments (same context, same save policy), with
  maxckpt's retention; on a single-process run it also installs a SIGTERM
  handler;
- the save hook is MaxText's, except after a SIGTERM: then it saves the step
  just trained (forced, whatever the period), waits for it to commit and
  raises MaxText's own `StopTraining`, which ends the run cleanly. On
  multi-process runs (TPU pods) SIGTERM stays JAX's, and MaxText's own
  `reached_preemption` path is untouched.

The swap itself, and the check of every MaxText function relied on here
against MaxText 0.2.5's, are :mod:`maxckpt.compat.maxtext`'s: a MaxText
upgrade fails loudly instead of training without maxckpt.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from typing import Any

from maxckpt.compat import maxtext as maxtext_compat
from maxckpt.config import CheckpointConfig
from maxckpt.manager.retention import RetentionPolicy

logger = logging.getLogger("maxckpt.maxtext")


@dataclass
class _State:
    config: CheckpointConfig | None = None  # the overlay of the run in progress
    managers: list = field(default_factory=list)  # checkpointers the patched factory built


_STATE = _State()


def managers() -> list:
    """Checkpointers created by the patched factory in this process, oldest first."""
    return list(_STATE.managers)


def create_orbax_checkpoint_manager(
    checkpoint_dir: str,
    enable_checkpointing: bool,
    use_async: bool,
    save_interval_steps: int,
    dataset_type: str | None = None,
    orbax_logger: Any = None,
    use_ocdbt: bool = True,
    use_zarr3: bool = True,
    enable_continuous_checkpointing: bool = False,
    max_num_checkpoints_to_keep: int | None = 10,
    checkpoint_storage_concurrent_gb: int = 96,
    enable_autocheckpoint: bool = False,
    todelete_subdir: str | None = None,
    todelete_full_path: str | None = None,
    ocdbt_target_data_file_size_bytes: int | None = None,
) -> Any:
    """MaxText's factory with maxckpt's checkpointer: same arguments, same context, same save policy."""
    from maxtext.common import checkpoint_context, checkpointing
    from maxtext.utils import gcs_utils

    from maxckpt.maxtext.checkpointer import MaxckptCheckpointer

    if not enable_checkpointing:
        logger.info("maxckpt: enable_checkpointing is false: no checkpoint manager")
        return None
    if ocdbt_target_data_file_size_bytes is None:
        ocdbt_target_data_file_size_bytes = checkpointing.DEFAULT_OCDBT_TARGET_DATA_FILE_SIZE
    context = checkpoint_context.build_context(
        use_ocdbt=use_ocdbt,
        use_zarr3=use_zarr3,
        ocdbt_target_data_file_size_bytes=ocdbt_target_data_file_size_bytes,
        checkpoint_storage_concurrent_gb=checkpoint_storage_concurrent_gb,
        enable_continuous_checkpointing=enable_continuous_checkpointing,
        todelete_full_path=todelete_full_path,
        todelete_subdir=todelete_subdir,
        partial_load=True,
    )
    cfg = _STATE.config or CheckpointConfig()
    keep = max_num_checkpoints_to_keep if max_num_checkpoints_to_keep not in (None, 0) else None
    manager = MaxckptCheckpointer(
        gcs_utils.mkdir_and_check_permissions(checkpoint_dir),
        context=context,
        save_decision_policy=checkpoint_context.build_save_decision_policy(
            save_interval_steps=save_interval_steps,
            enable_continuous_checkpointing=enable_continuous_checkpointing,
            enable_autocheckpoint=enable_autocheckpoint,
        ),
        policy=RetentionPolicy(keep=keep, keep_period=cfg.maxckpt_keep_period),
        use_async=use_async,
    )
    _STATE.managers.append(manager)
    logger.info(
        "maxckpt: MaxText's checkpoint manager is maxckpt's (%s, retention %s)", manager.directory, manager.policy
    )
    _install_sigterm(manager)
    return manager


def _install_sigterm(manager: Any) -> None:
    import jax

    if jax.process_count() != 1:
        logger.info("maxckpt: %d processes: SIGTERM is left to JAX's preemption sync", jax.process_count())
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        manager.sigterm_received = True
        logger.warning("maxckpt: SIGTERM received: checkpointing the current step, then stopping")

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: leave SIGTERM as it is
        logger.warning("maxckpt: not on the main thread, SIGTERM is not handled")


def maybe_save_checkpoint(
    checkpoint_manager: Any, state: Any, config: Any, data_iterator: Any, step: Any = None
) -> Any:
    """MaxText's save hook; after a SIGTERM: save `step` now, wait for it, stop as MaxText does on preemption."""
    from maxtext.common import checkpointing
    from maxtext.utils import exceptions

    from maxckpt.maxtext.checkpointer import MaxckptCheckpointer

    original = maxtext_compat.original("maybe_save_checkpoint")
    if not (
        isinstance(checkpoint_manager, MaxckptCheckpointer) and checkpoint_manager.sigterm_received and step is not None
    ):
        return original(checkpoint_manager, state, config, data_iterator, step)
    step = int(step)
    if step not in checkpointing.all_steps(checkpoint_manager):
        checkpointing.save_checkpoint(checkpoint_manager, step, state, config, data_iterator, force=True)
    checkpointing.wait_until_finished(checkpoint_manager)
    checkpoint_manager.preempted_step = step
    logger.warning("maxckpt: step %d is committed after SIGTERM; stopping", step)
    raise exceptions.StopTraining(f"SIGTERM: maxckpt saved step {step}")


def install(config: CheckpointConfig) -> None:
    """Check MaxText, then point its manager factory and save hook at maxckpt's (idempotent)."""
    _STATE.config = config
    maxtext_compat.replace(
        {
            "create_orbax_checkpoint_manager": create_orbax_checkpoint_manager,
            "maybe_save_checkpoint": maybe_save_checkpoint,
        }
    )


def uninstall() -> None:
    """Give MaxText its own functions back."""
    maxtext_compat.restore()
    _STATE.config = None
