"""JAX's coordination service in a child of process 0, so that process 0's death is not every process's abort.

Why: `jax.distributed.initialize` runs the coordination service (its key-value
store, heartbeats) inside process 0. When process 0 dies, so does the service,
and every other process's JAX client, polling it, terminates its process from a
C++ thread (`std::bad_cast` or JAX's fatal log: SIGABRT, no error line, nothing
cleaned up). Run in a child that outlives process 0 for a while, the service
keeps answering: the others see process 0's heartbeat stop, as they see any
other process's, stop with one maxckpt error and remove what it left.

The child serves until process 0 asks it to stop (its `shutdown()`, from
`jax.distributed.shutdown`), or, once process 0 is gone (its end of the pipe
closes), for `linger` seconds more: long enough for the others to notice and
clean up, bounded so nothing is left running.

    python -m maxckpt.compat.jax_service   (reads one JSON line of settings, then waits on stdin)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from maxckpt.compat.versions import written_for

READY = "ready"
_STOP = "stop\n"


class ChildService:
    """The handle JAX keeps as its `service`: `shutdown()` stops the child (bounded)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def shutdown(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write(_STOP)
            proc.stdin.flush()
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def start(address: str, num_nodes: int, *, linger: float, **settings: Any) -> ChildService:
    """Start the service in a child process; returns once it listens (or raises RuntimeError saying why not)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "maxckpt.compat.jax_service"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": path},
        start_new_session=True,  # a Ctrl-C to the job reaches process 0, which stops it; a kill of process 0 does not
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"address": address, "num_nodes": num_nodes, "linger": linger, **settings}) + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip()
    if answer != READY:
        proc.kill()
        proc.wait(timeout=5)
        raise RuntimeError(f"the coordination service could not start at {address}: {answer or 'it exited'}")
    return ChildService(proc)


@contextlib.contextmanager
def service_in_child(linger: float) -> Iterator[None]:
    """Within this block, `jax.distributed.initialize` on process 0 starts its service in a child (:func:`start`)."""
    from jax._src import distributed as jd

    written_for("jax")
    make_service = jd._jax.get_distributed_runtime_service

    def in_child(address: str, num_nodes: int, **settings: Any) -> ChildService:
        return start(address, num_nodes, linger=linger, **settings)

    jd._jax.get_distributed_runtime_service = functools.wraps(make_service)(in_child)
    try:
        yield
    finally:
        jd._jax.get_distributed_runtime_service = make_service


def _serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # process 0 decides when the service stops
    settings = json.loads(sys.stdin.readline())
    linger = float(settings.pop("linger"))
    try:
        from jaxlib import _jax

        service = _jax.get_distributed_runtime_service(settings.pop("address"), settings.pop("num_nodes"), **settings)
    except Exception as err:  # noqa: BLE001 - said to process 0, which raises it
        print(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, flush=True)
        return
    print(READY, flush=True)
    stopped = threading.Event()

    def wait_for_parent() -> None:
        if sys.stdin.readline() == _STOP:
            stopped.set()

    waiter = threading.Thread(target=wait_for_parent, daemon=True)
    waiter.start()
    waiter.join()
    if not stopped.is_set():  # process 0 is gone: the others still need the service to stop cleanly
        stopped.wait(linger)
    service.shutdown()


if __name__ == "__main__":
    _serve()
