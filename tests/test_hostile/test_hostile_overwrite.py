"""`convert --overwrite` replaces only what is safe to lose; everything else is one error and an unchanged tree."""

from __future__ import annotations

import shutil

import pytest

from cli_runner import run_cli
from hostile_tools import assert_unchanged, build_sources, fails_cleanly, snapshot
from maxckpt.conversion import convert
from maxckpt.errors import ConversionError


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return build_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture
def work(sources, tmp_path):
    """A private copy of the run and the HF export, so a test may try to damage them."""
    shutil.copytree(sources / "run", tmp_path / "run")
    shutil.copytree(sources / "hf", tmp_path / "hf")
    return tmp_path


@pytest.mark.parametrize("target", ["hf", "maxtext", "megatron", "torchtitan", "torch"])
def test_destination_inside_the_source_is_refused(work, capsys, target):
    step = work / "run" / "checkpoints" / "2"
    for overwrite in ([], ["--overwrite"]):
        fails_cleanly(
            ["convert", work / "run" / "checkpoints", step, "--to", target, "--model", "llama2-7b", *overwrite],
            capsys, work, "is inside the source", "Choose a destination outside the source",
        )


def test_destination_holding_or_being_the_source_is_refused(work, capsys):
    for dst in (work, work / "run", work / "run" / "checkpoints"):
        fails_cleanly(["convert", work / "run" / "checkpoints", dst, "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "is or holds the source")


def test_destination_linked_to_the_source_is_refused(work, capsys):
    (work / "alias").symlink_to(work / "run" / "checkpoints")
    fails_cleanly(["convert", work / "run" / "checkpoints", work / "alias", "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "is or holds the source")
    (work / "inner").symlink_to(work / "run" / "checkpoints" / "2")
    fails_cleanly(["convert", work / "run", work / "inner", "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "inside the source")


def test_current_directory_and_its_parents_are_never_replaced(work, capsys, monkeypatch):
    project = work / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "code.py").write_text("print('mine')\n")
    shutil.copytree(work / "hf", project / "hf-export")  # even a checkpoint is refused when it is the cwd
    monkeypatch.chdir(project / "hf-export")
    fails_cleanly(["convert", work / "run", ".", "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "is the current directory or one of its parents")
    fails_cleanly(["convert", work / "run", "..", "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "is the current directory or one of its parents")


@pytest.mark.parametrize("vcs", [".git", ".hg", ".svn"])
def test_folder_with_version_control_is_never_replaced(work, capsys, vcs):
    repo = work / "repo"
    shutil.copytree(work / "hf", repo)  # an HF model cloned with git: still a checkout of someone's repo
    (repo / vcs).mkdir()
    (repo / vcs / "HEAD").write_text("ref: refs/heads/main\n")
    fails_cleanly(["convert", work / "run", repo, "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, f"holds a version-control directory ({vcs})")


def test_folder_or_file_that_is_not_a_checkpoint_is_never_replaced(work, capsys):
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("buy milk\n")
    (work / "notes.txt").write_text("precious\n")
    for dst in (work / "notes", work / "notes.txt"):
        fails_cleanly(["convert", work / "run", dst, "--to", "hf", "--model", "llama2", "--overwrite"], capsys, work, "neither an empty folder nor a checkpoint maxckpt recognises")


def test_existing_destination_without_overwrite_is_refused(work, capsys):
    fails_cleanly(["convert", work / "run", work / "hf", "--to", "hf", "--model", "llama2"], capsys, work, "already exists; choose another destination or pass --overwrite")


def test_python_api_applies_the_same_rules(work):
    before = snapshot(work)
    with pytest.raises(ConversionError, match="is inside the source"):
        convert(work / "run" / "checkpoints", work / "run" / "checkpoints" / "2", to="hf", model="llama2", overwrite=True)
    with pytest.raises(ConversionError, match="is or holds the source"):
        convert(work / "run", work / "run" / "..", to="hf", model="llama2", overwrite=True)
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("buy milk\n")
    before = snapshot(work)
    with pytest.raises(ConversionError, match="neither an empty folder nor a checkpoint"):
        convert(work / "run", work / "notes", to="torch", model="llama2", overwrite=True)
    assert_unchanged(before, work)


def test_overwrite_replaces_a_checkpoint_or_an_empty_folder(work, capsys):
    old = snapshot(work / "hf")
    code, _, err = run_cli(["convert", work / "run", work / "hf", "--to", "maxtext", "--overwrite", "-q"], capsys)
    assert code == 0, err
    assert (work / "hf" / "0" / "items" / "_METADATA").is_file() and snapshot(work / "hf") != old
    (work / "empty").mkdir()
    code, _, err = run_cli(["convert", work / "run", work / "empty", "--to", "hf", "--model", "llama2", "-q"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in work.iterdir()) == ["empty", "hf", "run"]  # no temporary folders left


def test_empty_current_directory_is_not_renamed_away(work, capsys, monkeypatch):
    # An empty DST is filled by renaming the output onto it: never when it is where the user stands.
    (work / "here").mkdir()
    monkeypatch.chdir(work / "here")
    fails_cleanly(["convert", work / "run", ".", "--to", "hf", "--model", "llama2"], capsys, work, "is the current directory or one of its parents")
