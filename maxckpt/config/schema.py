"""The typed checkpoint config: MaxText's checkpoint keys plus maxckpt's own, each declared once.

A key is one field of :class:`CheckpointConfig`: its annotation gives the coercion of YAML and
`key=value` values (bool, int, `int | None`, str, a `Literal` of choices, `tuple[str, ...]`), its
default is MaxText 0.2.5's, and its metadata carries the one-line help, whether MaxText has the key
(maxckpt's own are `maxckpt_*`) and its lower bound. :data:`FIELDS`, which the loader, `config show`
and `maxckpt.maxtext` walk, is derived from the fields; a test keeps `configs/base.yml` (one commented
line per key) and every shipped overlay in step with them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Union

from maxckpt.errors import ConfigError

Hardware = Literal["tpu", "gpu", "gpu_multiprocess", "cpu"]
ExportDtype = Literal["bfloat16", "float32", "float16"]
HARDWARE_CHOICES: tuple[str, ...] = typing.get_args(Hardware)
EXPORT_DTYPES: tuple[str, ...] = typing.get_args(ExportDtype)
EXPORT_FORMATS = ("hf", "megatron", "torchtitan", "torch")


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


def _key(default: Any, help: str, *, maxtext: bool = True, minimum: int | None = None, wanted: str = "") -> Any:
    """Declare one config key: a dataclass field whose metadata says what it means and what it accepts.

    `maxtext=False` marks maxckpt's own `maxckpt_*` keys; `minimum` is the smallest value allowed
    (None, where the annotation allows it, is always allowed), `wanted` the words of its error.
    """
    if minimum is not None and not wanted:
        wanted = {1: "a positive integer", 0: "0 or more"}.get(minimum, f"{minimum} or more")
    return field(default=default, metadata={"help": help, "maxtext": maxtext, "minimum": minimum, "wanted": wanted})


@dataclass(frozen=True)
class CheckpointConfig:
    """The effective, validated checkpoint config of one run.

    Build it with :func:`maxckpt.load_config`; keys MaxText knows but maxckpt
    does not use are kept untouched in :attr:`extra`, and :attr:`sources`
    says which file or override set each key.
    """

    enable_checkpointing: bool = _key(True, "save checkpoints at all; false makes every save a no-op")
    async_checkpointing: bool = _key(
        True, "save in the background; training blocks only for the device-to-host copy"
    )
    checkpoint_period: int = _key(10_000, "save every this many steps", minimum=1)
    max_num_checkpoints_to_keep: int | None = _key(
        None, "keep the newest N committed checkpoints (None keeps all)", minimum=1
    )
    save_checkpoint_on_completion: bool = _key(True, "save the final step when training ends")
    load_parameters_path: str = _key("", "start from the params of this checkpoint (fresh optimizer and step)")
    load_full_state_path: str = _key("", "start from the full train state of this checkpoint")
    base_output_directory: str = _key("", "root for runs; checkpoints go to <base>/<run_name>/checkpoints/")
    run_name: str = _key("", "name of this run; an existing run of that name resumes")
    checkpoint_storage_use_ocdbt: bool = _key(True, "store arrays in OCDBT (few large files)")
    checkpoint_storage_use_zarr3: bool = _key(True, "store arrays as zarr v3 (else zarr v2)")
    checkpoint_storage_target_data_file_size_bytes: int = _key(
        67_108_864, "target size of OCDBT data files and largest chunk (MaxText: 2 GiB)", minimum=0
    )
    checkpoint_storage_concurrent_gb: int = _key(96, "bytes in flight during save/restore, in GB", minimum=1)
    enable_single_replica_ckpt_restoring: bool = _key(False, "one replica reads, then broadcasts to the others")
    enable_emergency_checkpoint: bool = _key(False, "two-tier: frequent local saves plus periodic persistent ones")
    local_checkpoint_directory: str = _key("", "fast local storage for two-tier saves")
    local_checkpoint_period: int = _key(0, "save to the local tier every this many steps", minimum=0)
    scan_layers: bool = _key(
        True, "layers are stacked on one axis (recorded in the checkpoint's custom metadata)"
    )
    hardware: Hardware = _key("tpu", "tpu, gpu, gpu_multiprocess or cpu")
    model_name: str = _key("default", "MaxText model name; picks the family for exports")
    maxckpt_keep_period: int | None = _key(
        None, "also keep every step divisible by this forever", maxtext=False, minimum=1
    )
    maxckpt_load_step: int | None = _key(
        None, "restore this step instead of the newest", maxtext=False, minimum=0, wanted="a step >= 0"
    )
    maxckpt_exclude_from_loading: tuple[str, ...] = _key(
        (), "state items not to restore (e.g. opt_state)", maxtext=False
    )
    maxckpt_skip_optimizer_state: bool = _key(
        False, "save without opt_state (smaller, not resumable)", maxtext=False
    )
    maxckpt_storage_compression: bool = _key(
        False, "zstd-compress saved arrays as MaxText does (smaller, CPU-bound saves)", maxtext=False
    )
    maxckpt_export_on_completion: tuple[str, ...] = _key(
        (), "after the final save, export to hf, megatron, torchtitan and/or torch", maxtext=False
    )
    maxckpt_export_dtype: ExportDtype = _key("bfloat16", "dtype of exported weights", maxtext=False)
    maxckpt_export_directory: str = _key(
        "", "where exports go (default <base>/<run_name>/export/)", maxtext=False
    )
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


@dataclass(frozen=True)
class FieldSpec:
    """One config key as the loader and `config show` see it, derived from its :class:`CheckpointConfig` field."""

    name: str
    coerce: Callable[[str, Any, str], Any]
    default: Any
    help: str
    maxtext: bool  # False for maxckpt's own `maxckpt_*` keys
    minimum: int | None
    wanted: str


def _coercion(name: str, annotation: Any) -> Callable[[str, Any, str], Any]:
    """How YAML and `key=value` values become a value of `annotation` (a declaration error names the key)."""
    simple = {bool: _to_bool, int: _to_int, str: _to_str}
    if annotation in simple:
        return simple[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return _choice(args)
    if origin is tuple and args == (str, Ellipsis):
        return _to_str_list
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _coercion(name, next(a for a in args if a is not type(None)))

        def optional(key: str, value: Any, source: str) -> Any:
            return None if value is None else inner(key, value, source)

        return optional
    raise TypeError(f"CheckpointConfig.{name}: no coercion for the annotation {annotation!r}")


def _derive_fields() -> tuple[FieldSpec, ...]:
    """The keys of :class:`CheckpointConfig` in declaration order (base.yml's order), without its bookkeeping."""
    hints = typing.get_type_hints(CheckpointConfig)
    specs = []
    for f in dataclasses.fields(CheckpointConfig):
        if "help" not in f.metadata:  # extra, sources, notes
            continue
        specs.append(FieldSpec(f.name, _coercion(f.name, hints[f.name]), f.default, **f.metadata))
    return tuple(specs)


FIELDS: tuple[FieldSpec, ...] = _derive_fields()
FIELDS_BY_NAME: Mapping[str, FieldSpec] = {f.name: f for f in FIELDS}

# Keys other frameworks use for the same knobs: (canonical key, value mapping, where it comes from).
ALIASES: Mapping[str, tuple[str, Callable[[Any], Any], str]] = {
    "keep_latest_k": (
        "max_num_checkpoints_to_keep", lambda v: None if v in (0, "0") else v, "TorchTitan; 0 keeps all"
    ),
    "save_total_limit": ("max_num_checkpoints_to_keep", lambda v: v, "HF Trainer"),
    "save_interval": ("checkpoint_period", lambda v: v, "Megatron/TorchTitan"),
    "async_save": ("async_checkpointing", lambda v: v, "Megatron"),
    "async_mode": (
        "async_checkpointing",
        lambda v: (v.strip().lower() != "disabled") if isinstance(v, str) else v,
        "TorchTitan; 'disabled' is false, 'async'/'async_with_pinned_mem' true",
    ),
}


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
    """MaxText's own cross-key rules, plus the lower bound each key declares."""

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
    for spec in FIELDS:  # each key's lower bound, from its declaration
        value = getattr(cfg, spec.name)
        if spec.minimum is not None and value is not None and value < spec.minimum:
            raise ConfigError(f"{spec.name}: expected {spec.wanted}, got {value}{src(spec.name)}")
    bad = [f for f in cfg.maxckpt_export_on_completion if f not in EXPORT_FORMATS]
    if bad:
        raise ConfigError(
            f"maxckpt_export_on_completion: unknown format {bad[0]!r}{src('maxckpt_export_on_completion')}; "
            f"expected any of {', '.join(EXPORT_FORMATS)}"
        )
