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


# ------------------------------------------- damaged metadata (section 5)

DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _deep_safetensors_header(path: Path) -> None:
    raw = ('{"a": ' + DEEP_JSON + "}").encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_deeply_nested_json_in_a_safetensors_header(work, capsys):
    shard = sorted((work / "hf").glob("model-*.safetensors"))[0]
    _deep_safetensors_header(shard)
    all_fail_cleanly(work, capsys, work / "hf", work / "run", f"{shard.name}: header is not valid JSON (nested 100001 levels deep; the limit is 64")


@pytest.mark.parametrize("name", ["model.safetensors.index.json", "config.json"])
def test_deeply_nested_json_beside_safetensors(work, capsys, name):
    (work / "hf" / name).write_text(DEEP_JSON)
    # config.json only matters once the model settings are needed.
    all_fail_cleanly(work, capsys, work / "hf", work / "run", f"{name}:", "levels deep; the limit is 64", metadata_only=name != "config.json")


def test_deeply_nested_orbax_metadata(work, capsys):
    items = work / "run" / "checkpoints" / "2" / "items"
    (items / "_METADATA").write_text('{"tree_metadata": ' + DEEP_JSON + "}")
    all_fail_cleanly(work, capsys, work / "run", work / "hf", "_METADATA: not a valid Orbax metadata file", "levels deep; the limit is 64")


def test_deeply_nested_checkpoint_metadata_is_ignored_where_it_is_optional(work, capsys):
    # _CHECKPOINT_METADATA only adds the save time (ls) and custom metadata: damage there costs only those.
    step = work / "run" / "checkpoints" / "2"
    (step / "_CHECKPOINT_METADATA").write_text(DEEP_JSON)
    before = snapshot(work)
    for argv in (["ls", work / "run"], ["inspect", work / "run"], ["ls", work / "run", "--json"]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0 and "Traceback" not in err, err
    code, out, _ = run_cli(["ls", work / "run", "--json"], capsys)
    assert [r["step"] for r in json.loads(out)["steps"]] == [2]
    assert_unchanged(before, work)


@pytest.mark.parametrize("damage", ["binary", "directory", "deep-text"])
def test_damaged_megatron_tracker(work, capsys, damage):
    tracker = work / "mega" / "latest_checkpointed_iteration.txt"
    tracker.unlink()
    if damage == "binary":
        tracker.write_bytes(b"\xff\xfe\x00\x01" * 100)
        expected = "latest_checkpointed_iteration.txt: is not text"
    elif damage == "directory":
        tracker.mkdir()
        expected = "latest_checkpointed_iteration.txt: is not a file"
    else:
        tracker.write_text("[" * 5000)
        expected = "expected an iteration number or 'release'"
    all_fail_cleanly(work, capsys, work / "mega", work / "hf", expected)
    before = snapshot(work)
    code, _, err = run_cli(["ls", work / "mega"], capsys)  # listing needs no tracker: it still works
    assert code == 0 and "Traceback" not in err, err
    assert_unchanged(before, work)


@pytest.mark.parametrize("state", ["[1, 2]", '"text"', DEEP_JSON, "\xff not json"])
def test_hf_trainer_state_that_is_not_an_object(work, capsys, state):
    run = work / "trainer"
    for step in (10, 20):
        shutil.copytree(work / "hf", run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(state, errors="surrogateescape")
    before = snapshot(work)
    code, out, err = run_cli(["ls", run, "--json"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert [r["step"] for r in json.loads(out)["steps"]] == [10, 20]
    assert_unchanged(before, work)


@pytest.mark.parametrize("target", ["hf", "maxtext", "megatron", "torchtitan", "torch"])
@pytest.mark.parametrize(
    "key,value,kind",
    [
        ("rms_norm_eps", "tiny", "a positive number"),
        ("rms_norm_eps", -1e-5, "a positive number"),
        ("vocab_size", 128.5, "a positive whole number"),
        ("tie_word_embeddings", "yes", "true or false"),
        ("eos_token_id", "</s>", "a token id, a list of token ids, or null"),
        ("max_position_embeddings", [4096], "a positive whole number"),
    ],
)
def test_wrongly_typed_config_values_are_refused_before_writing(work, capsys, target, key, value, kind):
    config = json.loads((work / "hf" / "config.json").read_text())
    config[key] = value
    (work / "hf" / "config.json").write_text(json.dumps(config))
    fails_cleanly(["convert", work / "hf", work / "out", "--to", target, "-q"], capsys, work, f"config states {key}=", f"{key} must be {kind}")


def test_a_wrongly_typed_value_can_be_overridden(work, capsys):
    config = json.loads((work / "hf" / "config.json").read_text())
    config["rms_norm_eps"] = "tiny"
    (work / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["convert", work / "hf", work / "out", "--to", "hf", "-q", "--set", "rms_norm_eps=1e-5"], capsys)
    assert code == 0, err
    assert json.loads((work / "out" / "config.json").read_text())["rms_norm_eps"] == 1e-5


# ----------------------------------------------------- configs (sections 5, 6)


def _config_commands(overlay: Path, run: Path) -> list[list]:
    return [["config", "show", overlay], ["config", "show", overlay, "--json"], ["ls", run, "--config", overlay]]


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"save_period: 5\nrun_name: \xff\xfe\n", "is not UTF-8 text (undecodable byte at offset 25)"),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "is not valid YAML"),
        (b"- just\n- a list\n", "is not a mapping of config keys (it holds a list)"),
        (b"a: &a [1,2,3,4,5,6,7,8,9]\n" + b"".join(b"l%d: &l%d [%s]\n" % (i, i, b",".join([b"*" + (b"a" if i == 0 else b"l%d" % (i - 1))] * 9)) for i in range(30)), "is not valid YAML"),
    ],
    ids=["not-utf8", "deep", "list", "alias-bomb"],
)
def test_unreadable_overlays(work, capsys, content, expected):
    overlay = work / "overlay.yml"
    overlay.write_bytes(content)
    for argv in _config_commands(overlay, work / "run"):
        fails_cleanly(argv, capsys, work, f"config file {overlay} ", expected)


