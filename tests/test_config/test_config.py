"""Specification of MaxText base.yml overlay loading (`maxckpt.load_config`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from maxckpt import ConfigError, load_config
from maxckpt.config import FIELDS, CheckpointConfig, bundled_configs_dir, schema
from maxckpt.config.schema import FIELDS_BY_NAME, HARDWARE_CHOICES
from maxckpt.config.loader import maxtext_keys

DATA = Path(__file__).parents[1] / "data"
BUNDLED = sorted(p.name for p in bundled_configs_dir().glob("*.yml"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ----------------------------------------------------------------- resolution


def test_base_next_to_overlay_wins_over_env_and_bundled(tmp_path, monkeypatch):
    write(tmp_path / "local" / "base.yml", "checkpoint_period: 11\n")
    write(tmp_path / "env" / "base.yml", "checkpoint_period: 22\n")
    overlay = write(tmp_path / "local" / "run.yml", "base_config: base.yml\nrun_name: r\n")
    monkeypatch.setenv("MAXTEXT_CONFIGS_DIR", str(tmp_path / "env"))
    cfg = load_config(overlay)
    assert cfg.checkpoint_period == 11
    assert cfg.sources["checkpoint_period"] == str(tmp_path / "local" / "base.yml")


def test_env_dir_wins_over_bundled_base(tmp_path, monkeypatch):
    write(tmp_path / "env" / "base.yml", "checkpoint_period: 22\n")
    overlay = write(tmp_path / "runs" / "run.yml", "base_config: base.yml\n")
    monkeypatch.setenv("MAXTEXT_CONFIGS_DIR", str(tmp_path / "env"))
    assert load_config(overlay).checkpoint_period == 22


def test_bundled_base_is_the_last_resort(tmp_path, monkeypatch):
    monkeypatch.delenv("MAXTEXT_CONFIGS_DIR", raising=False)
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\nmax_num_checkpoints_to_keep: 4\n")
    cfg = load_config(overlay)
    assert cfg.max_num_checkpoints_to_keep == 4
    assert cfg.checkpoint_period == 10_000
    assert cfg.sources["checkpoint_period"] == str(bundled_configs_dir() / "base.yml")


def test_chain_of_any_depth_merges_in_order(tmp_path):
    write(tmp_path / "a.yml", "base_config: base.yml\ncheckpoint_period: 1\nrun_name: a\nmax_num_checkpoints_to_keep: 9\n")
    write(tmp_path / "b.yml", "base_config: a.yml\ncheckpoint_period: 2\nrun_name: b\n")
    write(tmp_path / "c.yml", "base_config: b.yml\ncheckpoint_period: 3\n")
    cfg = load_config(tmp_path / "c.yml")
    assert (cfg.checkpoint_period, cfg.run_name, cfg.max_num_checkpoints_to_keep) == (3, "b", 9)
    assert cfg.sources["run_name"] == str(tmp_path / "b.yml")
    assert cfg.sources["max_num_checkpoints_to_keep"] == str(tmp_path / "a.yml")


def test_overrides_come_last_and_parse_like_yaml(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\ncheckpoint_period: 5\n")
    cfg = load_config(overlay, "checkpoint_period=10_000", "max_num_checkpoints_to_keep=None",
                      "async_checkpointing=false", "maxckpt_exclude_from_loading=[opt_state,step]")
    assert cfg.checkpoint_period == 10_000
    assert cfg.max_num_checkpoints_to_keep is None
    assert cfg.async_checkpointing is False
    assert cfg.maxckpt_exclude_from_loading == ("opt_state", "step")
    assert cfg.sources["checkpoint_period"] == "override checkpoint_period=10_000"


@pytest.mark.parametrize("text", ["None", "none", "null"])
def test_none_strings_become_none(tmp_path, text):
    overlay = write(tmp_path / "run.yml", f"base_config: base.yml\nmax_num_checkpoints_to_keep: {text}\nmaxckpt_keep_period: 3\n")
    assert load_config(overlay, f"maxckpt_keep_period={text}").max_num_checkpoints_to_keep is None
    assert load_config(overlay, f"maxckpt_keep_period={text}").maxckpt_keep_period is None


def test_underscored_numbers_are_ints(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\ncheckpoint_period: 20_000\n")
    assert load_config(overlay).checkpoint_period == 20_000


def test_checkpoint_dir_is_derived_as_maxtext_does(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\nbase_output_directory: gs://bucket/out\nrun_name: exp1\n")
    cfg = load_config(overlay)
    assert cfg.checkpoint_dir == "gs://bucket/out/exp1/checkpoints/"
    local = load_config(overlay, f"base_output_directory={tmp_path}")
    assert local.checkpoint_dir == f"{tmp_path}/exp1/checkpoints/"
    assert load_config(overlay, "base_output_directory=").checkpoint_dir is None


def test_file_without_base_config_uses_schema_defaults(tmp_path):
    cfg = load_config(write(tmp_path / "plain.yml", "run_name: solo\n"))
    assert cfg.run_name == "solo" and cfg.enable_checkpointing is True
    assert cfg.sources["checkpoint_period"] == "default"


# -------------------------------------------------------------------- aliases


@pytest.mark.parametrize(
    "alias,value,key,expected",
    [
        ("keep_latest_k", 3, "max_num_checkpoints_to_keep", 3),
        ("keep_latest_k", 0, "max_num_checkpoints_to_keep", None),
        ("save_total_limit", 2, "max_num_checkpoints_to_keep", 2),
        ("save_interval", 250, "checkpoint_period", 250),
        ("async_save", "false", "async_checkpointing", False),
        ("async_mode", "disabled", "async_checkpointing", False),
        ("async_mode", "async_with_pinned_mem", "async_checkpointing", True),
    ],
)
def test_aliases_map_with_a_note(tmp_path, alias, value, key, expected):
    overlay = write(tmp_path / "run.yml", f"base_config: base.yml\n{alias}: {value}\n")
    cfg = load_config(overlay)
    assert getattr(cfg, key) == expected
    assert any(note.startswith(f"{alias}=") and f"maps to {key}=" in note for note in cfg.notes)
    assert cfg.sources[key].endswith(f"(as {alias})")


def test_alias_and_canonical_key_later_layer_wins(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\nkeep_latest_k: 3\n")
    assert load_config(overlay, "max_num_checkpoints_to_keep=7").max_num_checkpoints_to_keep == 7


# --------------------------------------------------------------------- errors


def error_of(*args) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args)
    return str(info.value)


def test_unknown_key_names_file_and_suggests(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\nmax_num_checkpoint_to_keep: 3\n")
    msg = error_of(overlay)
    assert "unknown config key 'max_num_checkpoint_to_keep'" in msg
    assert str(overlay) in msg
    assert "did you mean 'max_num_checkpoints_to_keep'?" in msg


def test_unknown_override_is_named(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\n")
    msg = error_of(overlay, "checkpoint_perod=3")
    assert "override checkpoint_perod=3" in msg and "did you mean 'checkpoint_period'?" in msg


def test_unknown_key_without_close_match(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\nzzz_qqq: 1\n")
    assert "unknown config key 'zzz_qqq'" in error_of(overlay)


@pytest.mark.parametrize(
    "line,pattern",
    [
        ("checkpoint_period: abc", r"checkpoint_period: expected an integer, got 'abc' \(str\)"),
        ("enable_checkpointing: maybe", r"enable_checkpointing: expected a boolean \(true/false\), got 'maybe'"),
        ("max_num_checkpoints_to_keep: 2.5", r"max_num_checkpoints_to_keep: expected an integer, got 2.5 \(float\)"),
        ("hardware: fpga", r"hardware: expected one of tpu, gpu, gpu_multiprocess, cpu, got 'fpga'"),
        ("run_name: [a, b]", r"run_name: expected a string, got \['a', 'b'\]"),
        ("maxckpt_export_dtype: int8", r"maxckpt_export_dtype: expected one of bfloat16, float32, float16"),
        ("maxckpt_exclude_from_loading: {a: 1}", r"maxckpt_exclude_from_loading: expected a list of strings"),
    ],
)
def test_type_errors_name_key_value_type_and_file(tmp_path, line, pattern):
    overlay = write(tmp_path / "run.yml", f"base_config: base.yml\n{line}\n")
    msg = error_of(overlay)
    assert re.search(pattern, msg), msg
    assert str(overlay) in msg


@pytest.mark.parametrize(
    "lines,needle",
    [
        (["load_parameters_path: /a", "load_full_state_path: /b"], "MaxText allows at most one"),
        (["enable_emergency_checkpoint: true", "local_checkpoint_period: 5"], "local_checkpoint_directory is empty"),
        (["enable_emergency_checkpoint: true", "local_checkpoint_directory: /l"], "local_checkpoint_period is 0"),
        (["checkpoint_period: 0"], "checkpoint_period: expected a positive integer, got 0"),
        (["max_num_checkpoints_to_keep: 0"], "max_num_checkpoints_to_keep: expected a positive integer"),
        (["maxckpt_keep_period: -2"], "maxckpt_keep_period: expected a positive integer"),
        (["maxckpt_load_step: -1"], "maxckpt_load_step: expected a step >= 0"),
        (["local_checkpoint_period: -1"], "local_checkpoint_period: expected 0 or more"),
        (["maxckpt_export_on_completion: [hf, onnx]"], "unknown format 'onnx'"),
    ],
)
def test_maxtext_rules_and_ranges(tmp_path, lines, needle):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\n" + "\n".join(lines) + "\n")
    assert needle in error_of(overlay)


def test_missing_overlay(tmp_path):
    assert f"config file {tmp_path / 'nope.yml'} does not exist" in error_of(tmp_path / "nope.yml")


def test_missing_base_lists_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXTEXT_CONFIGS_DIR", str(tmp_path / "env"))
    overlay = write(tmp_path / "run.yml", "base_config: models/llama9.yml\n")
    msg = error_of(overlay)
    assert "base_config 'models/llama9.yml' not found" in msg
    assert str(tmp_path) in msg and str(tmp_path / "env") in msg and "MAXTEXT_CONFIGS_DIR" in msg


def test_missing_absolute_base(tmp_path):
    overlay = write(tmp_path / "run.yml", f"base_config: {tmp_path / 'gone.yml'}\n")
    assert "does not exist" in error_of(overlay)


def test_cycle_is_reported(tmp_path):
    write(tmp_path / "a.yml", "base_config: b.yml\n")
    write(tmp_path / "b.yml", "base_config: a.yml\n")
    assert "loops back on itself" in error_of(tmp_path / "a.yml")


def test_broken_yaml_and_non_mapping(tmp_path):
    assert "is not valid YAML (" in error_of(write(tmp_path / "bad.yml", "a: [1, 2\n"))
    assert "is not a mapping of config keys (it holds a list)" in error_of(write(tmp_path / "list.yml", "- 1\n- 2\n"))


def test_override_without_equals(tmp_path):
    overlay = write(tmp_path / "run.yml", "base_config: base.yml\n")
    assert "is not of the form key=value" in error_of(overlay, "checkpoint_period")


# ---------------------------------------------------- bundled files and MaxText


def test_bundled_base_matches_the_schema():
    """configs/base.yml documents every key with the schema's default, and nothing else."""
    base = bundled_configs_dir() / "base.yml"
    raw = yaml.safe_load(base.read_text())
    assert list(raw) == [f.name for f in FIELDS]
    cfg = load_config(base)
    for spec in FIELDS:
        assert getattr(cfg, spec.name) == spec.default, spec.name
    text = base.read_text()
    for spec in FIELDS:  # each key has a comment line right above it (or above its group)
        assert f"\n{spec.name}:" in text


