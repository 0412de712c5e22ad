"""A MaxText source's model settings come from its run's own config, resolved as MaxText does; what comes
from a preset instead is named. Ground truth: the MaxText-written family fixtures, made with
`model_name=<m> override_model_config=true` plus tiny dims and top-k on MaxText's command line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from maxckpt.conversion.options import SourceOptions
from maxckpt.config.maxtext_run import resolve_run_config
from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.verify import transformers_logits, verify_logits
from maxckpt.errors import ConfigError, ShapeMismatchError

TINY = {"base_emb_dim": 64, "base_num_query_heads": 4, "base_num_kv_heads": 2, "head_dim": 16, "vocab_size": 256}
# fixture -> (model_name, the run's command-line overrides beyond model_name / override_model_config)
RUNS = {
    "gpt_oss_scan": ("gpt-oss-20b", {**TINY, "base_num_decoder_layers": 4, "num_experts": 4, "num_experts_per_tok": 2,
                                     "base_moe_mlp_dim": 32}),
    "qwen3_moe_scan": ("qwen3-30b-a3b", {**TINY, "base_num_decoder_layers": 2, "num_experts": 4,
                                         "num_experts_per_tok": 2, "base_moe_mlp_dim": 96}),
    "gemma2_scan": ("gemma2-2b", {**TINY, "base_mlp_dim": 128, "base_num_decoder_layers": 2}),
}
# What the family tests pass by hand for the same fixtures (validated against MaxText's logits there).
BY_HAND = {"gpt_oss_scan": ("gpt-oss-20b", {"num_experts_per_tok": 2}),
           "qwen3_moe_scan": ("qwen3-30b-a3b", {"num_experts_per_tok": 2}),
           "gemma2_scan": ("gemma2-2b", {})}


def _src(root, name):
    return root / name / "checkpoints" / "5" / "items"


def _config(tmp_path, model_name: str) -> str:
    path = tmp_path / "run.yml"
    path.write_text(yaml.safe_dump({"base_config": "base.yml", "model_name": model_name}))
    return str(path)


def _same_output(a, b) -> None:
    ra, rb = SafetensorsReader(a), SafetensorsReader(b)
    assert set(ra.tensors()) == set(rb.tensors())
    for n in ra.tensors():
        assert ra.read(n).tobytes() == rb.read(n).tobytes(), n
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (a, b))
    assert "maxckpt_assumed_settings" not in ca  # `a` is settled by the run's config: nothing assumed
    cb.pop("maxckpt_assumed_settings", None)  # `b`, by hand, records what it took from the preset
    assert ca == cb


def test_resolution_follows_maxtexts_order(tmp_path):
    """The model file beats the config file; the command line beats both only with override_model_config."""
    path = tmp_path / "run.yml"
    path.write_text(yaml.safe_dump({"base_config": "base.yml", "model_name": "gpt-oss-20b", "base_emb_dim": 64,
                                    "num_experts_per_tok": 2}))
    run = resolve_run_config(path)
    assert run.values["base_emb_dim"] == 2880 and run.sources["base_emb_dim"].startswith("models/gpt-oss-20b.yml")
    assert run.values["num_experts_per_tok"] == 4  # the model file's, as MaxText would train
    with pytest.raises(ConfigError, match="override_model_config=true"):
        resolve_run_config(path, ["num_experts_per_tok=2"])
    run = resolve_run_config(path, ["num_experts_per_tok=2", "override_model_config=true", "base_emb_dim=64"])
    assert (run.values["num_experts_per_tok"], run.values["base_emb_dim"]) == (2, 64)
    assert run.sources["num_experts_per_tok"] == "--set num_experts_per_tok=2"
    assert run.values["sliding_window_size"] == 128  # still the model file's where the command line is silent


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_runs_config_gives_what_the_validated_settings_give(maxtext_fixtures, tmp_path, name):
    model_name, cli = RUNS[name]
    sets = {"override_model_config": True, **cli}
    report = convert(_src(maxtext_fixtures, name), tmp_path / "from_config", to="hf",
                     source=SourceOptions(maxtext_config=_config(tmp_path, model_name), overrides=sets))
    assert any(n.startswith("model settings from") for n in report.notes), report.notes
    model, by_hand = BY_HAND[name]
    convert(_src(maxtext_fixtures, name), tmp_path / "by_hand", to="hf", model=model, source=SourceOptions(overrides=by_hand))
    _same_output(tmp_path / "from_config", tmp_path / "by_hand")


def test_gpt_oss_from_its_config_gives_maxtexts_logits(maxtext_fixtures, tmp_path):
    model_name, cli = RUNS["gpt_oss_scan"]
    convert(_src(maxtext_fixtures, "gpt_oss_scan"), tmp_path / "hf", to="hf", dtype="float32",
            source=SourceOptions(maxtext_config=_config(tmp_path, model_name), overrides={"override_model_config": True, **cli}))
    expected = np.load(maxtext_fixtures / "logits" / "gpt_oss_scan_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / "gpt_oss_scan_step5_tokens.npy")
    with open_checkpoint(tmp_path / "hf") as hf:
        logits = transformers_logits(hf, tokens)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_settings_other_than_the_presets_reach_every_output(maxtext_fixtures, tmp_path):
    """A run trained with its own window and rope theta: config.json, the reference forward and transformers
    all use the run's values, not gpt-oss-20b's 128 and 150000."""
    model_name, cli = RUNS["gpt_oss_scan"]
    sets = {"override_model_config": True, **cli, "sliding_window_size": 4, "rope_max_timescale": 20000}
    src = _src(maxtext_fixtures, "gpt_oss_scan")
    config = _config(tmp_path, model_name)
    report = convert(src, tmp_path / "hf", to="hf", source=SourceOptions(maxtext_config=config, overrides=sets))
    assert (report.spec.sliding_window, report.spec.rope_theta) == (4, 20000)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["sliding_window"] == 4 and hf_config["rope_parameters"]["rope_theta"] == 20000
    same = verify_logits(src, tmp_path / "hf", source=SourceOptions(maxtext_config=config, overrides=sets))
    assert same.ok, same
    preset = verify_logits(src, tmp_path / "hf", model="gpt-oss-20b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert not preset.ok  # the preset's window and theta compute other logits


def test_a_config_of_another_model_is_refused(maxtext_fixtures, tmp_path):
    """Without the run's tiny-dims overrides the model file's dims contradict the tensors."""
    with pytest.raises(ShapeMismatchError, match="does not belong to these weights"):
        convert(_src(maxtext_fixtures, "gpt_oss_scan"), tmp_path / "hf", to="hf",
                source=SourceOptions(maxtext_config=_config(tmp_path, "gpt-oss-20b")))
    assert not (tmp_path / "hf").exists()


def test_a_run_dir_with_maxtexts_config_yml_needs_no_flags(maxtext_fixtures, tmp_path):
    """MaxText's save_config_to_gcs writes the resolved keys to <run>/config.yml: read without flags."""
    model_name, cli = RUNS["gemma2_scan"]
    run_dir = tmp_path / "run"
    shutil.copytree(maxtext_fixtures / "gemma2_scan", run_dir)
    resolved = resolve_run_config(None, [f"model_name={model_name}", "override_model_config=true",
                                         *(f"{k}={v}" for k, v in cli.items())])
    (run_dir / "config.yml").write_text(yaml.safe_dump(dict(resolved.values)))
    report = convert(run_dir / "checkpoints", tmp_path / "hf", to="hf")
    assert report.spec.family == "gemma2"
    assert any("config.yml (written by MaxText for the run)" in n for n in report.notes), report.notes
    convert(_src(maxtext_fixtures, "gemma2_scan"), tmp_path / "by_hand", to="hf", model="gemma2-2b")
    _same_output(tmp_path / "hf", tmp_path / "by_hand")


