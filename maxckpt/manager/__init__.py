"""Saving, retention and resuming for training runs (see docs/manager.md).

- :mod:`~maxckpt.manager.checkpoint_manager`: the :class:`CheckpointManager` a training loop uses;
- :mod:`~maxckpt.manager.retention`: the keep/remove policy and crash-safe deletion, for any run directory;
- :mod:`~maxckpt.manager.tier`: one directory that Orbax writes and maxckpt's retention prunes;
- :mod:`~maxckpt.manager.two_tier`: fast local saves plus periodic persistent ones;
- :mod:`~maxckpt.manager.pytree_io`: restoring an Orbax PyTree (full state, items, params-only);
- :mod:`~maxckpt.manager.export`: exporting the final checkpoint to the PyTorch formats;
- :mod:`~maxckpt.manager.run_lock`: one writer per run directory (`.maxckpt.lock`);
- :mod:`~maxckpt.manager.mapped_reads`: which restores read local files through mmap.

The patches of Orbax the manager relies on (s3://, mapped and aligned reads, stuck save threads) are in
:mod:`maxckpt.compat`.

Import the submodules directly; this package file stays light so the CLI's
`prune` does not pull in JAX.
"""
