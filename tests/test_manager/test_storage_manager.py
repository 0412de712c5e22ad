"""The manager on gs:// and s3:// (real fake-gcs-server and moto servers).

Saves, retention with keep_period, restore bit for bit, and SIGKILL during a
save and during a deletion: after a restart nothing has leaked (no deletion
record, no partial step, no object of a removed step) and the newest committed
step restores exactly.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from maxckpt import CheckpointManager
from maxckpt.manager import pytree_io
from maxckpt.storage import objects
from maxckpt.storage.run_dirs import scan_run_dir
from maxckpt.storage.urls import as_path
from manager_states import assert_same, make_state
from test_crash_safety import KEEP, KEEP_PERIOD, Child


def _entries(url: str) -> list[str]:
    return objects.list_names(url)


def _settle(url: str) -> None:
    """Wait until requests a killed process had already sent have landed (the listing stops changing).

    A server finishes an upload whose body arrived before the client died, so
    objects can still appear shortly after a SIGKILL: a real store does the same.
    """
    before = objects.find_files(url)
    for _ in range(50):
        time.sleep(0.3)
        now = objects.find_files(url)
        if now == before:
            return
        before = now


def _check_run(url: str) -> list[int]:
    """Invariants on a bucket run dir after any crash; returns the committed steps."""
    _settle(url)
    run = scan_run_dir(url, "orbax")
    committed = [s.step for s in run.committed]
    if url.startswith("gs://"):
        # Plain Orbax (what MaxText resumes with) sees exactly the committed steps.
        plain = ocp.CheckpointManager(as_path(url), options=ocp.CheckpointManagerOptions(read_only=True))
        assert plain.all_steps() == committed, (plain.all_steps(), committed, _entries(url))
    if committed:
        restored = pytree_io.restore_tree(as_path(url) / str(committed[-1]) / "items", make_state(0))
        assert_same(restored, make_state(committed[-1]))
    return committed


def _assert_clean(url: str) -> None:
    names = _entries(url)
    assert all(n.isdigit() for n in names), f"leftovers in {url}: {names}"
    for name in names:
        assert objects.exists(f"{url}/{name}/commit_success.txt"), f"{url}/{name} is not committed"


def test_lifecycle_async_saves_retention_restore(bucket_url: str) -> None:
    url = f"{bucket_url}/run/checkpoints"
    with CheckpointManager(url, period=1, max_to_keep=2, keep_period=5, async_save=True) as mgr:
        assert mgr.restore(make_state(0)) is None
        for step in range(12):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert mgr.all_steps() == [0, 5, 10, 11]
    _assert_clean(url)
    assert _entries(url) == ["0", "10", "11", "5"]
    # No object of a removed step is left behind (an object store has no folders to hide them).
    assert not objects.find_files(f"{url}/3")
    with CheckpointManager(url, period=1, max_to_keep=2, keep_period=5) as mgr:
        state = mgr.restore(make_state(0))
        assert mgr.restored_step == 11
        assert_same(state, make_state(11))
        restored = mgr.restore(make_state(0), step=5)
        assert_same(restored, make_state(5))
    assert _check_run(url) == [0, 5, 10, 11]


def test_partial_step_on_bucket_is_cleaned_at_start(bucket_url: str) -> None:
    url = f"{bucket_url}/ckpt"
    with CheckpointManager(url, period=1, max_to_keep=2, async_save=False) as mgr:
        for step in range(2):
            mgr.save(step, make_state(step))
    # A save that died before its commit marker: the data is there, commit_success.txt is not.
    objects.delete_files([f"{url}/1/commit_success.txt"])
    assert [(s.step, s.state) for s in scan_run_dir(url, "orbax").steps] == [(0, "committed"), (1, "partial")]
    with CheckpointManager(url, period=1, max_to_keep=2, async_save=False) as mgr:
        state = mgr.restore(make_state(0))
        assert mgr.restored_step == 0
        assert_same(state, make_state(0))
        assert not objects.find_files(f"{url}/1"), "the partial step was not removed at start-up"
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    assert _check_run(url) == [1, 2]
    _assert_clean(url)


def test_recorded_deletion_is_finished_by_the_next_pass(bucket_url: str) -> None:
    from maxckpt.storage import deletion

    url = f"{bucket_url}/ckpt"
    with CheckpointManager(url, period=1, async_save=False) as mgr:
        for step in range(3):
            mgr.save(step, make_state(step))
    deletion.record_intent(f"{url}/0")  # a process died right after recording the intent
    run = scan_run_dir(url, "orbax")
    assert [(s.step, s.state) for s in run.steps] == [(0, "deleting"), (1, "committed"), (2, "committed")]
    assert run.latest.step == 2
    with CheckpointManager(url, period=1, max_to_keep=5, async_save=False) as mgr:
        assert mgr.all_steps() == [1, 2]
    assert _entries(url) == ["1", "2"]
    assert not objects.find_files(f"{url}/0")


def _finish(url: str, log: Path, ever: set[int]) -> None:
    latest = _check_run(url)
    resume = latest[-1] if latest else None
    until = (resume if resume is not None else -1) + 1 + 6
    child = Child(url, "async", until, log)
    assert child.expect("RESUMED" if resume is not None else "FRESH") == (f"RESUMED {resume}" if resume is not None else "FRESH")
    child.expect("DONE")
    assert child.proc.wait(timeout=120) == 0
    final = _check_run(url)
    _assert_clean(url)
    assert final[-KEEP:] == [until - 2, until - 1]
    assert all(s % KEEP_PERIOD == 0 for s in final[:-KEEP]), final
    assert {s for s in ever if s % KEEP_PERIOD == 0} <= set(final)


@pytest.mark.slow
def test_sigkill_during_saves_on_bucket(bucket_url: str, tmp_path: Path) -> None:
    url, log = f"{bucket_url}/run/checkpoints", tmp_path / "child.log"
    rng = random.Random(3)
    ever: set[int] = set()
    for _ in range(2):
        child = Child(url, "async", 10_000, log)
        child.expect("SAVED")
        time.sleep(rng.uniform(0.0, 1.0))
        child.kill()
        ever |= set(_check_run(url))
    _finish(url, log, ever)


@pytest.mark.slow
def test_sigkill_during_a_deletion_on_bucket(bucket_url: str, tmp_path: Path) -> None:
    url, log = f"{bucket_url}/run/checkpoints", tmp_path / "child.log"
    child = Child(url, "async", 10_000, log, "--stall-deleting")
    doomed = child.expect("DELETING").split(" ", 1)[1]
    child.kill()  # retention dies with a step half deleted
    name = doomed.rstrip("/").rsplit("/", 1)[1]
    assert objects.exists(f"{url}/{name}.maxckpt-deleting"), "the deletion intent was not recorded"
    assert objects.find_files(doomed) and not objects.exists(f"{doomed}/commit_success.txt")
    states = {s.name: s.state for s in scan_run_dir(url, "orbax").steps}
    assert states[name] == "deleting"
    committed = _check_run(url)
    assert int(name) not in committed
    _finish(url, log, set(committed))
    assert not objects.find_files(doomed) and not objects.exists(f"{url}/{name}.maxckpt-deleting")


def test_tpu_v5e_gcs_preset_end_to_end(object_stores) -> None:
    """configs/tpu_v5e_gcs.yml with its bucket pointed at the emulator: save, prune, resume, export to GCS."""
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    import optax

    from conversion_models import nest, random_maxtext_params, tiny_spec
    from maxckpt import load_config
    from maxckpt.config.loader import bundled_configs_dir
    from maxckpt.conversion import open_checkpoint

    store = object_stores["gs"]
    bucket = store.new_bucket()

    def state(step: int):
        params = random_maxtext_params(tiny_spec("llama2"), seed=step)
        tree = {"params": nest({k: jnp.asarray(v) for k, v in params.items()})}
        return {"params": tree, "opt_state": optax.adam(1e-3).init(tree), "step": jnp.asarray(step + 1, jnp.int32)}

    cfg = load_config(
        bundled_configs_dir() / "tpu_v5e_gcs.yml",
        f"base_output_directory=gs://{bucket}",
        "checkpoint_period=2",
        "max_num_checkpoints_to_keep=2",
        "model_name=default",
        "maxckpt_export_on_completion=[hf]",
        "maxckpt_export_dtype=bfloat16",
        # The preset restores single-replica, which Orbax 0.12.8 can only do over a multi-device mesh;
        # this test's single CPU device has none (a manager limitation unrelated to storage).
        "enable_single_replica_ckpt_restoring=false",
    )
    assert cfg.checkpoint_dir == f"gs://{bucket}/llama3-8b-v5e-256/checkpoints/"
    with CheckpointManager.from_config(cfg) as mgr:
        assert mgr.restore(state(0)) is None
        for step in range(7):
            mgr.save(step, state(step))
        mgr.save(6, state(6), final=True)
        assert mgr.all_steps() == [4, 6]
    ckpts = cfg.checkpoint_dir.rstrip("/")
    _assert_clean(ckpts)
    with CheckpointManager.from_config(cfg) as mgr:
        restored = mgr.restore(state(0))
        assert mgr.restored_step == 6
        assert_same(restored, state(6))
    export = f"gs://{bucket}/llama3-8b-v5e-256/export/hf"
    assert objects.exists(f"{export}/config.json")
    with open_checkpoint(f"{ckpts}/6", model="llama2") as source, open_checkpoint(export) as out:
        expected = source.hf_tensors(np.dtype(ml_dtypes.bfloat16))
        got = out.hf_tensors()
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert np.array_equal(got[name].read(), tensor.read()), name


def test_two_tier_local_disk_and_bucket(bucket_url: str, tmp_path: Path) -> None:
    """Frequent saves to local disk, periodic ones to the bucket; restore takes the newest of either."""
    from maxckpt import CheckpointConfig

    url = f"{bucket_url}/run/checkpoints"
    cfg = CheckpointConfig(enable_emergency_checkpoint=True, local_checkpoint_directory=str(tmp_path / "local"), local_checkpoint_period=1)
    with CheckpointManager(url, period=3, max_to_keep=2, async_save=True, config=cfg) as mgr:
        for step in range(8):
            mgr.save(step, make_state(step))
        mgr.wait()
        assert [s.step for s in scan_run_dir(url, "orbax").committed] == [3, 6]
        assert [s.step for s in scan_run_dir(tmp_path / "local", "orbax").committed] == [6, 7]
    _assert_clean(url)
    with CheckpointManager(url, period=3, max_to_keep=2, config=cfg) as mgr:
        assert_same(mgr.restore(make_state(0)), make_state(7))
        assert mgr.restored_step == 7
    shutil.rmtree(tmp_path / "local")  # the host's disk is gone: the bucket's newest step is what is left
    with CheckpointManager(url, period=3, max_to_keep=2, config=cfg) as mgr:
        assert_same(mgr.restore(make_state(0)), make_state(6))


def _private_moto(tmp_path):
    """A moto server of this test's own (killing it leaves the session's alone), its env and a bucket."""
    import subprocess
    import sys
    import urllib.request

    import object_stores

    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = object_stores._free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    object_stores._wait_for(f"{endpoint}/moto-api/", proc, "moto_server")
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/dying", method="PUT"), timeout=10).read()
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": str(empty), "AWS_SHARED_CREDENTIALS_FILE": str(empty),
           "JAX_PLATFORMS": "cpu"}
    return proc, env


@pytest.mark.slow
def test_the_s3_endpoint_dying_during_an_async_save_is_a_checkpoint_save_error_within_the_timeouts(tmp_path):
    """Before: botocore's EndpointConnectionError raw, or no end within 200 s (TensorStore's 32 retries of up to 32 s)."""
    import json
    import subprocess
    import sys

    server, env = _private_moto(tmp_path)
    env.update(MAXCKPT_STORAGE_RETRIES="1", MAXCKPT_STORAGE_TIMEOUT="5", MAXCKPT_SAVE_TIMEOUT="30")
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).parents[1] / "procs" / "s3_dies_mid_save.py"), "s3://dying/run/checkpoints"],
        env={**env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "saving", child.stderr.read()[-3000:]
        server.kill()
        server.wait()
        out, err = child.communicate("go\n", timeout=120)
    finally:
        server.kill()
        if child.poll() is None:
            child.kill()
    calls = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [c["call"] for c in calls] == ["wait", "save", "close"], (out, err[-3000:])
    errors = [c["error"] for c in calls if c["error"]]
    assert errors, calls  # the save in flight (or the next one) failed
    for error in errors:
        assert error.startswith("maxckpt.errors.CheckpointSaveError: "), error
    assert "the store did not answer" in errors[0], errors[0]
    assert calls[-1]["seconds"] < 60, calls


def test_the_manager_waits_for_a_save_at_most_the_save_timeout(monkeypatch):
    """`wait`/`close` (and the next `save`) give up on a save in flight after MAXCKPT_SAVE_TIMEOUT (default 3600 s)."""
    from maxckpt.errors import ConfigError
    from maxckpt.compat import orbax_threads

    monkeypatch.delenv("MAXCKPT_SAVE_TIMEOUT", raising=False)
    assert orbax_threads.save_timeout() == 3600.0
    monkeypatch.setenv("MAXCKPT_SAVE_TIMEOUT", "0.5")
    assert orbax_threads.save_timeout() == 0.5
    started = time.monotonic()
    with pytest.raises(orbax_threads.SaveTimeout, match="did not commit within 0.5 s"):
        orbax_threads.wait_bounded(lambda: time.sleep(30), orbax_threads.save_timeout())
    assert time.monotonic() - started < 5
    with pytest.raises(KeyError):  # the wait's own error comes through
        orbax_threads.wait_bounded(lambda: {}["x"], 5)
    monkeypatch.setenv("MAXCKPT_SAVE_TIMEOUT", "-1")
    with pytest.raises(ConfigError, match="MAXCKPT_SAVE_TIMEOUT='-1'"):
        orbax_threads.save_timeout()
