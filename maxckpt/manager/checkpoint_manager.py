"""The training-loop side of maxckpt: save on cadence, keep the disk bounded, resume.

:class:`CheckpointManager` behaves like MaxText's checkpointing (same layout
on disk, same config keys, checkpoints that plain Orbax and MaxText restore)
and fixes what bites in practice: Orbax's own deletion is replaced by
maxckpt's crash-safe retention, which never raises into training and only
counts committed steps; `all_steps()` reports what is on disk; restoring a
chosen step that is not there is an error, not a fresh start.

    from maxckpt import CheckpointManager, load_config

    mgr = CheckpointManager.from_config(load_config("overlay.yml"))
    with mgr:
        state = mgr.restore(target=abstract_state) or fresh_state
        start = 0 if mgr.restored_step is None else mgr.restored_step + 1
        for step in range(start, steps):
            state = train_step(state)
            mgr.save(step, state)            # every checkpoint_period steps
        mgr.save(steps - 1, state, final=True)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

from maxckpt.config import CheckpointConfig
from maxckpt.config.maxtext_run import RunConfig, record_dir, resolve_model_config, write_record
from maxckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    MaxckptError,
    ShapeMismatchError,
)
from maxckpt.manager import export, pytree_io, two_tier
from maxckpt.manager.pytree_io import OPT_STATE, replace_items, top_items
from maxckpt.manager.retention import RetentionPolicy
from maxckpt.storage.urls import normalize
from maxckpt.manager.tier import StorageOptions, StorageTier

logger = logging.getLogger("maxckpt.manager")



def _abstract_from_metadata(metadata: Any) -> Any:
    """A target that restores every stored array as it was written, on the first local device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def leaf(meta: Any) -> Any:
        if hasattr(meta, "shape") and hasattr(meta, "dtype") and meta.dtype is not None:
            return jax.ShapeDtypeStruct(tuple(meta.shape), meta.dtype, sharding=device)
        return meta

    return jax.tree_util.tree_map(leaf, metadata)


# Config keys that hold paths the manager reads or writes: made absolute once, here.
_PATH_KEYS = ("base_output_directory", "local_checkpoint_directory", "load_parameters_path",
              "load_full_state_path", "maxckpt_export_directory")


def _normalized_paths(config: CheckpointConfig) -> CheckpointConfig:
    """`config` with every path key absolute (`..` resolved); gs://, s3:// URLs stay as they are."""
    changes = {k: os.fspath(normalize(getattr(config, k))) for k in _PATH_KEYS if getattr(config, k)}
    changes = {k: v for k, v in changes.items() if v != getattr(config, k)}
    return dataclasses.replace(config, **changes) if changes else config


def _positive_int(name: str, value: Any, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        wanted = "a positive integer" + (" or None" if allow_none else "")
        raise ConfigError(f"CheckpointManager {name}: expected {wanted}, got {value!r}")


def _has_abstract_leaves(tree: Any) -> bool:
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(tree))


