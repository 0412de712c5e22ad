"""Two-tier checkpointing: frequent saves to fast local storage, periodic ones to persistent storage.

MaxText's `enable_emergency_checkpoint` uses Orbax's emergency
`CheckpointManager`. On a single slice (one host, or one replica of the
model) Orbax 0.12.8's emergency manager drops the local directory and only
writes persistent checkpoints, so it does not give a single host the fast
tier; it also names its item `state`, not `items`. maxckpt therefore runs two
ordinary tiers: a `local` one every `local_checkpoint_period` steps keeping
the newest :data:`LOCAL_KEEP`, and the `persistent` one every
`checkpoint_period` steps with the run's retention. Restore takes the newest
committed step of either (the local copy on a tie, as it reads faster).

With several JAX processes the local directory must be one every process can
read (each process writes only its own shards); for per-host local disks
across slices use Orbax's emergency manager directly.
"""

from __future__ import annotations

from typing import Sequence

from maxckpt.errors import ConfigError
from maxckpt.manager.retention import RetentionPolicy
from maxckpt.storage.run_dirs import StepEntry
from maxckpt.manager.tier import StorageTier, TierSpec

# The local tier only serves restarts: the newest committed copy plus the one before it
# (in case the newest turns out unreadable) are enough.
LOCAL_KEEP = 2


def tier_specs(
    persistent_dir: str,
    *,
    period: int,
    policy: RetentionPolicy,
    local_dir: str | None = None,
    local_period: int = 0,
) -> list[TierSpec]:
    """The tiers of a run, fastest first."""
    specs = [TierSpec("persistent", persistent_dir, period, policy)]
    if local_dir and local_dir.rstrip("/") == persistent_dir.rstrip("/"):
        raise ConfigError(
            f"local_checkpoint_directory is the checkpoint directory itself ({persistent_dir}): the two tiers "
            "would prune each other's steps; point it at separate (fast, local) storage"
        )
    if local_dir:
        specs.insert(0, TierSpec("local", local_dir, local_period, RetentionPolicy(keep=LOCAL_KEEP)))
    return specs


def saving_tiers(tiers: Sequence[StorageTier], step: int, *, force: bool) -> list[StorageTier]:
    """The tiers that save `step`: those it is due on, or (forced) the persistent one."""
    if force:
        return [t for t in tiers if t.name == "persistent"]
    return [t for t in tiers if t.due(step)]


def newest_committed(tiers: Sequence[StorageTier], step: int | None = None) -> tuple[StorageTier, StepEntry] | None:
    """The tier and entry to restore: `step` if given, else the newest committed of any tier."""
    best: tuple[StorageTier, StepEntry] | None = None
    for tier in tiers:  # fastest first, so a tie keeps the faster copy
        for entry in tier.committed():
            if step is not None and entry.step != step:
                continue
            if best is None or entry.step > best[1].step:
                best = (tier, entry)
    return best


def committed_steps(tiers: Sequence[StorageTier]) -> list[int]:
    """Committed steps of all tiers, sorted, each once."""
    return sorted({entry.step for tier in tiers for entry in tier.committed()})
