"""Load MaxText-style base.yml overlays into one :class:`CheckpointConfig`.

MaxText configs are chains: an overlay names `base_config: base.yml` and sets
the keys it changes; `key=value` overrides on the command line come last. We
merge the chain with OmegaConf as MaxText does, remember which file (or
override) set every key so `maxckpt config show` can say where a value came
from, and reject keys nobody knows with a suggestion, because a silently
ignored typo in a retention key costs a disk full of checkpoints.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import OmegaConf

try:  # OmegaConf's own YAML loader (its float and duplicate-key rules); the module moved between releases
    from omegaconf._yaml import get_yaml_loader
except ImportError:  # pragma: no cover - omegaconf 2.3.0
    try:
        from omegaconf._utils import get_yaml_loader
    except ImportError:
        def get_yaml_loader():  # type: ignore[misc]
            return yaml.SafeLoader
from omegaconf.errors import OmegaConfBaseException

from maxckpt.storage.bounded import (
    MAX_YAML_ALIAS_NODES,
    BoundsError,
    check_depth,
    open_regular,
    special_kind,
    yaml_alias_nodes,
)

from maxckpt.config.schema import ALIASES, FIELDS, FIELDS_BY_NAME, CheckpointConfig, unknown_key_message
from maxckpt.errors import ConfigError
from maxckpt.storage.urls import normalize

BASE_CONFIG_KEY = "base_config"
CONFIGS_DIR_ENV = "MAXTEXT_CONFIGS_DIR"
_NONE_STRINGS = frozenset({"None", "none", "null", "Null", "NULL"})


def bundled_configs_dir() -> Path:
    """maxckpt's own `configs/` folder (the overlays shipped with the package)."""
    return Path(str(resources.files("maxckpt") / "configs"))


@functools.cache  # a packaged file: read once per process, not twice per load_config
def maxtext_keys() -> frozenset[str]:
    """Top-level keys of MaxText's base.yml, which pass through untouched."""
    text = (resources.files("maxckpt.config") / "maxtext_keys.txt").read_text()
    return frozenset(w for line in text.splitlines() if not line.startswith("#") for w in line.split())


@dataclass(frozen=True)
class ConfigLayer:
    """One file of a chain (or the overrides), with the keys it sets."""

    source: str
    values: dict[str, Any]


MAX_CONFIG_BYTES = 16 * 1024 * 1024  # MaxText's base.yml is ~40 KB


@functools.cache
def _config_loader() -> type:
    """OmegaConf's YAML loader (its float and duplicate-key rules) with the alias bound instead of its size bound.

    Why: OmegaConf refuses any document of over 10,000 nodes, so a plain
    config with a long list was "node expansion"; only aliases can blow a
    small file up (billion laughs), so only what they add is bounded.
    """
    try:
        base = get_yaml_loader(max_yaml_expanded_nodes=None)
    except TypeError:  # an OmegaConf without the size bound
        base = get_yaml_loader()

    class ConfigLoader(base):  # type: ignore[misc, valid-type]
        def construct_document(self, node: yaml.Node) -> Any:
            try:
                added = yaml_alias_nodes(node)
            except BoundsError as err:
                raise yaml.constructor.ConstructorError(None, None, str(err), node.start_mark) from None
            if added > MAX_YAML_ALIAS_NODES:
                bomb = f"its aliases expand it by more than {MAX_YAML_ALIAS_NODES:,} values (a YAML alias bomb)"
                raise yaml.constructor.ConstructorError(None, None, f"{bomb}; write the values out", node.start_mark)
            return super().construct_document(node)

    return ConfigLoader


_UNKNOWN_TAG = re.compile(r"could not determine a constructor for the tag '([^']*)'")