class CheckpointManager:
    """Save, prune and restore one run's train state, MaxText-style.

    Everything comes from `config` (a :class:`~maxckpt.CheckpointConfig`, from
    :func:`~maxckpt.load_config`): storage options, load paths, items to exclude,
    two-tier, `enable_checkpointing`, and the cadence and retention below. The
    keywords are explicit overrides of it: `period` of `checkpoint_period`,
    `max_to_keep` of `max_num_checkpoints_to_keep`, `keep_period` of
    `maxckpt_keep_period`, `async_save` of `async_checkpointing`; one left out
    (None) takes the config's value, so no config key is silently ignored, and
    `self.config` holds what the manager runs with. (To keep all where the config
    keeps N, pass `config.with_overrides(max_num_checkpoints_to_keep=None)`.)
    Without a config the defaults are CheckpointConfig's, but `period` is 1.
    :meth:`from_config` also takes the directory from the config.

    A relative `directory` is made absolute once, here. Starting takes the
    run directory's lock (:class:`~maxckpt.errors.RunDirBusyError` when
    another manager holds it) and fails with
    :class:`~maxckpt.errors.CheckpointSaveError` when it cannot be written; a
    save that fails later raises CheckpointSaveError from that `save` or the
    next `save`/`wait`/`close`, and never leaves the process hanging at exit.

    `model_config` (opt-in) names the MaxText model the run trains: a MaxText config path, a mapping of
    MaxText keys (`{"model_name": "gpt-oss-20b", "num_experts_per_tok": 2}`) or a
    :func:`~maxckpt.config.maxtext_run.resolve_run_config` result. Process 0 records its resolved keys as
    `<run>/maxckpt_run_config.yml` before the first save, so `maxckpt convert` of the run needs no
    `--model` or `--set`. (An overlay's `model_name` alone is not taken as this: it only labels exports.)

    >>> mgr = CheckpointManager("/tmp/run/checkpoints", period=100, max_to_keep=3)   # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | os.PathLike | None,
        *,
        period: int | None = None,
        max_to_keep: int | None = None,
        keep_period: int | None = None,
        async_save: bool | None = None,
        config: CheckpointConfig | None = None,
        model_config: str | os.PathLike | Mapping[str, Any] | RunConfig | None = None,
    ) -> None:
        if config is not None and not isinstance(config, CheckpointConfig):
            raise ConfigError(
                "CheckpointManager config: expected a maxckpt.CheckpointConfig (from load_config), got "
                f"{type(config).__name__}"
            )
        if period is not None:  # None takes the config's checkpoint_period; the message says what may be passed
            _positive_int("period", period, allow_none=False)
        _positive_int("max_to_keep", max_to_keep, allow_none=True)
        _positive_int("keep_period", keep_period, allow_none=True)
        if async_save is not None and not isinstance(async_save, bool):
            raise ConfigError(f"CheckpointManager async_save: expected True or False, got {async_save!r}")
        if config is None:  # a bare manager saves every step unless told otherwise
            config = CheckpointConfig(checkpoint_period=1)
        overrides = {"checkpoint_period": period, "max_num_checkpoints_to_keep": max_to_keep,
                     "maxckpt_keep_period": keep_period, "async_checkpointing": async_save}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:  # the keywords win over the config, and the manager's config says what it runs with
            sources = {**config.sources, **{k: "CheckpointManager keyword" for k in overrides}}
            config = dataclasses.replace(config, **overrides, sources=sources)
        self.config = _normalized_paths(config)
        cfg = self.config
        self.period = cfg.checkpoint_period
        self.policy = RetentionPolicy(keep=cfg.max_num_checkpoints_to_keep, keep_period=cfg.maxckpt_keep_period)
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise ConfigError(f"CheckpointManager directory: expected a path, got {type(directory).__name__}")
        self.directory = epath.Path(os.fspath(normalize(directory))) if directory else None
        self.restored_step: int | None = None
        # Filled by the final save: format -> ConversionReport of each export it ran.
        self.export_reports: dict[str, Any] = {}
        self._storage = StorageOptions(
            use_ocdbt=cfg.checkpoint_storage_use_ocdbt,
            use_zarr3=cfg.checkpoint_storage_use_zarr3,
            target_data_file_size=cfg.checkpoint_storage_target_data_file_size_bytes,
            concurrent_gb=cfg.checkpoint_storage_concurrent_gb,
            compression=cfg.maxckpt_storage_compression,
        )
        self._tiers: list[StorageTier] = []
        # Resolved before anything starts: a model_config that names an unknown model is the caller's error.
        run_model = resolve_model_config(model_config) if model_config is not None else None
        if not cfg.enable_checkpointing:
            logger.info("maxckpt: enable_checkpointing is false: saves are no-ops and the run directory is not read")
            return
        if self.directory is None:
            raise ConfigError(
                "no checkpoint directory: pass one, or set base_output_directory (and run_name) in the config"
            )
        specs = two_tier.tier_specs(
            os.fspath(self.directory),
            period=self.period,
            policy=self.policy,
            local_dir=cfg.local_checkpoint_directory if cfg.enable_emergency_checkpoint else None,
            local_period=cfg.local_checkpoint_period,
        )
        for spec in specs:  # a tier that fails to start (unwritable, locked) closes the ones before it
            try:
                self._tiers.append(StorageTier(spec, async_save=cfg.async_checkpointing, storage=self._storage))
            except BaseException:
                self.close()
                raise
        if run_model is not None and jax.process_index() == 0:
            self._record_model(run_model)

    def _record_model(self, run_model: RunConfig) -> None:
        """Write the run's model record (whole or not at all); a run that cannot write it still trains."""
        where = record_dir(os.fspath(self.directory))
        try:
            path = write_record(where, run_model)
        except (OSError, MaxckptError) as err:
            logger.warning("maxckpt: could not record the run's model settings in %s: %s", where, err)
            return
        logger.info("maxckpt: recorded the run's model settings in %s", path)

    @classmethod
    def from_config(
        cls,
        config: CheckpointConfig,
        *,
        model_config: str | os.PathLike | Mapping[str, Any] | RunConfig | None = None,
    ) -> "CheckpointManager":
        """A manager configured by a MaxText overlay (see `docs/manager.md` for the keys it honours).

        The same as `CheckpointManager(config.checkpoint_dir, config=config)`: the directory is
        `<base_output_directory>/<run_name>/checkpoints/`.

        >>> mgr = CheckpointManager.from_config(load_config("overlay.yml", "checkpoint_period=5"))   # doctest: +SKIP
        """
        return cls(config.checkpoint_dir, config=config, model_config=model_config)

    # --- saving -------------------------------------------------------------------------------

    def save(self, step: int, state: Any, *, force: bool = False, final: bool = False) -> bool:
        """Save `state` as `step` when the period says so; True when a save started.

        `force=True` saves whatever the period. `final=True` marks the end of
        training: it saves unless `save_checkpoint_on_completion` is false,
        waits until the checkpoint is committed, then exports it to the
        formats in `maxckpt_export_on_completion` (see :mod:`maxckpt.manager.export`;
        a failed export raises ConversionError, the checkpoint stays committed). With async saving the
        call returns once the arrays are copied off the devices; deletion of
        old checkpoints happens in the background after the new one commits.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ConfigError(f"save step: expected a non-negative integer, got {step!r}")
        step = int(step)
        if not self._tiers:
            return False
        if final and not self.config.save_checkpoint_on_completion:
            return False
        items = state
        if self.config.maxckpt_skip_optimizer_state:
            items = {k: v for k, v in top_items(state).items() if k != OPT_STATE}
        metadata = {"scan_layers": self.config.scan_layers}
        started = False
        for tier in two_tier.saving_tiers(self._tiers, step, force=force or final):
            started = tier.save(step, items, metadata) or started
        if final:
            self.wait()
            self.export_reports = export.export_on_completion(self.config, os.fspath(self.directory), step)
        return started

    def wait(self) -> None:
        """Block until every save in flight is committed and retention has run."""
        for tier in self._tiers:
            tier.wait()

    def close(self) -> None:
        """Wait for saves and deletions, then release Orbax's threads."""
        tiers, self._tiers = self._tiers, []
        errors = []
        for tier in tiers:
            try:
                tier.close()
            except Exception as err:  # noqa: BLE001 - close every tier, then report
                errors.append(err)
        if errors:
            raise errors[0]

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the with body failed: that error is the one to see; a failed close is logged with it
            self.close()
        except MaxckptError as err:
            logger.error(
                "maxckpt: while leaving the with block after %s: %s", getattr(exc_type, "__name__", exc_type), err
            )

    # --- what is on disk -------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Committed steps on disk (all tiers), oldest first; saves in flight are not listed."""
        return two_tier.committed_steps(self._tiers)

    def latest_step(self) -> int | None:
        """The newest committed step, the one :meth:`restore` resumes from; None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # --- restoring -------------------------------------------------------------------------------

    def restore(self, target: Any = None, *, step: int | None = None) -> Any:
        """Resume: the state to continue from, or None when there is nothing to resume.

        In MaxText's order: this run's newest committed step (or `step`, or
        the config's `maxckpt_load_step`; a chosen step that is missing is an
        error), else `load_full_state_path`, else `load_parameters_path`
        (params only: the result is `target` with its `params` replaced, so
        pass a concrete, freshly initialised target). Items named in
        `maxckpt_exclude_from_loading` keep the target's values.

        `target` gives structure, dtypes and shardings (restoring onto another
        mesh or device count works when it carries shardings); without one,
        arrays come back as saved, on the first local device.
        """
        self.restored_step = None
        wanted = step if step is not None else self.config.maxckpt_load_step
        if self._tiers:
            found = two_tier.newest_committed(self._tiers, wanted)
            if found is None and wanted is not None:
                dirs = ", ".join(os.fspath(t.directory) for t in self._tiers)
                partial = [e for t in self._tiers for e in t.scan().steps if e.step == wanted]
                why = f" ({partial[-1].name} exists but is not committed: {partial[-1].why})" if partial else ""
                raise CheckpointNotFoundError(
                    f"step {wanted} has no committed checkpoint in {dirs}{why}; committed steps: "
                    f"{self.all_steps() or 'none'}"
                )
            if found is not None:
                tier, entry = found
                logger.info("maxckpt: restoring step %d from the %s tier (%s)", entry.step, tier.name, entry.path)
                try:
                    state = self._restore_state(entry.path, target)
                except CorruptCheckpointError as err:  # committed, then damaged: name the step and the alternatives
                    others = [s for s in self.all_steps() if s != entry.step]
                    raise CorruptCheckpointError(
                        f"step {entry.step} ({tier.name} tier) cannot be restored: {err}; "
                        f"other committed steps: {others or 'none'} (restore(step=N) picks one)"
                    ) from None
                self.restored_step = entry.step
                return state
        if self.config.load_full_state_path:
            return self._restore_state(epath.Path(self.config.load_full_state_path), target)
        if self.config.load_parameters_path:
            return self._restore_params_only(self.config.load_parameters_path, target)
        return None

    def load_params(self, path: str | os.PathLike, target: Any) -> Any:
        """Params of the checkpoint at `path` onto `target` (see :func:`maxckpt.manager.pytree_io.load_params`)."""
        return pytree_io.load_params(
            os.fspath(normalize(path)),
            target,
            concurrent_gb=self._storage.concurrent_gb,
            single_replica=self.config.enable_single_replica_ckpt_restoring,
        )

    def _restore_params_only(self, path: str, target: Any) -> Any:
        if target is None or "params" not in top_items(target):
            raise ConfigError(
                f"load_parameters_path={path} loads params only: pass restore(target=...) a freshly "
                "initialised train state with a `params` item"
            )
        items = top_items(target)
        others = {k: v for k, v in items.items() if k != "params"}
        if _has_abstract_leaves(others):
            raise ConfigError(
                f"load_parameters_path={path} loads params only, so the optimizer state and step come from "
                "the target, which is abstract (jax.ShapeDtypeStruct): pass a concrete, freshly initialised state"
            )
        logger.info("maxckpt: loading params from %s (fresh optimizer state and step)", path)
        return replace_items(target, {"params": self.load_params(path, items["params"])})

    def _restore_state(self, path: epath.Path, target: Any) -> Any:
        items_dir = pytree_io.resolve_items_dir(path)
        metadata = pytree_io.read_metadata(items_dir)  # once: the target, the item check and the restore use it
        if target is None:
            target = _abstract_from_metadata(metadata)
        items = top_items(target)
        stored = pytree_io.stored_items(items_dir, metadata)
        exclude = set(self.config.maxckpt_exclude_from_loading)
        wanted = {k: v for k, v in items.items() if k not in exclude}
        absent = sorted(k for k in wanted if k not in stored)
        if [k for k in absent if k != OPT_STATE]:
            raise ShapeMismatchError(
                f"{items_dir} has no item(s) {', '.join(absent)} that the target has; it holds "
                f"{', '.join(sorted(stored))}. Exclude them with maxckpt_exclude_from_loading or fix the target"
            )
        if absent:
            logger.warning(
                "maxckpt: %s was saved without opt_state (maxckpt_skip_optimizer_state); "
                "the optimizer state is the target's", items_dir,
            )
            wanted.pop(OPT_STATE)
        kept = {k: v for k, v in items.items() if k not in wanted}
        if _has_abstract_leaves(kept):
            logger.warning(
                "maxckpt: item(s) %s were not restored and the target's are abstract: initialise them before training",
                ", ".join(sorted(kept)),
            )
        try:
            restored = pytree_io.restore_tree(
                items_dir,
                wanted,
                concurrent_gb=self._storage.concurrent_gb,
                single_replica=self.config.enable_single_replica_ckpt_restoring,
                metadata=metadata,
            )
        except ShapeMismatchError as err:
            saved_scan = pytree_io.step_custom_metadata(items_dir.parent).get("scan_layers")
            if saved_scan is not None and saved_scan != self.config.scan_layers:
                raise ShapeMismatchError(
                    f"{err} (the checkpoint was saved with scan_layers={saved_scan}, the config says "
                    f"scan_layers={self.config.scan_layers})"
                ) from None
            raise
        return replace_items(target, restored)

    def __repr__(self) -> str:
        tiers = ", ".join(f"{t.name}={os.fspath(t.directory)}" for t in self._tiers) or "disabled"
        return f"CheckpointManager({tiers}, period={self.period}, policy={self.policy})"
