"""A MaxText run's model settings, resolved from its own config in MaxText's order.

A MaxText checkpoint records no model config: the routing top-k, group-limited
routing, sliding windows and rope settings a run was trained with live only in
the config it was started with. :func:`resolve_run_config` reads that config
the way MaxText 0.2.5's `pyconfig` does (`../shared/FORMATS.md`, section 9):

1. the overlay chain (`base_config`, next to the file, then
   `$MAXTEXT_CONFIGS_DIR`), on top of MaxText's own `base.yml` when the chain
   names none;
2. `model_name: X` loads `models/X.yml`, whose keys beat the chain's;
3. command-line `key=value` overrides beat the chain, and beat the model file
   only with `override_model_config: true` (otherwise MaxText refuses a key
   both set to different values, and so does this).

MaxText's `base.yml` and model files come from an installed MaxText, else
`$MAXTEXT_CONFIGS_DIR`, else the copies of MaxText 0.2.5's that maxckpt ships
(`maxckpt/config/maxtext_0_2_5/`, Apache-2.0). A run directory that holds the
`config.yml` MaxText writes with `save_config_to_gcs` (already resolved) is
read as it is (:func:`run_config_file`).

:func:`spec_settings` turns the resolved keys into ModelSpec fields, only
those whose meaning is the same in MaxText and in maxckpt for the family.

>>> cfg = resolve_run_config(None, ["model_name=gpt-oss-20b", "num_experts_per_tok=2"])  # doctest: +SKIP
>>> spec_settings(cfg, {}, moe=True, preset_rope=None)["num_experts_per_tok"]  # doctest: +SKIP
2
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from maxckpt.config.loader import CONFIGS_DIR_ENV, ConfigLayer, _read_yaml, parse_overrides, read_chain
from maxckpt.errors import ConfigError

SHIPPED_VERSION = "0.2.5"
BASE_LAYER = "base.yml of "  # how the source of a key MaxText's base.yml alone set starts
RUN_CONFIG_FILE = "config.yml"  # what MaxText writes to <base_output_directory>/<run_name>/ (save_config_to_gcs)
RECORD_FILE = "maxckpt_run_config.yml"  # the same keys, recorded by `maxckpt maxtext train` before its first save


def configs_dir() -> tuple[Path, str]:
    """MaxText's `configs/` folder and what it is: the installed MaxText's, `$MAXTEXT_CONFIGS_DIR`, or ours."""
    spec = importlib.util.find_spec("maxtext")
    if spec is not None and spec.submodule_search_locations:
        found = Path(list(spec.submodule_search_locations)[0]) / "configs"
        if (found / "base.yml").is_file():
            return found, f"the installed MaxText's {found}"
    if os.environ.get(CONFIGS_DIR_ENV):
        found = Path(os.environ[CONFIGS_DIR_ENV])
        if (found / "base.yml").is_file():
            return found, f"${CONFIGS_DIR_ENV} ({found})"
    return Path(str(resources.files("maxckpt.config") / "maxtext_0_2_5")), f"MaxText {SHIPPED_VERSION}'s (shipped)"


@dataclass(frozen=True)
class RunConfig:
    """A run's resolved MaxText keys and, for each, where its value came from."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def model_name(self) -> str | None:
        name = self.values.get("model_name")
        return None if name in (None, "", "default") else str(name).replace("-Instruct", "")


def _model_file(name: str, chain_root: Path | None) -> tuple[Path, str]:
    """`models/<name>.yml`, where MaxText looks: beside the chain's root base, then in the configs folder."""
    candidates = []
    if chain_root is not None:
        candidates += [
            chain_root.parent / "models" / f"{name}.yml",
            chain_root.parent.parent / "models" / f"{name}.yml",
        ]
    folder, what = configs_dir()
    candidates.append(folder / "models" / f"{name}.yml")
    for path in candidates:
        if path.is_file():
            return path, str(path) if path.parent.parent != folder else f"models/{name}.yml of {what}"
    known = sorted(p.stem for p in (folder / "models").glob("*.yml"))
    raise ConfigError(
        f"model_name {name!r}: no models/{name}.yml in {what}; MaxText knows {', '.join(known[:12])}, ... "
        f"(point ${CONFIGS_DIR_ENV} at the configs folder of the MaxText the run used)"
    )


def resolve_run_config(config: str | os.PathLike | None, overrides: Sequence[str] = ()) -> RunConfig:
    """The run's MaxText keys from its config file (None: MaxText's base.yml alone) and its `key=value`
    overrides, merged in MaxText's order (see the module docstring)."""
    layers: list[ConfigLayer] = read_chain(config) if config is not None else []
    where = str(config) if config is not None else "no MaxText config file"
    return _resolve(layers, parse_overrides(overrides), f"{where} with MaxText's order of precedence")


