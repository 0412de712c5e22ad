"""Buckets never lose data: competing conversions, stray markers, and objects where a folder goes.

The four data-loss cases of the hardening issue, on both stores (fake-gcs-server
and moto): each one also with the competing command SIGKILLed before every
change it makes to the store (tests/procs/killed_at_mutation.py), after which
whatever the user had is still there, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

from maxckpt.containers.orbax import OrbaxReader
from maxckpt.conversion import convert
from maxckpt.errors import ConversionError
from maxckpt.storage import deletion, objects, outputs
from maxckpt.storage.ownership import owner_record
from maxckpt.storage.run_dirs import COMMITTED, DELETING, scan_run_dir

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """The test's environment now (the store fixtures set the emulators' variables), for a child process."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    params = random_maxtext_params(tiny_spec("llama2"), seed=11)
    return save_maxtext_run(root / "run", params, step=4).parent, params


def _snapshot(prefix: str) -> dict[str, bytes]:
    return {url: objects.read_bytes(url) for url in objects.find_files(prefix)}


def _kill_sweep(argv: list[str], check, limit: int = 40) -> int:
    """Run `maxckpt argv` killed before its 1st, 2nd, ... change to the store, calling `check()` after each,
    until a run finishes by itself; returns how many changes that run made."""
    for k in range(1, limit):
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "procs" / "killed_at_mutation.py"), str(k), *argv],
            capture_output=True, text=True, env=_env(), timeout=300,
        )
        check()
        if proc.returncode != -signal.SIGKILL:
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            return int(proc.stdout.split("MUTATIONS ")[1].split()[0])
    raise AssertionError(f"{argv} still changing the store after {limit} changes")


def _params(path) -> dict[str, np.ndarray]:
    reader = OrbaxReader(path)
    return {n.removeprefix("params/params/"): reader.read(n) for n in reader.tensors()}


def _dead_owner() -> dict:
    return {**owner_record(), "process_start": -1}  # this pid, but another process: gone


# ------------------------------------------------------------ 1. two conversions, one DST


def test_a_live_conversion_keeps_its_destination(bucket_url, local_run, tmp_path):
    """The second conversion to a DST being written is refused (with --overwrite too, and killed at any
    point); the first then finishes, complete and exact."""
    run, params = local_run
    dst = f"{bucket_url}/hf"
    first = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "procs" / "bucket_convert_paused.py"), str(run), dst, "hf"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        assert "UPLOADED" in first.stdout.readline()
        before = _snapshot(dst)
        assert f"{dst}/{outputs.WRITING}" in before and f"{dst}/{outputs.COMPLETE}" not in before
        for overwrite in (False, True):
            with pytest.raises(ConversionError, match="being written by another conversion") as info:
                convert(run, dst, to="hf", model="llama2", overwrite=overwrite)
            assert f"pid {first.pid}" in str(info.value)
            assert _snapshot(dst) == before

        def untouched() -> None:
            assert _snapshot(dst) == before

        made = _kill_sweep(["convert", str(run), dst, "--to", "hf", "--model", "llama2", "--overwrite"], untouched)
        assert made == 0  # refused before it changed anything
    finally:
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0 and "DONE" in out, err[-3000:]
    names = objects.list_names(dst)
    assert outputs.COMPLETE in names and outputs.WRITING not in names and outputs.JOURNAL not in names
    convert(dst, tmp_path / "mt", to="maxtext")
    got = _params(tmp_path / "mt")
    assert set(got) == set(params) and all(np.array_equal(got[n], params[n]) for n in params)


def test_a_writer_on_another_host_holds_its_lease(bucket_url, local_run):
    """Another host's writer cannot be asked if it lives: its lease decides; once run out, its journal does."""
    run, _ = local_run
    dst = f"{bucket_url}/hf"
    record = {**outputs._new_record(dst), "owner": {**owner_record(), "host": "trainer-7", "pid": 4242}}
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(record).encode())
    objects.write_bytes(f"{dst}/{outputs.JOURNAL}/{record['token']}/model.safetensors", b"")
    objects.write_bytes(f"{dst}/model.safetensors", b"half a shard")
    before = _snapshot(dst)
    with pytest.raises(ConversionError, match="pid 4242 on host trainer-7.*lease runs out in"):
        convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert _snapshot(dst) == before
    # Not renewed for longer than the lease (the store's own time says so too: the object is old).
    stale = {**record, "renewed": time.time() - 10 * outputs.LEASE_S}
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(stale).encode())
    real_mtime = objects.mtime
    try:
        objects.mtime = lambda path: time.time() - 10 * outputs.LEASE_S
        convert(run, dst, to="hf", model="llama2")
    finally:
        objects.mtime = real_mtime
    names = objects.list_names(dst)
    assert outputs.COMPLETE in names and outputs.WRITING not in names and outputs.JOURNAL not in names
    assert objects.read_bytes(f"{dst}/model.safetensors") != b"half a shard"


