"""Ctrl-C, SIGTERM and SIGKILL during `maxckpt convert`: no `DST.tmp-*` survives (stale ones are cleaned next time).

The conversions run in child processes on a model big enough (~70 MB) that
the signal lands while tensors are being written: the test waits for the
temporary folder to appear, then signals.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import run_cli
from hostile_tools import REPO
from maxckpt.conversion.staging import OWNER_FILE, REPLACED, clean_stale, owner_record

TARGETS = ["hf", "maxtext", "megatron", "torchtitan", "torch"]


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama2", vocab=262144, layers=2)  # two 32 MB float32 embedding tables
    return save_maxtext_run(tmp_path_factory.mktemp("big") / "run", random_maxtext_params(spec), step=1).parent


def _start(src: Path, dst: Path, target: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "maxckpt", "convert", str(src), str(dst), "--to", target, "--model", "llama2", "-q"]
    # As from a terminal: a runner that started us in the background (SIGINT ignored, which the child would
    # inherit, and then Python installs no Ctrl-C handler) must not turn Ctrl-C into a no-op for the child.
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _temporaries(dst: Path) -> list[Path]:
    return [p for p in dst.parent.iterdir() if p.name.startswith(dst.name + ".tmp-")]


def _signal_while_writing(proc: subprocess.Popen, dst: Path, sig: int) -> bool:
    """Send `sig` as soon as the output's temporary folder holds its owner record; False if it finished first."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        tmps = _temporaries(dst)
        if tmps and (tmps[0] / OWNER_FILE).is_file():
            proc.send_signal(sig)
            return True
        time.sleep(0.005)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_removes_the_temporary_output(big_run, tmp_path, target, sig):
    dst = tmp_path / ("out.pt" if target == "torch" else "out")
    for attempt in range(3):
        proc = _start(big_run, dst, target)
        signalled = _signal_while_writing(proc, dst, sig)
        _, err = proc.communicate(timeout=240)
        assert signalled, f"the conversion finished before it could be interrupted: {err}"
        assert "Traceback" not in err, err
        left = sorted(p.name for p in tmp_path.iterdir())
        if proc.returncode == 130:  # typer's exit code for Ctrl-C; SIGTERM is turned into the same
            assert left == [], (left, err)  # neither DST nor DST.tmp-*
            return
        if proc.returncode == -sig and left == []:
            return  # ended by the signal itself (Python restores default handlers as it shuts down): nothing left
        # On a loaded machine the signal can land after the output was renamed into place (even
        # during interpreter shutdown): then DST is complete and nothing else is left. Try again.
        assert sorted(p.name for p in tmp_path.iterdir()) == [dst.name], (proc.returncode, err)
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    pytest.fail("the signal never landed while the conversion was writing")


