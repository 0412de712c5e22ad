"""The typed checkpoint config: MaxText's checkpoint keys plus maxckpt's own.

Each field is declared in :data:`FIELDS` with its type, MaxText 0.2.5's
default and a one-line meaning; the validation, `config show` and the test
that keeps `configs/base.yml` honest all read that table. A new key is one
line there, a typed attribute of :class:`CheckpointConfig` (so editors and
type checkers see it; a test keeps the two in step) and one commented line in
`configs/base.yml`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from maxckpt.errors import ConfigError

HARDWARE_CHOICES = ("tpu", "gpu", "gpu_multiprocess", "cpu")
EXPORT_FORMATS = ("hf", "megatron", "torchtitan", "torch")
EXPORT_DTYPES = ("bfloat16", "float32", "float16")


def _where(source: str) -> str:
    return f" (set in {source})" if source else ""


def _to_bool(key: str, value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(
        f"{key}: expected a boolean (true/false), got {value!r} ({type(value).__name__}){_where(source)}"
    )


def _to_int(key: str, value: Any, source: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if text.lstrip("+-").isdigit():
            return int(text)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ConfigError(
        f"{key}: expected an integer, got {value!r} ({type(value).__name__}){_where(source)}"
    )


def _to_optional_int(key: str, value: Any, source: str) -> int | None:
    return None if value is None else _to_int(key, value, source)


def _to_str(key: str, value: Any, source: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(
        f"{key}: expected a string, got {value!r} ({type(value).__name__}){_where(source)}"
    )


def _to_str_list(key: str, value: Any, source: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(
        f"{key}: expected a list of strings (or a comma-separated string), got {value!r}{_where(source)}"
    )


def _choice(options: tuple[str, ...]) -> Callable[[str, Any, str], str]:
    def coerce(key: str, value: Any, source: str) -> str:
        text = _to_str(key, value, source)
        if text not in options:
            raise ConfigError(
                f"{key}: expected one of {', '.join(options)}, got {value!r}{_where(source)}"
            )
        return text

    coerce.__name__ = "one of " + "|".join(options)
    return coerce


@dataclass(frozen=True)
class FieldSpec:
    """One config key: how to coerce it, its default, what it means."""

    name: str
    coerce: Callable[[str, Any, str], Any]
    default: Any
    help: str
    type_name: str
    maxtext: bool = True  # False for maxckpt's own `maxckpt_*` keys


def _f(name: str, coerce: Callable, default: Any, type_name: str, help: str, maxtext: bool = True) -> FieldSpec:
    return FieldSpec(name, coerce, default, help, type_name, maxtext)


FIELDS: tuple[FieldSpec, ...] = (
    _f("enable_checkpointing", _to_bool, True, "bool", "save checkpoints at all; false makes every save a no-op"),
    _f("async_checkpointing", _to_bool, True, "bool", "save in the background; training blocks only for the device-to-host copy"),
    _f("checkpoint_period", _to_int, 10_000, "int", "save every this many steps"),
    _f("max_num_checkpoints_to_keep", _to_optional_int, None, "int|None", "keep the newest N committed checkpoints (None keeps all)"),
    _f("save_checkpoint_on_completion", _to_bool, True, "bool", "save the final step when training ends"),
    _f("load_parameters_path", _to_str, "", "str", "start from the params of this checkpoint (fresh optimizer and step)"),
    _f("load_full_state_path", _to_str, "", "str", "start from the full train state of this checkpoint"),
    _f("base_output_directory", _to_str, "", "str", "root for runs; checkpoints go to <base>/<run_name>/checkpoints/"),
    _f("run_name", _to_str, "", "str", "name of this run; an existing run of that name resumes"),
    _f("checkpoint_storage_use_ocdbt", _to_bool, True, "bool", "store arrays in OCDBT (few large files)"),
    _f("checkpoint_storage_use_zarr3", _to_bool, True, "bool", "store arrays as zarr v3 (else zarr v2)"),
    _f("checkpoint_storage_target_data_file_size_bytes", _to_int, 67_108_864, "int", "target size of OCDBT data files and largest chunk (MaxText: 2 GiB)"),
    _f("checkpoint_storage_concurrent_gb", _to_int, 96, "int", "bytes in flight during save/restore, in GB"),
    _f("enable_single_replica_ckpt_restoring", _to_bool, False, "bool", "one replica reads, then broadcasts to the others"),
    _f("enable_emergency_checkpoint", _to_bool, False, "bool", "two-tier: frequent local saves plus periodic persistent ones"),
    _f("local_checkpoint_directory", _to_str, "", "str", "fast local storage for two-tier saves"),
    _f("local_checkpoint_period", _to_int, 0, "int", "save to the local tier every this many steps"),
    _f("scan_layers", _to_bool, True, "bool", "layers are stacked on one axis (recorded in the checkpoint's custom metadata)"),
    _f("hardware", _choice(HARDWARE_CHOICES), "tpu", "str", "tpu, gpu, gpu_multiprocess or cpu"),
    _f("model_name", _to_str, "default", "str", "MaxText model name; picks the family for exports"),
    _f("maxckpt_keep_period", _to_optional_int, None, "int|None", "also keep every step divisible by this forever", False),
    _f("maxckpt_load_step", _to_optional_int, None, "int|None", "restore this step instead of the newest", False),
    _f("maxckpt_exclude_from_loading", _to_str_list, (), "list[str]", "state items not to restore (e.g. opt_state)", False),
    _f("maxckpt_skip_optimizer_state", _to_bool, False, "bool", "save without opt_state (smaller, not resumable)", False),
    _f("maxckpt_storage_compression", _to_bool, False, "bool", "zstd-compress saved arrays as MaxText does (smaller, CPU-bound saves)", False),
    _f("maxckpt_export_on_completion", _to_str_list, (), "list[str]", "after the final save, export to hf, megatron, torchtitan and/or torch", False),
    _f("maxckpt_export_dtype", _choice(EXPORT_DTYPES), "bfloat16", "str", "dtype of exported weights", False),
    _f("maxckpt_export_directory", _to_str, "", "str", "where exports go (default <base>/<run_name>/export/)", False),
)

FIELDS_BY_NAME: Mapping[str, FieldSpec] = {f.name: f for f in FIELDS}

# Keys other frameworks use for the same knobs: (canonical key, value mapping, where it comes from).
ALIASES: Mapping[str, tuple[str, Callable[[Any], Any], str]] = {
    "keep_latest_k": ("max_num_checkpoints_to_keep", lambda v: None if v in (0, "0") else v, "TorchTitan; 0 keeps all"),
    "save_total_limit": ("max_num_checkpoints_to_keep", lambda v: v, "HF Trainer"),
    "save_interval": ("checkpoint_period", lambda v: v, "Megatron/TorchTitan"),
    "async_save": ("async_checkpointing", lambda v: v, "Megatron"),
    "async_mode": (
        "async_checkpointing",
        lambda v: (v.strip().lower() != "disabled") if isinstance(v, str) else v,
        "TorchTitan; 'disabled' is false, 'async'/'async_with_pinned_mem' true",
    ),
}


@dataclass(frozen=True)
class CheckpointConfig:
    """The effective, validated checkpoint config of one run.

    Build it with :func:`maxckpt.load_config`; keys MaxText knows but maxckpt
    does not use are kept untouched in :attr:`extra`, and :attr:`sources`
    says which file or override set each key.
    """

    enable_checkpointing: bool = True
    async_checkpointing: bool = True
    checkpoint_period: int = 10_000
    max_num_checkpoints_to_keep: int | None = None
    save_checkpoint_on_completion: bool = True
    load_parameters_path: str = ""
    load_full_state_path: str = ""
    base_output_directory: str = ""
    run_name: str = ""
    checkpoint_storage_use_ocdbt: bool = True
    checkpoint_storage_use_zarr3: bool = True
    checkpoint_storage_target_data_file_size_bytes: int = 67_108_864
    checkpoint_storage_concurrent_gb: int = 96
    enable_single_replica_ckpt_restoring: bool = False
    enable_emergency_checkpoint: bool = False
    local_checkpoint_directory: str = ""
    local_checkpoint_period: int = 0
    scan_layers: bool = True
    hardware: str = "tpu"
    model_name: str = "default"
    maxckpt_keep_period: int | None = None
    maxckpt_load_step: int | None = None
    maxckpt_exclude_from_loading: tuple[str, ...] = ()
    maxckpt_skip_optimizer_state: bool = False
    maxckpt_storage_compression: bool = False
    maxckpt_export_on_completion: tuple[str, ...] = ()
    maxckpt_export_dtype: str = "bfloat16"
    maxckpt_export_directory: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _check_rules(self)

    @property
    def run_directory(self) -> str | None:
        """`<base_output_directory>/<run_name>`, or None when no base directory is set."""
        if not self.base_output_directory:
            return None
        return _join(self.base_output_directory, self.run_name)

    @property
    def checkpoint_dir(self) -> str | None:
        """Where MaxText puts step directories: `<base_output_directory>/<run_name>/checkpoints/`."""
        run = self.run_directory
        return None if run is None else _join(run, "checkpoints") + "/"

    @property
    def export_directory(self) -> str | None:
        if self.maxckpt_export_directory:
            return self.maxckpt_export_directory
        run = self.run_directory
        return None if run is None else _join(run, "export")

    def values(self) -> dict[str, Any]:
        """The typed checkpoint keys as a plain dict (no extras)."""
        return {f.name: getattr(self, f.name) for f in FIELDS}

    def with_overrides(self, **changes: Any) -> "CheckpointConfig":
        """A copy with some keys changed, validated like the original.

        >>> CheckpointConfig().with_overrides(checkpoint_period=5).checkpoint_period
        5
        """
        for key in changes:
            if key not in FIELDS_BY_NAME:
                raise ConfigError(unknown_key_message(key, "with_overrides", FIELDS_BY_NAME))
        coerced = {k: FIELDS_BY_NAME[k].coerce(k, v, "with_overrides") for k, v in changes.items()}
        sources = {**self.sources, **{k: "with_overrides" for k in changes}}
        return dataclasses.replace(self, **coerced, sources=sources)


def unknown_key_message(key: str, where: str, known: Iterable[str]) -> str:
    """The error for a key nobody knows, with the closest known key when there is one."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else "; see `maxckpt config show` for the known keys"
    return f"unknown config key {key!r} in {where}: neither MaxText nor maxckpt knows it{hint}"