def _resolve(layers: list[ConfigLayer], cli: list[ConfigLayer], description: str) -> RunConfig:
    folder, what = configs_dir()
    root = Path(layers[0].source) if layers and os.path.isfile(layers[0].source) else None
    if not layers or "base_emb_dim" not in layers[0].values:  # the chain names no MaxText base.yml
        layers.insert(0, ConfigLayer(f"{BASE_LAYER}{what}", _read_yaml(folder / "base.yml")))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.values.items():
            values[key], sources[key] = value, layer.source
    cli_values = {k: v for layer in cli for k, v in layer.values.items()}
    model_name = cli_values.get("model_name", values.get("model_name"))
    if model_name not in (None, "", "default"):
        model_path, model_what = _model_file(str(model_name).replace("-Instruct", ""), root)
        model_values = _read_yaml(model_path)
        override_model = bool(cli_values.get("override_model_config", values.get("override_model_config")))
        clashes = sorted(k for k, v in cli_values.items() if k in model_values and model_values[k] != v)
        if clashes and not override_model:
            raise ConfigError(
                f"{', '.join(clashes)} set both by {model_what} and on the command line with different values; "
                "MaxText refuses that unless override_model_config=true (then the command line wins)"
            )
        for key, value in model_values.items():
            if not (override_model and key in cli_values):
                values[key], sources[key] = value, model_what
    for layer in cli:
        for key, value in layer.values.items():
            values[key], sources[key] = value, layer.source.replace("override ", "--set ", 1)
    return RunConfig(values, sources, description)


def resolve_model_config(model_config: "str | os.PathLike | Mapping[str, Any] | RunConfig",
                         overrides: Sequence[str] = ()) -> RunConfig:
    """A run's MaxText keys from what a training script states: a MaxText config file (with its `key=value`
    overrides), a mapping of MaxText keys (e.g. `model_name`, `num_experts_per_tok`: MaxText's keyword
    overrides, as `pyconfig.initialize(argv, **kwargs)` takes them: they beat the model's yml only with
    `override_model_config`), or an already resolved :class:`RunConfig`."""
    if isinstance(model_config, RunConfig):
        if overrides:
            raise ConfigError("model_config: a resolved RunConfig takes no further overrides; resolve them into it")
        return model_config
    if isinstance(model_config, Mapping):
        given = [ConfigLayer(f"override {k}={v!r} (model_config)", {str(k): v}) for k, v in model_config.items()]
        return _resolve([], [*given, *parse_overrides(overrides)], "the model_config given to maxckpt's manager")
    if isinstance(model_config, (str, os.PathLike)):
        return resolve_run_config(model_config, overrides)
    raise ConfigError(
        f"model_config: expected a MaxText config path, a mapping of MaxText keys or a RunConfig, "
        f"got {type(model_config).__name__}"
    )


def record_dir(checkpoint_dir: str | os.PathLike) -> str:
    """Where a run's record lies: the run directory above MaxText's `<run>/checkpoints/`, else the
    checkpoint directory itself (a manager pointed at a folder of its own name)."""
    text = os.fspath(checkpoint_dir).rstrip("/")
    head, _, name = text.rpartition("/")
    return head if name == "checkpoints" and head else text


def write_record(run_dir: str | os.PathLike, run: RunConfig) -> str:
    """Write the run's resolved MaxText keys to `<run_dir>/maxckpt_run_config.yml`, whole or not at all
    (locally a temporary file renamed into place; on a bucket one object, which appears whole); returns its path."""
    import yaml

    from maxckpt.storage.store import store_for
    from maxckpt.storage.urls import is_url, join

    try:
        text = yaml.safe_dump({k: v for k, v in run.values.items() if not k.startswith("maxckpt_")}, sort_keys=True)
    except yaml.YAMLError as err:
        raise ConfigError(f"the run's MaxText keys cannot be written as YAML (plain values only): {err}") from None
    folder = os.fspath(run_dir) if is_url(run_dir) else os.path.abspath(os.fspath(run_dir))
    path = join(folder, RECORD_FILE).as_posix() if is_url(folder) else os.path.join(folder, RECORD_FILE)
    if not is_url(folder):
        os.makedirs(folder, exist_ok=True)
    store_for(path).write_whole(path, text.encode())
    return path


def _folders_up(path: str | os.PathLike, depth: int) -> list[str]:
    """`path` and up to `depth` folders above it (within the bucket, for a URL)."""
    from maxckpt.storage.urls import is_url, split_url

    text = os.fspath(path).rstrip("/") if is_url(path) else os.path.abspath(os.fspath(path))
    floor = len(f"{split_url(text).scheme}://{split_url(text).bucket}") if is_url(text) else 1
    out = [text]
    while len(out) <= depth:
        head = text.rpartition("/")[0]
        if len(head) < floor or head == text:
            break
        out.append(head)
        text = head
    return out


def run_config_file(path: str | os.PathLike) -> str | None:
    """The config record in the run directory that holds `path` (a run, checkpoints/, step or items dir),
    local or on a bucket, if any: MaxText's `config.yml` (its legacy config path with `save_config_to_gcs: true`
    writes one) or maxckpt's `maxckpt_run_config.yml`."""
    from maxckpt.storage.store import store_for

    store = store_for(path)
    for folder in _folders_up(path, 4):
        for name in (RECORD_FILE, RUN_CONFIG_FILE):
            candidate = f"{folder}/{name}"
            if not store.is_file(candidate):
                continue
            holds_run = store.isdir(f"{folder}/checkpoints") or (name == RECORD_FILE and _holds_steps(store, folder))
            if holds_run and _resolved_maxtext_keys(candidate):
                return candidate
    return None