def _yaml_problem(err: yaml.YAMLError) -> str:
    """Where and what a YAML error is, without quoting the file (it may not be a config at all)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = str(getattr(err, "problem", None) or "malformed YAML")
    tag = _UNKNOWN_TAG.match(problem)
    if tag:  # `!!python/object:...` and friends: the tag is named, the value never quoted
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        name = ascii(name if len(name) <= 80 else name[:80] + "...")[1:-1]
        return (
            f"the tag {name}{where} is not allowed: only plain YAML is accepted "
            "(mappings, lists, strings, numbers, true/false, null), no tags that build objects"
        )
    problem = re.sub(r"'[^']*'|\"[^\"]*\"", "a character", problem)[:100]
    return f"{problem}{where}"


def _read_yaml(path: Path) -> dict[str, Any]:
    """One YAML file as a dict, bounded in size and depth; errors never echo the file's content."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {path} is larger than {MAX_CONFIG_BYTES // 2**20} MB; it is not a MaxText config"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (undecodable byte at offset {err.start}); save it as UTF-8"
        ) from None
    try:
        loaded = yaml.load(text, Loader=_config_loader())  # what OmegaConf.load does, minus its error text
        check_depth(loaded, max_nodes=MAX_CONFIG_BYTES + MAX_YAML_ALIAS_NODES)  # no file within the size has more
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML ({_yaml_problem(err)})") from None
    except (RecursionError, BoundsError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise ConfigError(f"config file {path} is not a usable config: {reason}") from None
    if not isinstance(loaded, dict):
        kinds = {str: "a string", list: "a list"}
        kind = "nothing" if loaded is None else kinds.get(type(loaded), f"a {type(loaded).__name__}")
        raise ConfigError(
            f"config file {path} is not a mapping of config keys (it holds {kind}); a config is `key: value` lines"
        )
    odd = next((k for k in loaded if not isinstance(k, str)), None)
    if odd is not None or None in loaded:
        raise ConfigError(
            f"config file {path} has a key that is not a name ({type(odd).__name__} {str(odd)[:40]}); "
            "config keys are names such as save_period"
        )
    try:
        return OmegaConf.to_container(OmegaConf.create(loaded), resolve=False)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"config file {path} is not a usable config ({type(err).__name__})") from None


def _base_file(overlay: Path, name: str, candidate: Path) -> Path | None:
    """`candidate` when it is a regular file; None when absent; a ConfigError saying what it is otherwise."""
    if candidate.is_file():
        return candidate
    kind = special_kind(candidate)
    if kind is not None:
        where = "" if str(candidate) == name else f" (found as {candidate})"
        raise ConfigError(
            f"{overlay}: base_config {name!r}{where} is {kind}, not a config file; point base_config at a YAML file"
        )
    return None


def _resolve_base(name: str, overlay: Path) -> Path:
    """Find `base_config: name`: next to the overlay, then $MAXTEXT_CONFIGS_DIR, then maxckpt's configs/."""
    candidate = Path(os.path.expanduser(name))
    if candidate.is_absolute():
        found = _base_file(overlay, name, candidate)
        if found is not None:
            return found
        raise ConfigError(f"{overlay}: base_config {name!r} does not exist")
    searched = [overlay.parent]
    if os.environ.get(CONFIGS_DIR_ENV):
        searched.append(Path(os.environ[CONFIGS_DIR_ENV]))
    searched.append(bundled_configs_dir())
    for folder in searched:
        found = _base_file(overlay, name, folder / name)
        if found is not None:
            return found
    raise ConfigError(
        f"{overlay}: base_config {name!r} not found; looked in "
        + ", ".join(str(f) for f in searched)
        + f". Put it next to the overlay or set ${CONFIGS_DIR_ENV} to MaxText's configs folder"
    )