def _join(base: str, *parts: str) -> str:
    # Plain string joining keeps gs:// and other URL schemes intact.
    out = base.rstrip("/")
    for part in parts:
        if part:
            out = f"{out}/{part.strip('/')}"
    return out if "://" in base else os.path.normpath(out)


def _check_rules(cfg: CheckpointConfig) -> None:
    """MaxText's own cross-key rules, plus range checks on maxckpt's keys."""

    def src(key: str) -> str:
        return _where(cfg.sources.get(key, ""))

    # MaxText saves (and retention deletes) in <base_output_directory>/<run_name>/checkpoints: the name stays inside.
    if cfg.run_name.startswith("/") or ".." in cfg.run_name.split("/"):
        raise ConfigError(
            f"run_name {cfg.run_name!r}{src('run_name')} would put checkpoint_dir, where saves go and retention "
            "deletes, outside base_output_directory: a run name may not be an absolute path or hold '..' parts. "
            "Use a plain name such as llama3-8b-run1, and base_output_directory to choose where runs go"
        )
    if cfg.load_parameters_path and cfg.load_full_state_path:
        raise ConfigError(
            "load_parameters_path and load_full_state_path are both set"
            f"{src('load_full_state_path')}; MaxText allows at most one: keep "
            "load_parameters_path for a params-only start or load_full_state_path to continue a run"
        )
    if cfg.enable_emergency_checkpoint:
        if not cfg.local_checkpoint_directory:
            raise ConfigError(
                "enable_emergency_checkpoint is true but local_checkpoint_directory is empty"
                f"{src('enable_emergency_checkpoint')}: set local_checkpoint_directory to fast local storage"
            )
        if cfg.local_checkpoint_period <= 0:
            raise ConfigError(
                f"enable_emergency_checkpoint is true but local_checkpoint_period is {cfg.local_checkpoint_period}"
                f"{src('local_checkpoint_period')}: set it to a positive number of steps"
            )
    positive = {"checkpoint_period": cfg.checkpoint_period, "checkpoint_storage_concurrent_gb": cfg.checkpoint_storage_concurrent_gb}
    for key in ("max_num_checkpoints_to_keep", "maxckpt_keep_period"):
        if getattr(cfg, key) is not None:
            positive[key] = getattr(cfg, key)
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: expected a positive integer, got {value}{src(key)}")
    for key in ("local_checkpoint_period", "checkpoint_storage_target_data_file_size_bytes"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key}: expected 0 or more, got {getattr(cfg, key)}{src(key)}")
    if cfg.maxckpt_load_step is not None and cfg.maxckpt_load_step < 0:
        raise ConfigError(f"maxckpt_load_step: expected a step >= 0, got {cfg.maxckpt_load_step}{src('maxckpt_load_step')}")
    bad = [f for f in cfg.maxckpt_export_on_completion if f not in EXPORT_FORMATS]
    if bad:
        raise ConfigError(
            f"maxckpt_export_on_completion: unknown format {bad[0]!r}{src('maxckpt_export_on_completion')}; "
            f"expected any of {', '.join(EXPORT_FORMATS)}"
        )