def test_two_conversions_starting_together_leave_one_writer(bucket_url, monkeypatch):
    """Both write a record at the same instant: the one whose record was replaced stops and removes nothing."""
    dst = f"{bucket_url}/out"
    other = {**outputs._new_record(dst), "owner": {**owner_record(), "host": "trainer-9", "pid": 99}}
    real_sleep = time.sleep

    def the_other_writes_meanwhile(seconds: float) -> None:
        objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(other).encode())
        real_sleep(seconds)

    monkeypatch.setattr(outputs.time, "sleep", the_other_writes_meanwhile)
    with pytest.raises(ConversionError, match="another conversion began writing this destination at the same moment"):
        outputs.begin(dst)
    assert json.loads(objects.read_bytes(f"{dst}/{outputs.WRITING}"))["token"] == other["token"]
    assert dst not in outputs._TOKENS and dst not in outputs._LEASES


def test_a_writer_whose_record_was_replaced_never_commits(bucket_url):
    dst = f"{bucket_url}/out"
    outputs.begin(dst)
    with outputs.spooled(dst) as spool:
        os.makedirs(spool)
        Path(spool, "a.bin").write_bytes(b"mine")
    usurper = {**outputs._new_record(dst), "owner": {**owner_record(), "host": "trainer-9"}}
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(usurper).encode())
    with pytest.raises(ConversionError, match="replaced this one's writing record"):
        outputs.commit(dst)
    outputs.abandon(dst)
    names = objects.list_names(dst)
    assert outputs.COMPLETE not in names and "a.bin" in names  # nothing removed: not this writer's to judge
    assert json.loads(objects.read_bytes(f"{dst}/{outputs.WRITING}"))["token"] == usurper["token"]


def test_a_lease_is_renewed_while_the_conversion_runs(bucket_url, monkeypatch):
    monkeypatch.setattr(outputs, "RENEW_S", 0.2)
    dst = f"{bucket_url}/out"
    outputs.begin(dst)
    try:
        first = json.loads(objects.read_bytes(f"{dst}/{outputs.WRITING}"))["renewed"]
        deadline = time.monotonic() + 20
        while json.loads(objects.read_bytes(f"{dst}/{outputs.WRITING}"))["renewed"] == first:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.1)
    finally:
        outputs.abandon(dst)
    assert objects.find_files(dst) == []


# ------------------------------------------------------------ 2. stray writing records


STRAYS = {
    "empty object": b"",
    "empty JSON": b"{}",
    "another tool's": b"writing: yes\n",
    "an older maxckpt's": json.dumps({"host": "h", "pid": 1, "since": 0}).encode(),
}


@pytest.mark.parametrize("stray", sorted(STRAYS))
def test_a_stray_writing_record_never_wipes_a_prefix(bucket_url, local_run, stray):
    run, _ = local_run
    dst = f"{bucket_url}/team"
    objects.write_bytes(f"{dst}/notes.txt", b"user data")
    objects.write_bytes(f"{dst}/data/part-0", b"more user data")
    objects.write_bytes(f"{dst}/{outputs.WRITING}", STRAYS[stray])
    before = _snapshot(dst)
    for overwrite in (False, True):
        with pytest.raises(ConversionError, match="did not write for this destination.*Nothing was changed"):
            convert(run, dst, to="hf", model="llama2", overwrite=overwrite)
        assert _snapshot(dst) == before


def test_a_record_copied_from_another_destination_is_not_acted_on(bucket_url, local_run):
    run, _ = local_run
    dst = f"{bucket_url}/team"
    elsewhere = {**outputs._new_record(f"{bucket_url}/other"), "owner": _dead_owner()}
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(elsewhere).encode())
    objects.write_bytes(f"{dst}/{outputs.JOURNAL}/{elsewhere['token']}/notes.txt", b"")
    objects.write_bytes(f"{dst}/notes.txt", b"user data")
    before = _snapshot(dst)
    with pytest.raises(ConversionError, match="did not write for this destination"):
        convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert _snapshot(dst) == before


def test_a_dead_writer_takes_only_what_it_journaled(bucket_url, local_run):
    """A real record of a dead conversion beside user files: its journaled entries go, the user's stay (and
    the DST is then refused as existing), whichever change the cleaning conversion is killed before."""
    run, _ = local_run
    dst = f"{bucket_url}/team"
    record = {**outputs._new_record(dst), "owner": _dead_owner()}
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(record).encode())
    objects.write_bytes(f"{dst}/{outputs.JOURNAL}/{record['token']}/model.safetensors", b"")
    objects.write_bytes(f"{dst}/model.safetensors", b"the dead conversion's shard")
    objects.write_bytes(f"{dst}/notes.txt", b"user data")
    objects.write_bytes(f"{dst}/data/part-0", b"more user data")
    users = {f"{dst}/notes.txt": b"user data", f"{dst}/data/part-0": b"more user data"}

    def user_files_intact() -> None:
        now = _snapshot(dst)
        assert {u: now.get(u) for u in users} == users

    _kill_sweep(["convert", str(run), dst, "--to", "hf", "--model", "llama2"], user_files_intact)
    assert _snapshot(dst) == users  # the debris went, the user's files stayed
    with pytest.raises(ConversionError, match="already exists"):
        convert(run, dst, to="hf", model="llama2")
    with pytest.raises(ConversionError, match="neither an empty folder nor a checkpoint"):
        convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert _snapshot(dst) == users