@pytest.mark.parametrize("name", [n for n in BUNDLED if n != "base.yml"])
def test_every_bundled_overlay_sets_declared_keys_over_the_declared_defaults(name):
    """A shipped overlay sets only keys CheckpointConfig declares; every other key keeps its declared default."""
    raw = yaml.safe_load((bundled_configs_dir() / name).read_text())
    assert raw.pop("base_config") == "base.yml"
    assert set(raw) <= set(FIELDS_BY_NAME), sorted(set(raw) - set(FIELDS_BY_NAME))
    cfg = load_config(bundled_configs_dir() / name)
    for spec in FIELDS:
        wanted = spec.coerce(spec.name, raw[spec.name], name) if spec.name in raw else spec.default
        assert getattr(cfg, spec.name) == wanted, spec.name


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_overlay_loads(name):
    cfg = load_config(bundled_configs_dir() / name)
    assert cfg.checkpoint_dir is None or cfg.checkpoint_dir.endswith("/checkpoints/")
    if name != "base.yml":
        assert cfg.checkpoint_dir, f"{name} should set base_output_directory and run_name"


def test_bundled_presets_say_what_they_promise():
    load = lambda n: load_config(bundled_configs_dir() / n)  # noqa: E731
    assert load("keep_last_n_async.yml").max_num_checkpoints_to_keep == 3
    assert load("keep_period_archival.yml").maxckpt_keep_period == 1000
    assert load("params_only_finetune.yml").load_parameters_path
    two_tier = load("emergency_two_tier.yml")
    assert two_tier.enable_emergency_checkpoint and two_tier.local_checkpoint_period > 0
    assert load("tpu_v5e_gcs.yml").checkpoint_dir.startswith("gs://")
    assert load("rocm_mi300x_nvme.yml").hardware == "gpu"
    assert load("handoff_hf.yml").maxckpt_export_on_completion == ("hf",)
    assert load("handoff_megatron.yml").maxckpt_export_on_completion == ("megatron",)
    assert load("handoff_torchtitan.yml").maxckpt_export_on_completion == ("torchtitan",)


