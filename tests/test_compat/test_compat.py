"""maxckpt.compat: every dependency patch behind one version gate, each listed in the package's table."""

from __future__ import annotations

import logging
import os
import pkgutil

import pytest

import maxckpt.compat
from maxckpt.compat import orbax_aligned_reads, orbax_mapped_reads, orbax_threads, versions

# Modules of maxckpt.compat that patch nothing themselves (the gate, the shared mechanism, a TensorStore setting).
NOT_PATCHES = {"versions", "shared_patch", "tensorstore"}


def test_every_patch_module_is_in_the_table_of_the_package_docstring():
    modules = {m.name for m in pkgutil.iter_modules(maxckpt.compat.__path__)} - NOT_PATCHES
    patches = {"orbax_s3", "orbax_mapped_reads", "orbax_aligned_reads", "orbax_threads", "maxtext", "jax_distributed",
               "jax_service"}
    assert modules == patches
    rows = [line.split()[0] for line in maxckpt.compat.__doc__.splitlines() if line[:1].isalpha()]
    assert modules <= set(rows), modules - set(rows)


def test_the_gate_covers_the_ranges_pyproject_pins():
    assert versions.WRITTEN_FOR["orbax-checkpoint"] == ("0.12", "0.13")
    assert versions.in_range("0.12.8", "0.12", "0.13") and versions.in_range("0.12.0rc1", "0.12", "0.13")
    assert not versions.in_range("0.13.0", "0.12", "0.13") and not versions.in_range("0.11.9", "0.12", "0.13")
    assert versions.in_range("0.11.1", "0.6", None)
    assert versions.written_for("orbax-checkpoint") and versions.written_for("jax")  # the installed ones


@pytest.fixture
def other_orbax(monkeypatch):
    """An Orbax release the patches were not written for (the gate's answer is computed once, so reset around)."""
    versions.written_for.cache_clear()
    monkeypatch.setattr(versions, "installed_version", lambda name: "0.13.0" if name == "orbax-checkpoint" else "1.0")
    yield
    versions.written_for.cache_clear()


def test_another_orbax_release_is_warned_about_once_and_the_optimisations_stand_aside(other_orbax, tmp_path, caplog):
    from orbax.checkpoint._src.serialization import serialization, tensorstore_utils

    original_context, original_read = tensorstore_utils.get_ts_context, serialization._read_shard
    (tmp_path / "_METADATA").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="maxckpt.compat"):
        with orbax_mapped_reads.mapped_reads(4) as mapped, orbax_aligned_reads.aligned_host_buffers() as aligned:
            assert tensorstore_utils.get_ts_context is original_context and serialization._read_shard is original_read
        assert orbax_threads.release_stuck_threads(["some-operation"]) == 0
    assert (mapped, aligned) == (False, False)
    warnings = [r.getMessage() for r in caplog.records if r.name == "maxckpt.compat"]
    assert warnings == [
        (
            "maxckpt: its patches of orbax-checkpoint were written for orbax-checkpoint>=0.12,<0.13 "
            "and this is 0.13.0; see maxckpt.compat for what that changes"
        )
    ]


def test_the_coordination_service_runs_in_a_child_that_stops_when_asked_and_outlives_its_parent():
    """maxckpt.compat.jax_service: a client connects to the child's service; `shutdown()` ends the child at once,
    and a child whose parent died serves on for its linger time only."""
    import socket
    import subprocess
    import sys
    import time

    from jaxlib import _jax

    from maxckpt.compat import jax_service

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = jax_service.start(f"[::]:{port}", 1, linger=1.0, heartbeat_timeout=5)
    client = _jax.get_distributed_runtime_client(f"127.0.0.1:{port}", 0, init_timeout=10)
    client.connect()
    client.key_value_set("k", "v")
    assert client.blocking_key_value_get("k", 1000) == "v"
    client.shutdown()
    proc = service.proc
    started = time.monotonic()
    service.shutdown()
    assert proc.poll() == 0 and time.monotonic() - started < 10
    with pytest.raises(RuntimeError, match="could not start"):
        jax_service.start("not an address", 1, linger=1.0)
    # A parent that dies: its child (the service) ends by itself once the linger time is over.
    script = (f"from maxckpt.compat import jax_service; s = jax_service.start('[::]:{port}', 1, linger=1.0); "
              "print(s.proc.pid, flush=True)")
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, 9)
        pytest.fail("the service child outlived its linger time")