# ------------------------------------------------------------ 3. stray deletion records


def _saved_run(url: str, steps: int = 4):
    from manager_states import make_state

    from maxckpt import CheckpointManager

    with CheckpointManager(url, period=1, async_save=False) as mgr:
        for step in range(steps):
            mgr.save(step, make_state(step))
    return make_state


def _stray_records(ckpts: str) -> dict[str, bytes]:
    other_version = json.dumps({
        "kind": "maxckpt deletion", "version": 2, "deleting": "3", "since": 0, "host": "h", "pid": 1,
        "commit": {"size": "1", "generation": "1", "ETag": "x"},
    }).encode()
    return {
        "empty JSON": b"{}",
        "garbage": b"\x00\xff",
        "an older maxckpt's record": json.dumps({"deleting": "3", "since": 0, "host": "h", "pid": 1}).encode(),
        "a record of another version of the step": other_version,
    }


def test_a_stray_deletion_record_never_dooms_the_newest_step(bucket_url):
    from maxckpt import CheckpointManager

    ckpts = f"{bucket_url}/run/checkpoints"
    make_state = _saved_run(ckpts)
    for what, data in _stray_records(ckpts).items():
        objects.write_bytes(f"{ckpts}/3.maxckpt-deleting", data)
        run = scan_run_dir(ckpts)
        assert [(s.step, s.state) for s in run.steps] == [(i, COMMITTED) for i in range(4)], what
        with CheckpointManager(ckpts, period=1, max_to_keep=4, async_save=False) as mgr:
            state = mgr.restore(target=make_state(0))
            assert mgr.restored_step == 3, what
        assert int(state["step"]) == int(make_state(3)["step"]), what
        assert objects.exists(f"{ckpts}/3/commit_success.txt"), what


def test_a_proven_record_of_the_newest_step_spares_it(bucket_url):
    """Even a record maxckpt wrote for the newest committed step (a deletion that began) never takes it."""
    ckpts = f"{bucket_url}/run/checkpoints"
    _saved_run(ckpts)
    deletion.record_intent(f"{ckpts}/3")
    deletion.record_intent(f"{ckpts}/1")
    run = scan_run_dir(ckpts)
    assert [(s.step, s.state) for s in run.steps] == [(0, COMMITTED), (1, DELETING), (2, COMMITTED), (3, COMMITTED)]


def test_prune_killed_anywhere_beside_a_stray_record_keeps_the_newest_step(bucket_url):
    """`prune --keep 1` finishes a deletion that started (step 1's commit file already gone), keeps step 3
    despite its stray record, and a kill before any change it makes loses neither."""
    ckpts = f"{bucket_url}/run/checkpoints"
    make_state = _saved_run(ckpts)
    objects.write_bytes(f"{ckpts}/3.maxckpt-deleting", b"{}")
    deletion.record_intent(f"{ckpts}/1")
    objects.delete_files([f"{ckpts}/1/commit_success.txt"])  # the deletion had begun when it was killed
    newest = _snapshot(f"{ckpts}/3")

    def newest_intact() -> None:
        assert _snapshot(f"{ckpts}/3") == newest
        assert scan_run_dir(ckpts).latest.step == 3

    _kill_sweep(["prune", ckpts, "--keep", "1"], newest_intact)
    assert [(s.step, s.state) for s in scan_run_dir(ckpts).steps] == [(3, COMMITTED)]
    assert objects.find_files(f"{ckpts}/1") == [] and not objects.exists(f"{ckpts}/1.maxckpt-deleting")
    from maxckpt import CheckpointManager

    with CheckpointManager(ckpts, period=1, async_save=False) as mgr:
        mgr.restore(target=make_state(0))
        assert mgr.restored_step == 3


# ------------------------------------------------------------ 4. an object where a folder goes


def test_a_destination_naming_an_object_is_refused(bucket_url, local_run):
    run, _ = local_run
    dst = f"{bucket_url}/export/notes"
    objects.write_bytes(dst, b"the user's object")
    before = _snapshot(f"{bucket_url}/export")
    with pytest.raises(ConversionError, match="already exists as an object"):
        convert(run, dst, to="hf", model="llama2")
    with pytest.raises(ConversionError, match="neither an empty folder nor a checkpoint"):
        convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert _snapshot(f"{bucket_url}/export") == before

    def object_intact() -> None:
        assert objects.read_bytes(dst) == b"the user's object"
        assert objects.list_names(dst) == []  # never used as a folder prefix

    for extra in ([], ["--overwrite"]):
        made = _kill_sweep(["convert", str(run), dst, "--to", "megatron", "--model", "llama2", *extra], object_intact)
        assert made == 0
    assert _snapshot(f"{bucket_url}/export") == before