def test_base_config_pointing_at_a_non_config_never_echoes_it(work, capsys):
    secret = work / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\nhunter2: [unbalanced\n")
    plain = work / "plain.txt"
    plain.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for target, expected in ((secret, "is not valid YAML"), (plain, "is not a mapping of config keys (it holds a string)")):
        overlay = work / "overlay.yml"
        overlay.write_text(f"base_config: {target}\nsave_period: 5\n")
        for argv in _config_commands(overlay, work / "run"):
            message = fails_cleanly(argv, capsys, work, f"config file {target} ", expected)
            assert "root:x" not in message and "hunter2" not in message and "/bin/bash" not in message


def test_config_show_with_a_huge_value_is_quick_and_capped(work, capsys):
    import time

    overlay = work / "overlay.yml"
    overlay.write_text("run_name: " + "x" * 10_000_000 + "\n")
    started = time.perf_counter()
    code, out, err = run_cli(["config", "show", overlay], capsys)
    assert code == 0, err
    assert time.perf_counter() - started < 20
    assert "more characters; see --json" in out and len(out) < 20_000


# ------------------------------------------------- user text is not markup (section 6)


def test_user_text_is_printed_as_written(work, capsys):
    odd = work / "a:x:[bold]b:+1:"
    odd.mkdir()
    shutil.copytree(work / "hf", odd / "m[red]")
    code, out, err = run_cli(["convert", odd / "m[red]", odd / "out:x:", "--to", "hf", "-q"], capsys)
    assert code == 0, err
    assert f"{odd}/out:x:" in "".join(out.split()) and "❌" not in out and "👍" not in out  # rich may wrap the title
    code, out, err = run_cli(["inspect", odd / "m[red]"], capsys)
    assert code == 0 and "a:x:[bold]b:+1:/m[red]" in "".join(out.split()) and "❌" not in out
    code, out, err = run_cli(["verify", odd / "m[red]", odd / "out:x:"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["inspect", odd / "none:x:[bold]"], capsys)
    one_error_line(code, err, f"{odd}/none:x:[bold]: no such file or directory")
    assert "❌" not in err


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "-0.5"])
def test_tolerances_must_be_finite_and_not_negative(work, capsys, value):
    for argv in (["verify", work / "hf", work / "run", "--atol", value, "--model", "llama2"], ["diff", work / "hf", work / "run", "--atol", value, "--model", "llama2"]):
        fails_cleanly(argv, capsys, work, "atol must be a finite number >= 0")
    from maxckpt.conversion.verify import verify
    from maxckpt.errors import ConfigError
    from maxckpt.explore import diff_checkpoints

    with pytest.raises(ConfigError, match="atol must be a finite number >= 0"):
        verify(work / "hf", work / "run", atol=float(value), model="llama2")
    with pytest.raises(ConfigError, match="atol must be a finite number >= 0"):
        diff_checkpoints(work / "hf", work / "run", atol=float(value), model="llama2")


# ------------------------------------------------------------- no hangs


