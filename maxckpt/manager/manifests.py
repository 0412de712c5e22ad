"""Integrity manifests of the manager's saves (see :mod:`maxckpt.integrity` for the format).

Each save hashes the host bytes of the arrays it saves, under the names
:class:`~maxckpt.containers.orbax.OrbaxReader` lists them ('/'-joined keys,
NNX `{"value": x}` wrappers dropped), on a background thread started once
Orbax's `save` returns: an async save does not wait for it (the thread runs
while Orbax writes in the background); a synchronous one waits for it after
Orbax's save (hashing beside Orbax's own Python work only slowed both: the
CRC holds the GIL). The manifest goes into the step dir
(`<run>/checkpoints/<step>/maxckpt-manifest.json`, beside `items/`, which
Orbax and MaxText ignore) once the step is committed: Orbax writes the step
in a temporary folder it renames (or marks) on commit and offers no hook
before that, so the manifest follows the commit - at the next `save`,
`wait` or `close`, or right away for a synchronous save. A crash between
the commit and the manifest leaves a committed step without one, which
`maxckpt verify STEP --integrity` reports as "no manifest".

Not hashed (the step then has no manifest, logged at INFO): arrays not
fully addressable by this process (a multi-process job's sharded state;
only process 0 writes manifests), and arrays deleted before the hashing
thread reached them (donated to the next training step on an accelerator:
hold them until `save` returns, or save synchronously).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from maxckpt import integrity
from maxckpt.containers.orbax import unwrap_nnx_values
from maxckpt.manager.pytree_io import flatten

logger = logging.getLogger("maxckpt.manager")


def _leaves(state: Any) -> dict[str, Any] | None:
    flat = {
        k: v
        for k, v in flatten(state).items()
        if isinstance(v, (np.ndarray, np.generic, int, float)) or hasattr(v, "shape")
    }
    for leaf in flat.values():
        if not getattr(leaf, "is_fully_addressable", True):
            return None
    names = unwrap_nnx_values(flat)
    return {"/".join(logical): flat[stored] for logical, stored in names.items()}


class ManifestJob:
    """Hashes one save's arrays on a background thread; :meth:`write` puts the manifest into the step dir."""

    def __init__(self, step: int, state: Any) -> None:
        self.step = step
        self.manifest: integrity.Manifest | None = integrity.Manifest()
        self.skipped = ""
        leaves = _leaves(state)
        if leaves is None:
            self.manifest, self.skipped = None, "its arrays are not fully addressable by this process"
            self._thread = None
            return
        self._thread = threading.Thread(target=self._hash, args=(leaves,), name=f"maxckpt-manifest-{step}", daemon=True)

    def start(self) -> "ManifestJob":
        if self._thread is not None and not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()
        return self

    def _hash(self, leaves: dict[str, Any]) -> None:
        try:
            for name, leaf in leaves.items():
                self.manifest.add(name, np.asarray(leaf))  # type: ignore[union-attr]
        except Exception as err:  # noqa: BLE001 - a deleted (donated) array: no manifest, never a failed save
            self.manifest, self.skipped = None, f"{type(err).__name__}: {err}"

    def write(self, step_dir: Any) -> None:
        """Wait for the hashes, then write the manifest into the committed `step_dir` (if it is still there)."""
        from maxckpt.storage import objects

        if self._thread is not None:
            self.start()._thread.join()
        if self.manifest is None:
            logger.info("maxckpt: step %d gets no integrity manifest: %s", self.step, self.skipped)
            return
        try:
            if not objects.exists(step_dir):
                return  # retention removed it already
            # Whole or not at all: a crash mid-write leaves no manifest, never a truncated one.
            objects.write_whole(f"{step_dir}/{integrity.MANIFEST_NAME}", self.manifest.to_json())
        except Exception as err:  # noqa: BLE001 - the checkpoint is committed; a missing manifest is reported by verify
            logger.warning("maxckpt: could not write the integrity manifest of step %d: %s", self.step, err)
