"""What maxckpt's scale-out needs of JAX's distributed runtime that JAX has no public name for.

Why: a conversion over `jax.distributed` uses only its coordination service (key-value store, liveness), and
must fail with one readable error instead of JAX's abort. JAX exposes `jax.distributed.initialize`, `shutdown`
and `is_initialized`, but not the client, the agent's join failure or a way to drop a dead client; those are
reached here, in `jax._src.distributed`, and nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from maxckpt.compat.versions import written_for


def runtime_state() -> Any:
    """JAX's distributed state: `client` (its key-value store), `service`, `process_id`, `num_processes`, ...

    Read for the coordination service's client, which JAX has no public name for.
    """
    from jax._src import distributed as jd

    return jd.global_state


def _missed_heartbeat(*_: Any) -> None:
    """Given to JAX's client so that a failed join raises in `connect()` instead of aborting."""


@contextlib.contextmanager
def failed_joins_raise() -> Iterator[None]:
    """Within this block a failing `jax.distributed.initialize` raises instead of terminating the process.

    JAX's client, when joining fails (a peer never starts, an id process 0
    does not expect), calls its missed-heartbeat callback, whose default
    terminates the process (SIGABRT, a C++ stack, no error line). With a
    callback given, `connect()` raises instead; the reason is the agent's
    status, which its `shutdown()` reports.
    """
    from jax._src import distributed as jd

    written_for("jax")
    make_client = jd._jax.get_distributed_runtime_client
    jd._jax.get_distributed_runtime_client = functools.partial(make_client, missed_heartbeat_callback=_missed_heartbeat)
    try:
        yield
    finally:
        jd._jax.get_distributed_runtime_client = make_client


def forget_runtime() -> None:
    """Drop JAX's client, service and preemption manager after a failed join or shutdown, so atexit does not retry."""
    state = runtime_state()
    state.preemption_sync_manager = state.client = state.service = None