def read_chain(path: str | os.PathLike[str]) -> list[ConfigLayer]:
    """The files of an overlay chain, root base first, each with its own keys."""
    overlay = normalize(path)
    kind = special_kind(overlay)
    if kind is not None:
        raise ConfigError(f"config file {overlay} is not a regular file: it is {kind}; pass a YAML config file")
    if not overlay.is_file():
        raise ConfigError(f"config file {overlay} does not exist")
    layers: list[ConfigLayer] = []
    seen: list[Path] = []
    current: Path | None = overlay
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            chain = " -> ".join(str(p) for p in [*seen, resolved])
            raise ConfigError(f"base_config chain loops back on itself: {chain}")
        seen.append(resolved)
        values = _read_yaml(current)
        base = values.pop(BASE_CONFIG_KEY, None)
        layers.append(ConfigLayer(str(current), values))
        if base and not isinstance(base, str):
            raise ConfigError(f"{current}: base_config must be a file name, not {type(base).__name__}")
        if base and (len(base) > 4096 or "\0" in base):
            raise ConfigError(f"{current}: base_config is not a file name")
        current = _resolve_base(base, current) if base else None
    return list(reversed(layers))


def parse_overrides(overrides: Iterable[str]) -> list[ConfigLayer]:
    """`key=value` strings, parsed as YAML values the way MaxText's CLI does; one layer each."""
    layers = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
            check_depth(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {key.strip()!r}: cannot parse the value ({_yaml_problem(err)})") from None
        except (RecursionError, BoundsError):
            raise ConfigError(f"override {key.strip()!r}: the value is nested too deeply") from None
        layers.append(ConfigLayer(f"override {item}", {key.strip(): value}))
    return layers


def _looks_like_maxtext_base(values: dict[str, Any]) -> bool:
    # MaxText's base.yml defines hundreds of keys; a user's overlay a handful.
    return len(set(values) & maxtext_keys()) >= 50


def _normalize_none(value: Any) -> Any:
    if isinstance(value, str) and value in _NONE_STRINGS:
        return None
    if isinstance(value, dict):
        return {k: _normalize_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize_none(v) for v in value]
    return value


def load_config(path: str | os.PathLike[str], *overrides: str) -> CheckpointConfig:
    """Load an overlay chain plus `key=value` overrides into a validated config.

    >>> cfg = load_config("configs/keep_last_n_async.yml", "checkpoint_period=5")
    >>> cfg.checkpoint_period, cfg.checkpoint_dir
    (5, '/tmp/maxckpt_runs/keep_last_n/checkpoints/')
    """
    layers = read_chain(path)
    known = set(FIELDS_BY_NAME) | set(ALIASES) | maxtext_keys()
    if len(layers) > 1 and _looks_like_maxtext_base(layers[0].values):
        # MaxText's own base.yml defines MaxText's vocabulary, as in MaxText, so
        # keys of a newer MaxText than our list pass through too.
        known |= set(layers[0].values)
    layers += parse_overrides(overrides)

    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    for layer in layers:
        values: dict[str, Any] = {}
        for key, value in layer.values.items():
            where = layer.source
            if key not in known:
                raise ConfigError(unknown_key_message(key, where, known))
            if key in ALIASES:
                target, mapping, origin = ALIASES[key]
                mapped = mapping(_normalize_none(value))
                notes.append(f"{key}={value!r} ({origin}) in {where} maps to {target}={mapped!r}")
                values[target] = mapped
                sources[target] = f"{where} (as {key})"
            else:
                values[key] = value
                sources[key] = where
        for key, value in values.items():
            old = merged.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                # Nested sections merge key by key; anything else replaces, as in MaxText.
                value = OmegaConf.to_container(OmegaConf.merge(old, value), resolve=False)
            merged[key] = value

    try:
        flat = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot resolve an interpolation in the config: {err}") from None
    flat = _normalize_none(flat)

    typed: dict[str, Any] = {}
    for spec in FIELDS:
        if spec.name in flat:
            typed[spec.name] = spec.coerce(spec.name, flat[spec.name], sources.get(spec.name, ""))
        else:
            sources.setdefault(spec.name, "default")
    extra = {k: v for k, v in flat.items() if k not in FIELDS_BY_NAME}
    return CheckpointConfig(**typed, extra=extra, sources=sources, notes=tuple(notes))