@pytest.mark.slow
def test_killed_conversion_is_cleaned_by_the_next_one(big_run, tmp_path, capsys):
    dst = tmp_path / "out"
    for attempt in range(3):  # on a loaded machine the kill may land after the conversion finished: retry
        proc = _start(big_run, dst, "hf")
        assert _signal_while_writing(proc, dst, signal.SIGKILL)
        proc.communicate(timeout=120)
        left = _temporaries(dst)
        if left:
            break
        shutil.rmtree(dst)
    assert len(left) == 1 and json.loads((left[0] / OWNER_FILE).read_text())["pid"] == proc.pid
    code, _, err = run_cli(["convert", big_run, dst, "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    assert f"removed the stale temporary folder {left[0]}" in " ".join(err.split())
    assert _temporaries(dst) == [] and (dst / "config.json").is_file()


def _fake_temporary(dst: Path, **owner) -> Path:
    tmp = dst.parent / f"{dst.name}.tmp-fake{len(_temporaries(dst)):04d}"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"half written")
    (tmp / OWNER_FILE).write_text(json.dumps({**owner_record(), **owner}))
    return tmp


def test_live_owner_is_left_alone_and_a_reused_pid_is_not_mistaken_for_it(tmp_path):
    dst = tmp_path / "out"
    live = _fake_temporary(dst)  # this very process: alive
    reused = _fake_temporary(dst, process_start=1)  # our pid, but a process that started at another time
    gone = _fake_temporary(dst, pid=2**22 + 12345)  # above pid_max: no such process
    other_host = _fake_temporary(dst, host=socket.gethostname() + "-elsewhere")
    rebooted = _fake_temporary(dst, boot_id="00000000-0000-0000-0000-000000000000")
    orphan = tmp_path / "out.tmp-noowner_"
    orphan.mkdir()
    notes = " ".join(clean_stale(dst))
    assert live.is_dir() and f"left {live} alone: a conversion (pid {os.getpid()}" in notes
    assert other_host.is_dir() and "another host" in notes
    assert orphan.is_dir() and f"left {orphan} alone: a temporary folder with no owner record" in notes
    for stale in (reused, gone, rebooted):
        assert not stale.exists() and f"removed the stale temporary folder {stale}" in notes


def test_destination_parked_by_a_killed_replacement_is_restored(tmp_path):
    dst = tmp_path / "out"
    tmp = _fake_temporary(dst, pid=2**22 + 1)
    (tmp / REPLACED).mkdir()
    (tmp / REPLACED / "config.json").write_text("{}")  # the user's old dst, moved aside just before the kill
    notes = " ".join(clean_stale(dst))
    assert (dst / "config.json").read_text() == "{}" and not tmp.exists()
    assert f"restored {dst}" in notes


def test_a_temporary_of_another_destination_is_not_taken_for_ours(tmp_path):
    """`out.tmp-x.tmp-*` is the temporary of DST `out.tmp-x`: cleaning for DST `out` must not touch it."""
    other = tmp_path / "out.tmp-x"
    tmp = _fake_temporary(other, pid=2**22 + 1)
    (tmp / REPLACED).mkdir()
    (tmp / REPLACED / "config.json").write_text("{}")  # `out.tmp-x`, parked by a replacement that was killed
    notes = " ".join(clean_stale(tmp_path / "out"))
    assert notes == "" and tmp.is_dir() and not (tmp_path / "out").exists()
    notes = " ".join(clean_stale(other))
    assert (other / "config.json").read_text() == "{}" and not tmp.exists() and f"restored {other}" in notes


# ----------------------------------------- hidden `.DST.prep-*` folders of conversions killed before their rename

PREP_KILLER = Path(__file__).parents[1] / "procs" / "prep_killer.py"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    return save_maxtext_run(tmp_path_factory.mktemp("tiny") / "run", random_maxtext_params(tiny_spec("llama2")), step=1).parent


@pytest.mark.parametrize("target", ["hf", "maxtext"])
def test_every_file_and_folder_is_on_disk_before_the_output_is_renamed_into_place(tiny_run, tmp_path, monkeypatch, target):
    """A power cut after the rename cannot leave empty config or metadata files: all is fsynced, then the rename too."""
    from maxckpt.conversion.pipeline import convert

    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    dst = tmp_path / "out"
    convert(tiny_run, dst, to=target, model="llama2")
    staged = [p for p in synced if ".tmp-" in p]
    relative = {p.split(".tmp-", 1)[1].split("/", 1)[1] for p in staged}  # `<dst>.tmp-XXXX/out/...` -> `out/...`
    on_disk = {str(p.relative_to(tmp_path)) for p in dst.rglob("*")} | {"out"}
    assert on_disk <= relative, sorted(on_disk - relative)
    assert synced[-1] == str(tmp_path)  # last: the folder that holds the rename


def _preps(dst: Path) -> list[Path]:
    return sorted(p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.prep-"))


def _fake_prep(dst: Path, *, tag: str | None = None, pid: int | None = None, start: int | None = None, rand: str = "abcd1234", record: dict | None = None) -> Path:
    """A hidden folder named as `_owned_folder` names it (tag None: the older naming, no maker in the name)."""
    if tag is None:
        name = f".{dst.name}.prep-{rand}"
    else:
        name = f".{dst.name}.prep-{tag}-{pid}-{start}-{rand}"
    prep = dst.parent / name
    prep.mkdir(parents=True)
    if record is not None:
        (prep / OWNER_FILE).write_text(json.dumps(record))
    return prep


def _ours() -> dict:
    from maxckpt.conversion.staging import _host_tag, _proc_start

    return {"tag": _host_tag(), "pid": os.getpid(), "start": _proc_start(os.getpid())}


@pytest.mark.parametrize("when", ["before-record", "after-record"])
def test_conversion_killed_before_its_rename_leaves_a_hidden_folder_the_next_one_removes(tiny_run, tmp_path, capsys, when):
    dst = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), MAXCKPT_TEST_KILL_IN_PREP=when, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, str(PREP_KILLER), str(tiny_run), str(dst), "--to", "hf", "--model", "llama2", "-q"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL, stderr[-3000:]
    [killed] = _preps(dst)
    assert not _temporaries(dst) and not dst.exists()
    if when == "after-record":
        assert json.loads((killed / OWNER_FILE).read_text())["pid"] == proc.pid
    else:
        assert [p.name for p in killed.iterdir()] == [OWNER_FILE] and (killed / OWNER_FILE).read_bytes() == b""  # opened, never written
    assert f"-{proc.pid}-" in killed.name  # the name says who made it, record or not

    ours = _ours()
    live = _fake_prep(dst, **ours, rand="live0000")  # a conversion of this process, inside that window right now
    other_dst = _fake_prep(tmp_path / "out2", tag=ours["tag"], pid=2**22 + 7, start=1)  # another DST's: not ours to judge
    lookalike = tmp_path / f".out.prep-{ours['tag']}-{2**22 + 8}-1-zzzzzzzz"
    lookalike.symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a link, never followed or removed
    (tmp_path / "elsewhere").mkdir()

    code, _, err = run_cli(["convert", tiny_run, dst, "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    assert f"removed the stale hidden folder {killed}" in " ".join(err.split())
    assert not killed.exists() and (dst / "config.json").is_file()
    assert live.is_dir() and other_dst.is_dir() and lookalike.is_symlink() and (tmp_path / "elsewhere").is_dir()
    assert _preps(dst) == sorted([live, lookalike])
    assert _temporaries(dst) == []


def test_hidden_folders_go_only_when_their_maker_is_provably_gone(tmp_path):
    dst = tmp_path / "out"
    ours = _ours()
    dead_pid = 2**22 + 12345  # above pid_max: no such process
    live = _fake_prep(dst, **ours, rand="live0000")
    live_with_record = _fake_prep(dst, **ours, rand="live0001", record=owner_record())
    dead = _fake_prep(dst, tag=ours["tag"], pid=dead_pid, start=1, rand="dead0000")
    half_record = _fake_prep(dst, tag=ours["tag"], pid=dead_pid, start=1, rand="dead0001")
    (half_record / OWNER_FILE).write_text('{"host": "')  # killed while writing it
    reused = _fake_prep(dst, tag=ours["tag"], pid=os.getpid(), start=1, rand="reused00")  # our pid, another start
    # Made on another host (or before a reboot): the name cannot be checked here.
    elsewhere_young = _fake_prep(dst, tag="00000000", pid=dead_pid, start=1, rand="young000")
    elsewhere_old = _fake_prep(dst, tag="00000000", pid=dead_pid, start=1, rand="old00000")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(elsewhere_old, (two_days_ago, two_days_ago))
    # The older naming (no maker in the name): the owner record decides, else the age.
    legacy_dead = _fake_prep(dst, rand="legacy00", record={**owner_record(), "pid": dead_pid})
    legacy_live = _fake_prep(dst, rand="legacy01", record=owner_record())
    legacy_bare = _fake_prep(dst, rand="legacy02")
    # Not a maxckpt hidden folder, whatever its name: left alone.
    holds_more = _fake_prep(dst, tag=ours["tag"], pid=dead_pid, start=1, rand="more0000")
    (holds_more / "notes.txt").write_text("mine")
    plain_file = tmp_path / f".out.prep-{ours['tag']}-{dead_pid}-1-file0000"
    plain_file.write_text("x")
    odd_name = _fake_prep(dst, rand="abc")  # not mkdtemp's 8 characters

    notes = " ".join(" ".join(clean_stale(dst)).split())
    for gone in (dead, half_record, reused, elsewhere_old, legacy_dead):
        assert not gone.exists() and f"removed the stale hidden folder {gone}" in notes, gone
    for kept in (live, live_with_record, elsewhere_young, legacy_live, legacy_bare, holds_more, odd_name):
        assert kept.is_dir(), kept
    assert plain_file.read_text() == "x" and (holds_more / "notes.txt").read_text() == "mine"
    assert str(live) not in notes and str(legacy_live) not in notes  # a live conversion's folder: nothing to say
    assert f"left {elsewhere_young} alone" in notes and f"left {legacy_bare} alone" in notes
    assert f"left {holds_more} alone: it holds files a conversion never puts there" in notes


def test_a_live_conversion_inside_that_window_keeps_its_hidden_folder(tiny_run, tmp_path, capsys):
    dst = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), MAXCKPT_TEST_KILL_IN_PREP="stop-before-record", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, str(PREP_KILLER), str(tiny_run), str(dst), "--to", "hf", "--model", "llama2", "-q"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)  # until it stops itself inside the window
        assert os.WIFSTOPPED(status), status
        [theirs] = _preps(dst)
        code, _, err = run_cli(["convert", tiny_run, dst, "--to", "hf", "--model", "llama2", "-q"], capsys)
        assert code == 0, err
        assert theirs.is_dir() and str(theirs) not in " ".join(err.split())  # not removed, nothing said
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=240)
    # It carried on with its folder (record written, renamed, converted); only its final rename found DST taken.
    assert proc.returncode == 1 and "appeared while converting" in " ".join(stderr.split()), stderr[-3000:]
    assert _preps(dst) == [] and _temporaries(dst) == [] and (dst / "config.json").is_file()
