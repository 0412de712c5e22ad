"""Specification of the CLI shell: help, version, error reporting, `config show`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from cli_runner import run_cli as run
from conversion_models import tiny_spec
from maxckpt import __version__
from maxckpt.cli.app import app
from maxckpt.cli.convert_cmd import hand_off_lines
from maxckpt.cli.main import main
from maxckpt.conversion import pipeline
from maxckpt.formats import ConversionOptions
from maxckpt.config import FIELDS, bundled_configs_dir

KEEP_LAST = str(bundled_configs_dir() / "keep_last_n_async.yml")


def all_command_paths() -> list[list[str]]:
    """Every command and group of the app, as argv prefixes."""
    paths: list[list[str]] = []

    def walk(cmd: click.Command, prefix: list[str]) -> None:
        paths.append(prefix)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


@pytest.mark.parametrize("path", all_command_paths(), ids=lambda p: " ".join(p) or "maxckpt")
def test_every_command_has_help(path, capsys):
    code, out, _ = run([*path, "--help"], capsys)
    assert code == 0
    assert "Usage:" in out


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"maxckpt {__version__}"


def test_python_dash_m_and_console_script_agree():
    out = subprocess.run([sys.executable, "-m", "maxckpt", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"maxckpt {__version__}"


def test_config_show_table_lists_values_and_sources(capsys):
    code, out, _ = run(["config", "show", KEEP_LAST, "checkpoint_period=5", "keep_latest_k=4"], capsys)
    assert code == 0
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 3}
    assert "override checkpoint_period=5" in lines["checkpoint_period"]
    assert "│ 5 " in lines["checkpoint_period"]
    assert "keep_latest_k" in lines["max_num_checkpoints_to_keep"]
    assert "keep_last_n_async.yml" in lines["run_name"]
    assert "base.yml" in lines["hardware"]
    assert "/tmp/maxckpt_runs/keep_last_n/checkpoints/" in lines["checkpoint_dir"]
    assert "note: keep_latest_k=4" in out


def test_config_show_json_for_scripts(capsys):
    code, out, _ = run(["config", "show", KEEP_LAST, "--json", "max_num_checkpoints_to_keep=None"], capsys)
    payload = json.loads(out)
    assert code == 0
    assert payload["config"]["max_num_checkpoints_to_keep"] is None
    assert payload["config"]["checkpoint_period"] == 100
    assert payload["sources"]["max_num_checkpoints_to_keep"] == "override max_num_checkpoints_to_keep=None"
    assert payload["checkpoint_dir"] == "/tmp/maxckpt_runs/keep_last_n/checkpoints/"


@pytest.mark.parametrize("name", sorted(p.name for p in bundled_configs_dir().glob("*.yml")))
def test_config_show_every_bundled_overlay(name, capsys):
    code, out, _ = run(["config", "show", str(bundled_configs_dir() / name)], capsys)
    assert code == 0 and "checkpoint_dir" in out


def test_user_error_is_one_line_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "maxckpt", "config", "show", KEEP_LAST, "max_num_checkpoint_to_keep=3"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: unknown config key 'max_num_checkpoint_to_keep' in override max_num_checkpoint_to_keep=3: "
        "neither MaxText nor maxckpt knows it; did you mean 'max_num_checkpoints_to_keep'?"
    ]
    assert proc.stdout == ""


def test_config_show_help_lists_every_key(capsys):
    """The keys and their meaning come from the declarations, so `--help` names each one."""
    code, out, _ = run(["config", "show", "--help"], capsys)
    assert code == 0 and "Keys (MaxText's, then maxckpt's own):" in out
    for spec in FIELDS:
        assert spec.name in out, spec.name


def test_convert_help_names_what_the_family_registry_holds(capsys, monkeypatch):
    """--model's help and the impossible pairs are generated from the registry: every family and MaxText model
    name is listed, and each pair bridge_gap refuses is named with its format."""
    from maxckpt.families import FAMILIES, MAXTEXT_MODELS, bridge_gap

    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run(["convert", "--help"], capsys)
    flat = " ".join(out.replace("│", " ").split())
    assert code == 0
    for name in [*FAMILIES, *MAXTEXT_MODELS]:
        assert name in flat, name
    for fmt in ("megatron", "torchtitan"):  # one line per reason, naming the families it refuses
        by_reason: dict[str, list[str]] = {}
        for f in FAMILIES:
            if (gap := bridge_gap(fmt, f)) is not None:
                by_reason.setdefault(gap, []).append(f)
        for reason, refused in by_reason.items():
            assert f"{fmt}: {', '.join(refused)} ({' '.join(reason.split())})" in flat, (fmt, reason)


def test_missing_overlay_exits_non_zero(tmp_path, capsys):
    code, _, err = run(["config", "show", str(tmp_path / "missing.yml")], capsys)
    assert code != 0 and "does not exist" in err


def test_unexpected_errors_keep_their_traceback(monkeypatch, capsys):
    def boom(*_args, **_kwargs):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr("maxckpt.cli.config_cmd.load_config", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["config", "show", KEEP_LAST])


def test_bad_option_is_a_usage_error(capsys):
    code, _, err = run(["config", "show", KEEP_LAST, "--no-such-flag"], capsys)
    assert code == 2 and "No such option" in err


def test_the_command_collects_less_often_and_leaves_nothing_for_the_exit_collections():
    """Run as `maxckpt`, the collector runs at the command's thresholds (imports of torch, JAX and
    Orbax create ~300k objects) and everything alive at the end is frozen, so the interpreter's
    exit skips walking it (over a second once torch is imported); a caller passing argv keeps its GC."""
    script = (
        "import gc, json, sys\n"
        "from maxckpt.cli.main import main\n"
        "def run(argv):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    return [gc.get_threshold(), gc.get_freeze_count(), len(gc.get_objects())]\n"
        "default = gc.get_threshold()\n"
        "with_argv = run(['--version'])\n"
        "sys.argv = ['maxckpt', '--version']\n"
        "print(json.dumps([default, with_argv, run(None)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    default, with_argv, command = json.loads(out.splitlines()[-1])
    assert with_argv[:2] == [default, 0]  # main(argv) changed nothing
    from maxckpt.cli.main import COMMAND_GC_THRESHOLDS

    assert command[0] == list(COMMAND_GC_THRESHOLDS) != default
    frozen, unfrozen = command[1], command[2]
    assert frozen > 10_000 and unfrozen < 1_000


@pytest.mark.parametrize("dst", ["gs://bkt/run/mt", "s3://bkt/run/mt/", "/data/run/mt"])
def test_the_hand_off_hints_keep_a_bucket_url_intact(dst):
    base = dst.rstrip("/")

    def lines(target: str, step: int | None = None) -> str:
        report = pipeline.ConversionReport(
            Path("/src"), Path("/dst"), "hf", target, tiny_spec("llama2"), step=step, options=ConversionOptions()
        )
        return "\n".join(hand_off_lines(report, dst))

    assert lines("maxtext") == f"MaxText: load_parameters_path={base}/0/items"
    assert lines("megatron", step=3).startswith(f"Megatron-LM: --load {base} --num-layers 2")
    assert lines("torchtitan", step=3).startswith(f"TorchTitan: --checkpoint.initial_load_path {base}/step-3 (model")


def test_a_relative_destination_is_shown_absolute_in_the_hand_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = pipeline.ConversionReport(Path("/src"), Path("/dst"), "hf", "maxtext", tiny_spec("llama2"))
    # MaxText (Orbax) refuses relative paths
    assert hand_off_lines(report, "out") == [f"MaxText: load_parameters_path={tmp_path}/out/0/items"]


def test_convert_to_a_bucket_prints_the_url_as_typed(monkeypatch, capsys):
    """The CLI's own path to the hint; the conversion is stubbed (tests/test_storage/test_storage_convert.py writes to buckets)."""
    def fake_convert(src, dst, *, to, **_):
        return pipeline.ConversionReport(Path(src), Path("/unused"), "hf", to, tiny_spec("llama2"))

    monkeypatch.setattr(pipeline, "convert", fake_convert)
    code, out, err = run(["convert", "/src/hf", "gs://bkt/run/mt", "--to", "maxtext", "-q"], capsys)
    assert code == 0, err
    assert "MaxText: load_parameters_path=gs://bkt/run/mt/0/items" in " ".join(out.split())