def test_real_maxtext_base_yml_as_the_base(tmp_path, monkeypatch):
    """MaxText's own base.yml uses the same names; model/data keys pass through untouched."""
    configs = tmp_path / "maxtext_configs"
    configs.mkdir()
    (configs / "base.yml").write_text((DATA / "maxtext_base.yml").read_text())
    monkeypatch.setenv("MAXTEXT_CONFIGS_DIR", str(configs))
    overlay = write(tmp_path / "exp" / "run.yml",
                    "base_config: base.yml\nrun_name: exp\nbase_output_directory: /out\n"
                    "per_device_batch_size: 4\nmax_num_checkpoints_to_keep: 2\nmaxckpt_keep_period: 50\n")
    cfg = load_config(overlay, "steps=20", "async_checkpointing=False")
    assert cfg.checkpoint_period == 10_000 and cfg.max_num_checkpoints_to_keep == 2
    assert cfg.async_checkpointing is False and cfg.maxckpt_keep_period == 50
    assert cfg.sources["checkpoint_period"] == str(configs / "base.yml")
    assert cfg.sources["maxckpt_export_dtype"] == "default"
    assert cfg.extra["per_device_batch_size"] == 4
    assert cfg.extra["steps"] == 20
    assert cfg.extra["mlp_activations"] == ["silu", "linear"]
    assert cfg.extra["debug"] == {"rl": False}
    assert cfg.extra["brand_new_maxtext_knob"] == 7
    assert cfg.extra["checkpoint_conversion_fn"] is None
    assert cfg.checkpoint_dir == "/out/exp/checkpoints/"
    # A typo in the user's own overlay is still caught.
    bad = write(tmp_path / "exp" / "bad.yml", "base_config: base.yml\nper_device_batch_sise: 4\n")
    assert "did you mean 'per_device_batch_size'?" in error_of(bad)