def _holds_steps(store: Any, folder: str) -> bool:
    """Whether `folder` is a checkpoint directory itself (numbered step folders), where a manager whose
    directory is not `<run>/checkpoints` keeps its record."""
    try:
        return any(name.isdigit() and store.isdir(f"{folder}/{name}") for name in store.listdir(folder))
    except OSError:
        return False


def _resolved_maxtext_keys(path: str) -> bool:
    """Whether `path` holds a run's resolved MaxText keys (MaxText writes every key of base.yml), not some
    other tool's `config.yml` that happens to lie beside a `checkpoints/` folder."""
    try:
        values = _read_yaml(path)
    except (OSError, ConfigError):
        return False
    return isinstance(values, dict) and {"base_emb_dim", "decoder_block", "base_num_decoder_layers"} <= set(values)


def read_run_config_file(path: str | os.PathLike) -> RunConfig:
    """A run's `config.yml` as MaxText wrote it (or maxckpt's record of the same keys): every key resolved."""
    values = _read_yaml(path)
    who = "maxckpt maxtext train" if os.fspath(path).endswith(RECORD_FILE) else "MaxText"
    return RunConfig(values, {k: str(path) for k in values}, f"{path} (written by {who} for the run)")


# MaxText key -> ModelSpec field for what no tensor shape shows, where both mean the same in every family;
# (a value MaxText uses for "off" -> ModelSpec's).
_SETTINGS: dict[str, tuple[str, Any]] = {
    "normalization_layer_epsilon": ("rms_norm_eps", None),
    "rope_max_timescale": ("rope_theta", None),
}
_MOE_SETTINGS: dict[str, tuple[str, Any]] = {"num_experts_per_tok": ("num_experts_per_tok", None)}
# The settings MaxText applies to one family only (e.g. norm_topk_prob, "qwen3-specific" in base.yml) are
# that family's record's (Family.maxtext_settings), passed in by the caller.
# Shapes: stated by the config, checked against the tensors (a config of another model is refused).
_SHAPES: dict[str, str] = {
    "base_emb_dim": "emb_dim", "base_num_query_heads": "num_heads", "base_num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim", "base_num_decoder_layers": "num_layers", "vocab_size": "vocab_size",
}
_YARN = {"rope_factor": "factor", "original_max_position_embeddings": "original_max_position_embeddings",
         "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale"}


def spec_settings(run: RunConfig, family_settings: Mapping[str, tuple[str, Any]], *, moe: bool,
                  preset_rope: Mapping[str, Any] | None, mla: bool = False, layer_span: int = 1) -> dict[str, Any]:
    """ModelSpec fields (values in maxckpt's terms) that the run's resolved MaxText keys state for a family.

    `family_settings` are the keys MaxText applies to that family alone (Family.maxtext_settings);
    `layer_span` is how many HF layers one MaxText decoder layer holds (gemma2's (local, global) pairs: 2).
    Shapes count only where the run's own files or overrides state them: base.yml's defaults (a 2048-wide
    model) describe no run's tensors.
    """
    values = run.values
    out: dict[str, Any] = {}
    table = {**_SETTINGS, **(_MOE_SETTINGS if moe else {}), **family_settings}
    for key, (name, off) in table.items():
        if key in values and values[key] is not None:
            value = values[key]
            out[name] = (
                (1 if name in ("n_group", "topk_group") else None) if off is not None and value == off else value
            )
    for key, name in _SHAPES.items():
        if mla and name in ("head_dim", "num_kv_heads"):
            continue  # MLA's head dims are its own keys
        stated = not str(run.sources.get(key, "")).startswith(BASE_LAYER)
        if stated and isinstance(values.get(key), int) and not isinstance(values[key], bool) and values[key] > 0:
            out[name] = values[key] * (layer_span if name == "num_layers" else 1)
    kind = (preset_rope or {}).get("rope_type", (preset_rope or {}).get("type"))
    if kind == "yarn" and values.get("rope_type") == "yarn":  # the preset's keys, at the run's values
        rope = dict(preset_rope or {})
        rope.update({hf: values[mt] for mt, hf in _YARN.items() if values.get(mt) is not None and hf in rope})
        if mla and values.get("mscale") is not None and "mscale_all_dim" in rope:
            # MaxText's MLA scales its softmax by mscale (HF's mscale_all_dim) and not its rope (HF's
            # mscale / mscale_all_dim attention factor: 1), so one MaxText key sets both HF keys
            rope["mscale_all_dim"] = values["mscale"]
        out["rope_scaling"] = rope
    elif kind == "linear" and isinstance(values.get("rope_linear_scaling_factor"), (int, float)):
        factor = float(values["rope_linear_scaling_factor"])
        out["rope_scaling"] = {**dict(preset_rope or {}), "factor": factor}
    elif kind == "llama3" and values.get("rope_use_scale") is False:  # LLaMARotaryEmbedding, its scaling off
        out["rope_scaling"] = None
    return out