def test_pipes_where_files_belong_never_block(work, capsys):
    # Opening a FIFO for reading waits for a writer forever; every reader refuses it instead.
    shard = sorted((work / "hf").glob("model-*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)
    all_fail_cleanly(work, capsys, work / "hf", work / "run", f"{shard.name}: cannot read it (not a regular file")
    tracker = work / "mega" / "latest_checkpointed_iteration.txt"
    tracker.unlink()
    os.mkfifo(tracker)
    fails_cleanly(["inspect", work / "mega"], capsys, work, "latest_checkpointed_iteration.txt: is not a file")
    overlay = work / "overlay.yml"
    os.mkfifo(overlay)
    fails_cleanly(["config", "show", overlay], capsys, work, "is not a regular file")
    pt = work / "pipe.pt"
    os.mkfifo(pt)
    from maxckpt.storage.bounded import check_torch_file

    with pytest.raises(OSError, match="not a regular file"):
        check_torch_file(pt)


# ------------------------------------------------------------- names the kernel refuses


LONG = "n" * 300  # one name over the 255 bytes Linux allows: every stat() of it is ENAMETOOLONG


@pytest.mark.parametrize(
    "argv",
    [
        lambda w: ["convert", w / LONG, w / "out", "--to", "hf", "--model", "llama2", "-q"],
        lambda w: ["convert", w / "run", w / LONG / "out", "--to", "hf", "--model", "llama2", "-q"],
        lambda w: ["inspect", w / LONG],
        lambda w: ["ls", w / LONG / "checkpoints"],
        lambda w: ["diff", w / "hf", w / LONG, "--model", "llama2"],
        lambda w: ["config", "show", w / LONG / "overlay.yml"],
    ],
    ids=["convert-src", "convert-dst", "inspect", "ls", "diff", "config-show"],
)
def test_a_name_over_255_bytes_is_one_error_line(work, capsys, argv):
    args = argv(work)
    long_path = next(str(a) for a in args if LONG in str(a))
    fails_cleanly(args, capsys, work, long_path, "is 300 bytes long", "the name is too long", "use a shorter name")


# ------------------------------------------------------------- special files say what they are


def _tampered_dcp_metadata(step: Path, relative_path: str) -> None:
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from maxckpt.containers.dcp import load_metadata

    md = load_metadata(step)
    for key, info in list(md.storage_data.items()):
        md.storage_data[key] = _StorageInfo(relative_path, info.offset, info.length)
    (step / ".metadata").write_bytes(pickle.dumps(md))


def _base_config_device(w: Path) -> tuple[list, str]:
    (w / "overlay.yml").write_text("base_config: /dev/zero\n")
    return ["config", "show", w / "overlay.yml"], "base_config '/dev/zero' is a character device, not a config file"


def _base_config_fifo(w: Path) -> tuple[list, str]:
    os.mkfifo(w / "base.yml")
    (w / "overlay.yml").write_text("base_config: base.yml\n")
    expected = f"base_config 'base.yml' (found as {w / 'base.yml'}) is a FIFO (named pipe), not a config file"
    return ["config", "show", w / "overlay.yml"], expected


def _index_entry(bad: str):
    def build(w: Path) -> tuple[list, str]:
        index = w / "hf" / "model.safetensors.index.json"
        entries = json.loads(index.read_text())
        entries["weight_map"]["model.norm.weight"] = bad
        index.write_text(json.dumps(entries))
        expected = f"weight_map maps 'model.norm.weight' to {bad!r}, an invalid file name in the index"
        return ["inspect", w / "hf"], expected

    return build


def _config_json_fifo(w: Path) -> tuple[list, str]:
    config = w / "hf" / "config.json"
    config.unlink()
    os.mkfifo(config)  # was skipped: the conversion went on without the model's settings
    argv = ["convert", w / "hf", w / "out", "--to", "maxtext", "-q"]
    return argv, f"{config} is a FIFO (named pipe), not a regular file"


def _distcp_fifo(w: Path) -> tuple[list, str]:
    data = next((w / "titan" / "step-3").glob("*.distcp"))
    data.unlink()
    os.mkfifo(data)
    argv = ["convert", w / "titan", w / "out", "--to", "hf", "--model", "llama2", "-q"]
    return argv, f"{data}: data file of item 'tok_embeddings.weight' is a FIFO (named pipe), not a regular file"


def _distcp_dot(w: Path) -> tuple[list, str]:
    _tampered_dcp_metadata(w / "titan" / "step-3", ".")
    return ["inspect", w / "titan"], "is stored at file '.', an invalid data file name (the checkpoint folder itself)"


def _dst_under_a_device(w: Path) -> tuple[list, str]:
    argv = ["convert", w / "run", "/dev/full/x.pt", "--to", "torch", "--model", "llama2", "-q"]
    return argv, "cannot write /dev/full/x.pt: /dev/full is a character device, not a folder"


@pytest.mark.parametrize(
    "build",
    [
        _base_config_device, _base_config_fifo, _index_entry(""), _index_entry(".."),
        _config_json_fifo, _distcp_fifo, _distcp_dot, _dst_under_a_device,
    ],
    ids=[
        "base-config-device", "base-config-fifo", "index-entry-empty", "index-entry-dotdot",
        "config-json-fifo", "distcp-fifo", "distcp-dot", "dst-under-a-device",
    ],
)
def test_special_files_are_named_for_what_they_are(work, capsys, build):
    # They were "does not exist", "not found", "is a directory", "truncated", silently skipped, or "File exists".
    argv, expected = build(work)
    fails_cleanly(argv, capsys, work, expected)