def test_without_a_config_every_assumed_value_is_named(maxtext_fixtures, tmp_path):
    report = convert(_src(maxtext_fixtures, "gpt_oss_scan"), tmp_path / "hf", to="hf", model="gpt-oss-20b",
                     source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    [note] = [n for n in report.notes if n.startswith("assumed from the gpt-oss-20b preset")]
    for shown in ("sliding_window=128", "rope_theta=150000", "rms_norm_eps=1e-05", "rope_scaling="):
        assert shown in note, note
    assert "num_experts_per_tok" not in note  # stated by --set
    assert "--maxtext-config" in note


def test_a_maxtext_config_for_another_format_is_refused(maxtext_fixtures, tmp_path):
    convert(_src(maxtext_fixtures, "gemma2_scan"), tmp_path / "hf", to="hf", model="gemma2-2b")
    with pytest.raises(ConfigError, match="describes a MaxText run"):
        convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", source=SourceOptions(maxtext_config=_config(tmp_path, "gemma2-2b")))
    with pytest.raises(ConfigError, match="only a MaxText source reads"):
        convert(tmp_path / "hf", tmp_path / "mt", to="maxtext", source=SourceOptions(overrides={"base_emb_dim": 64}))


def test_cli_convert_takes_the_runs_config(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    model_name, cli = RUNS["qwen3_moe_scan"]
    sets = [f"--set={k}={v}" for k, v in {"override_model_config": "true", **cli}.items()]
    code, out, err = run_cli(["convert", _src(maxtext_fixtures, "qwen3_moe_scan"), tmp_path / "hf", "--to", "hf",
                              "--maxtext-config", _config(tmp_path, model_name), *sets], capsys)
    assert code == 0, out + err
    assert "model settings from" in out + err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_experts_per_tok"] == 2


def test_ls_shows_what_the_runs_record_says(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    run_dir = tmp_path / "run"
    shutil.copytree(maxtext_fixtures / "gemma2_scan", run_dir)
    resolved = resolve_run_config(None, ["model_name=gemma2-2b", "override_model_config=true", "base_emb_dim=64"])
    (run_dir / "config.yml").write_text(yaml.safe_dump(dict(resolved.values)))
    code, out, err = run_cli(["ls", run_dir / "checkpoints"], capsys)
    assert code == 0, out + err
    text = " ".join((out + err).split())
    assert f"model settings recorded in {run_dir / 'config.yml'}" in text and "model_name=gemma2-2b" in text


def test_the_outputs_record_what_was_assumed_from_the_preset(maxtext_fixtures, tmp_path):
    """config.json and Megatron's common.pt args name each value taken from the preset; transformers loads the
    config, and a later conversion of the output reads no setting from the record."""
    import torch
    import transformers

    src = _src(maxtext_fixtures, "gpt_oss_scan")
    convert(src, tmp_path / "hf", to="hf", model="gpt-oss-20b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    record = config["maxckpt_assumed_settings"]
    assert record["source"] == "gpt-oss-20b preset"
    assert (record["sliding_window"], record["rope_theta"], record["rms_norm_eps"]) == (128, 150000.0, 1e-05)
    assert record["rope_scaling"]["rope_type"] == "yarn" and "num_experts_per_tok" not in record  # --set stated it
    assert transformers.AutoConfig.from_pretrained(tmp_path / "hf").maxckpt_assumed_settings == record
    assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")).__name__ == "GptOssForCausalLM"
    again = convert(tmp_path / "hf", tmp_path / "hf2", to="hf")  # HF source: its settings are the config's own
    assert "maxckpt_assumed_settings" not in json.loads((tmp_path / "hf2" / "config.json").read_text())
    assert again.spec.sliding_window == 128

    convert(src, tmp_path / "meg", to="megatron", model="gpt-oss-20b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    [common] = (tmp_path / "meg").glob("*/common.pt")
    assert torch.load(common, weights_only=False)["args"].maxckpt_assumed_settings == record
    back = convert(tmp_path / "meg", tmp_path / "hf3", to="hf")
    assert back.spec.sliding_window == 128
    assert "maxckpt_assumed_settings" not in json.loads((tmp_path / "hf3" / "config.json").read_text())


def test_nothing_is_recorded_with_the_runs_config(maxtext_fixtures, tmp_path):
    import torch

    model_name, cli = RUNS["gpt_oss_scan"]
    sets = {"override_model_config": True, **cli}
    config = _config(tmp_path, model_name)
    convert(_src(maxtext_fixtures, "gpt_oss_scan"), tmp_path / "hf", to="hf", source=SourceOptions(maxtext_config=config, overrides=sets))
    assert "maxckpt_assumed_settings" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    convert(_src(maxtext_fixtures, "gpt_oss_scan"), tmp_path / "meg", to="megatron", source=SourceOptions(maxtext_config=config, overrides=sets))
    [common] = (tmp_path / "meg").glob("*/common.pt")
    assert not hasattr(torch.load(common, weights_only=False)["args"], "maxckpt_assumed_settings")


def test_inspect_names_the_settings_a_conversion_would_use(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    model_name, cli = RUNS["gpt_oss_scan"]
    sets = [f"--set={k}={v}" for k, v in {"override_model_config": "true", **cli, "sliding_window_size": 4}.items()]
    src = _src(maxtext_fixtures, "gpt_oss_scan")
    code, out, err = run_cli(["inspect", src, "--maxtext-config", _config(tmp_path, model_name), *sets], capsys)
    assert code == 0, out + err
    text = " ".join((out + err).split())
    assert "a conversion would read this checkpoint as gpt-oss" in text and "model settings from" in text, text
    assert "sliding_window=4" in text and "assumed from" not in text
    code, out, err = run_cli(["inspect", src, "--model", "gpt-oss-20b", "--set", "num_experts_per_tok=2"], capsys)
    assert code == 0, out + err
    text = " ".join((out + err).split())
    assert "assumed from the gpt-oss-20b preset" in text and "sliding_window=128" in text, text
    code, out, err = run_cli(["inspect", src], capsys)  # no flags, no record: the tree alone
    assert code == 0 and "a conversion would read" not in out + err


def test_inspect_reads_the_run_dirs_record(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    from maxckpt.explore.tree import inspect_checkpoint

    model_name, cli = RUNS["gemma2_scan"]
    run_dir = tmp_path / "run"
    shutil.copytree(maxtext_fixtures / "gemma2_scan", run_dir)
    resolved = resolve_run_config(None, [f"model_name={model_name}", "override_model_config=true",
                                         *(f"{k}={v}" for k, v in cli.items())])
    (run_dir / "config.yml").write_text(yaml.safe_dump(dict(resolved.values)))
    notes = " ".join(inspect_checkpoint(run_dir / "checkpoints").notes)
    assert "a conversion would read this checkpoint as gemma2" in notes
    assert "config.yml (written by MaxText for the run)" in notes, notes
    code, out, err = run_cli(["inspect", run_dir / "checkpoints", "--json"], capsys)
    assert code == 0 and "model settings from" in out, out + err


def test_inspect_refuses_a_maxtext_config_for_another_format(maxtext_fixtures, tmp_path, capsys):
    from cli_runner import run_cli

    convert(_src(maxtext_fixtures, "gemma2_scan"), tmp_path / "hf", to="hf", model="gemma2-2b")
    code, out, err = run_cli(["inspect", tmp_path / "hf", "--maxtext-config", _config(tmp_path, "gemma2-2b")], capsys)
    assert code != 0 and "describes a MaxText run" in " ".join((out + err).split()), out + err


def test_another_tools_config_yml_beside_checkpoints_is_not_read(maxtext_fixtures, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(maxtext_fixtures / "gemma2_scan", run_dir)
    (run_dir / "config.yml").write_text(yaml.safe_dump({"rope_max_timescale": 1, "learning_rate": 0.1}))
    report = convert(run_dir / "checkpoints", tmp_path / "hf", to="hf", model="gemma2-2b")
    assert report.spec.rope_theta == 10000.0
    assert not any(n.startswith("model settings from") for n in report.notes)


def test_a_run_saved_by_maxckpts_manager_with_its_model_config_converts_with_no_flags(maxtext_fixtures, tmp_path):
    """CheckpointManager(model_config=...) records the run's MaxText keys before its first save; the run then
    converts with no --model and no --set, and transformers gives MaxText's logits."""
    from maxckpt import CheckpointManager

    model_name, cli = RUNS["gpt_oss_scan"]
    with CheckpointManager(maxtext_fixtures / "gpt_oss_scan" / "checkpoints", async_save=False) as source:
        state = source.restore()
    run = tmp_path / "run"
    model_config = {"model_name": model_name, "override_model_config": True, **cli}
    with CheckpointManager(run / "checkpoints", async_save=False, model_config=model_config) as mgr:
        assert (run / "maxckpt_run_config.yml").is_file()  # before the first save
        mgr.save(5, state, force=True)
    recorded = yaml.safe_load((run / "maxckpt_run_config.yml").read_text())
    assert recorded["num_experts_per_tok"] == 2 and recorded["model_name"] == model_name
    report = convert(run, tmp_path / "hf", to="hf", dtype="float32")
    assert report.spec.num_experts_per_tok == 2 and report.spec.family == "gpt-oss"
    assert not [n for n in report.notes if n.startswith("assumed from")], report.notes
    expected = np.load(maxtext_fixtures / "logits" / "gpt_oss_scan_step5.npy")
    tokens = np.load(maxtext_fixtures / "logits" / "gpt_oss_scan_step5_tokens.npy")
    with open_checkpoint(tmp_path / "hf") as hf:
        logits = transformers_logits(hf, tokens)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_a_manager_pointed_at_its_own_folder_keeps_the_record_there(tmp_path):
    from maxckpt import CheckpointManager
    from maxckpt.config.maxtext_run import read_run_config_file, run_config_file

    folder = tmp_path / "ckpts"
    with CheckpointManager(folder, async_save=False, model_config={"model_name": "qwen3-0.6b"}) as mgr:
        mgr.save(0, {"params": {"w": np.ones((2,), np.float32)}}, force=True)
    found = run_config_file(folder / "0")
    assert found == str(folder / "maxckpt_run_config.yml")
    assert read_run_config_file(found).model_name == "qwen3-0.6b"


def test_a_model_config_naming_an_unknown_model_is_refused_before_anything_is_written(tmp_path):
    from maxckpt import CheckpointManager

    with pytest.raises(ConfigError, match="no models/no-such-model.yml"):
        CheckpointManager(tmp_path / "run" / "checkpoints", model_config={"model_name": "no-such-model"})
    assert not (tmp_path / "run").exists()