def test_maxtext_key_list_covers_the_checkpoint_keys():
    keys = maxtext_keys()
    for spec in FIELDS:
        assert (spec.name in keys) == spec.maxtext, spec.name


def test_with_overrides_validates():
    cfg = load_config(bundled_configs_dir() / "keep_last_n_async.yml")
    assert cfg.with_overrides(checkpoint_period=7).checkpoint_period == 7
    with pytest.raises(ConfigError, match="expected a positive integer"):
        cfg.with_overrides(checkpoint_period=0)
    with pytest.raises(ConfigError, match="unknown config key 'checkpoint_perod' in with_overrides.*did you mean 'checkpoint_period'"):
        cfg.with_overrides(checkpoint_perod=7)


def test_each_key_is_one_field_with_its_help_and_maxtext_flag():
    """The fields of CheckpointConfig are the keys: FIELDS is derived from them, nothing is declared twice."""
    keys = [f for f in dataclasses.fields(CheckpointConfig) if f.name not in ("extra", "sources", "notes")]
    for f in keys:
        assert f.metadata["help"] and isinstance(f.metadata["maxtext"], bool), f.name
        assert f.metadata["maxtext"] != f.name.startswith("maxckpt_"), f.name
    assert [spec.help for spec in FIELDS] == [f.metadata["help"] for f in keys]


def test_coercion_and_bounds_come_from_the_declaration():
    by_name = FIELDS_BY_NAME
    for spec in FIELDS:  # every default is a value of its own annotation
        assert spec.coerce(spec.name, spec.default, "") == spec.default, spec.name
    assert by_name["max_num_checkpoints_to_keep"].coerce("k", None, "") is None  # int | None
    assert by_name["max_num_checkpoints_to_keep"].coerce("k", "1_000", "") == 1000
    assert by_name["maxckpt_exclude_from_loading"].coerce("k", "a, b", "") == ("a", "b")  # tuple[str, ...]
    assert by_name["hardware"].coerce("k", "gpu", "") == "gpu"  # Literal[...]
    assert HARDWARE_CHOICES == ("tpu", "gpu", "gpu_multiprocess", "cpu")
    assert [s.name for s in FIELDS if s.minimum == 1] == [
        "checkpoint_period", "max_num_checkpoints_to_keep", "checkpoint_storage_concurrent_gb", "maxckpt_keep_period"
    ]
    with pytest.raises(TypeError, match="CheckpointConfig.x: no coercion for the annotation"):
        schema._coercion("x", dict[str, int])


def test_the_dataclass_and_the_field_table_agree():
    attrs = [f for f in dataclasses.fields(CheckpointConfig) if f.name not in ("extra", "sources", "notes")]
    assert [f.name for f in attrs] == [spec.name for spec in FIELDS]
    assert [f.default for f in attrs] == [spec.default for spec in FIELDS]
