"""Hostile and unusual input to every command and the Python API: right result, or one `error:` line.

Each case builds its input from tiny real checkpoints, runs the CLI commands
(inspect, convert, verify, diff, ls) and the Python API over it, and checks
the message, the exit code, and that the file tree is unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from hostile_tools import assert_unchanged, build_sources, fails_cleanly, one_error_line, run_subprocess, snapshot
from maxckpt.errors import MaxckptError


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return build_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture
def work(sources, tmp_path):
    for name in ("run", "hf", "mega", "titan"):
        shutil.copytree(sources / name, tmp_path / name)
    shutil.copy(sources / "model.pt", tmp_path / "model.pt")
    return tmp_path


def commands_reading(ckpt: Path, other: Path, out: Path) -> list[list]:
    """Every command that reads a checkpoint, pointed at `ckpt`."""
    return [
        ["inspect", ckpt],
        ["convert", ckpt, out, "--to", "hf", "--model", "llama2", "-q"],
        ["verify", ckpt, other, "--model", "llama2"],
        ["diff", ckpt, other, "--model", "llama2"],
    ]


def api_calls(ckpt: Path, other: Path, out: Path) -> list:
    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.conversion.verify import verify
    from maxckpt.explore import diff_checkpoints, inspect_checkpoint

    return [
        lambda: open_checkpoint(ckpt).tensors(),
        lambda: inspect_checkpoint(ckpt),
        lambda: convert(ckpt, out, to="hf", model="llama2"),
        lambda: verify(ckpt, other, model="llama2"),
        lambda: diff_checkpoints(ckpt, other, model="llama2"),
    ]


def all_fail_cleanly(work: Path, capsys, ckpt: Path, other: Path, *expected: str, metadata_only: bool = True) -> None:
    """Every command and API call fails cleanly; with metadata_only=False, those that list tensors only are skipped."""
    out = work / "out"
    for argv in commands_reading(ckpt, other, out)[(0 if metadata_only else 1) :]:
        fails_cleanly(argv, capsys, work, *expected)
    before = snapshot(work)
    for call in api_calls(ckpt, other, out)[(0 if metadata_only else 2) :]:
        with pytest.raises(MaxckptError) as info:
            call()
        flat = " ".join(str(info.value).split())
        assert all(text in flat for text in expected), flat
    assert_unchanged(before, work)


# ------------------------------------------------------------ crashes (section 2)


def _deep_tuple_pickle(levels: int) -> bytes:
    # {((((None,),),)...): None} - hashing the key recursed in C until the interpreter segfaulted.
    return b"\x80\x02}" + b"N" + b"\x85" * levels + b"Ns."


@pytest.mark.parametrize("which", ["mega", "titan"])
def test_deeply_nested_dcp_metadata(work, capsys, which):
    step = next(p for p in (work / which).iterdir() if (p / ".metadata").is_file())
    (step / ".metadata").write_bytes(_deep_tuple_pickle(1_000_000))
    all_fail_cleanly(work, capsys, work / which, work / "hf", ".metadata: not a readable DCP metadata pickle", "nested more than 100 levels")


def test_deeply_nested_pickles_never_crash_a_child_process(work):
    # The same in a separate interpreter: a regression would be a segfault (exit -11), not a failed assert here.
    step = work / "mega" / "iter_0000003"
    (step / ".metadata").write_bytes(_deep_tuple_pickle(1_000_000))
    result = run_subprocess(["inspect", work / "mega"])
    assert result.returncode == 1 and "error:" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_deeply_nested_torch_files(work, capsys):
    import zipfile

    deep = work / "deep.pt"
    with zipfile.ZipFile(deep, "w") as archive:  # what torch.save writes, with a hostile data.pkl
        archive.writestr("deep/data.pkl", _deep_tuple_pickle(100_000))
        archive.writestr("deep/version", "3\n")
    all_fail_cleanly(work, capsys, deep, work / "hf", "deep.pt: not a readable torch.save file", "nested more than 100 levels")
    common = work / "mega" / "iter_0000003" / "common.pt"
    shutil.copy(deep, common)
    # common.pt holds the model's args: only commands that need the model settings read it.
    all_fail_cleanly(work, capsys, work / "mega", work / "hf", "common.pt: not a readable torch.save file", "nested more than 100 levels", metadata_only=False)


# ---------------------------------------------------------- valid input (section 3)


def test_relative_source_paths_with_dotdot(work, capsys, monkeypatch):
    inner = work / "elsewhere" / "deeper"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    run = Path("..") / ".." / "run" / "checkpoints"
    hf = Path("..") / ".." / "hf"
    for argv in (["inspect", run], ["verify", run, hf, "--model", "llama2"], ["diff", run, hf, "--model", "llama2"]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0 and "Traceback" not in err, err
    code, _, err = run_cli(["convert", run, Path("..") / "out", "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    assert (work / "elsewhere" / "out" / "config.json").is_file()
    from maxckpt.conversion import convert, open_checkpoint
    from maxckpt.conversion.verify import verify

    assert "params/params/token_embedder/embedding" in open_checkpoint(run).tensors()
    assert verify(run, Path("..") / "out", model="llama2").ok
    convert(run, Path("..") / "out-mt", to="maxtext", model="llama2")
    assert verify(Path("..") / "out-mt", Path("..") / "out").ok


def _sparse_safetensors(path: Path, nbytes: int) -> None:
    """One U8 tensor of `nbytes` (a sparse file: costs no disk), with marker bytes at both ends."""
    header = json.dumps({"big": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        start = f.tell()
        f.write(b"\x07")
        f.seek(start + nbytes - 1)
        f.write(b"\x09")


@pytest.mark.slow
def test_safetensors_tensor_of_more_than_2_gib(tmp_path):
    from maxckpt.containers.safetensors import SafetensorsReader

    nbytes = 2**31 + 4096  # one os.preadv moves at most 2**31 - 4096 bytes on Linux
    _sparse_safetensors(tmp_path / "model.safetensors", nbytes)
    with SafetensorsReader(tmp_path) as reader:
        assert reader.tensors()["big"].shape == (nbytes,)
        tail = reader.read("big", (slice(nbytes - 3, None),))
        assert tail.tolist() == [0, 0, 9]
        whole = reader.read("big")  # one read of more than 2 GiB
        assert whole.shape == (nbytes,) and whole[0] == 7 and whole[-1] == 9 and whole[1:-1].max() == 0
