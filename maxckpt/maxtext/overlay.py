"""One overlay for MaxText and maxckpt: validate it all, hand MaxText only its own keys.

The overlay is a MaxText config (`base_config: base.yml` plus the keys it
changes) that may also hold maxckpt's `maxckpt_*` keys. MaxText rejects
keys it does not know, so :func:`prepare`:

1. reads the chain as maxckpt does (`base_config` next to the overlay, then
   `$MAXTEXT_CONFIGS_DIR`, which defaults here to the installed MaxText's
   `configs/`), with MaxText's own `base.yml` as the root when the chain
   names none;
2. validates everything with :func:`maxckpt.load_config` (typos, types,
   MaxText's cross-key rules, maxckpt's keys);
3. writes the overlay MaxText reads: the chain's keys minus maxckpt's, on
   top of MaxText's `base.yml` (absolute `base_config`), and passes the
   `key=value` overrides minus maxckpt's on MaxText's command line.

Aliases from other frameworks (`keep_latest_k`, `save_interval`, ...) reach
MaxText under their MaxText names.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml
from omegaconf import OmegaConf

from maxckpt.config import CheckpointConfig
from maxckpt.config.loader import BASE_CONFIG_KEY, CONFIGS_DIR_ENV, load_config, parse_overrides, read_chain
from maxckpt.config.schema import ALIASES, FIELDS
from maxckpt.errors import MaxckptError

MAXCKPT_KEYS = frozenset(f.name for f in FIELDS if not f.maxtext)


def maxtext_configs_dir() -> Path:
    """The installed MaxText's `configs/` folder (holds its `base.yml`), found without importing MaxText."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        raise MaxckptError(
            "MaxText is not installed in this Python: pip install 'maxckpt[maxtext]' "
            "(MaxText 0.2.5 needs Python >= 3.12)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "configs"


@dataclass(frozen=True)
class PreparedRun:
    """What a MaxText run under maxckpt needs: the validated config and MaxText's argv."""

    config: CheckpointConfig
    maxtext_overlay: Path  # the file MaxText reads
    maxtext_argv: list[str]  # as MaxText's main() takes it: [program, overlay, key=value, ...]


def _merge(layers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for values in layers:
        for key, value in values.items():
            old = merged.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                value = OmegaConf.to_container(OmegaConf.merge(old, value), resolve=False)
            merged[key] = value
    return merged


def _for_maxtext(values: dict[str, Any], config: CheckpointConfig) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if key in MAXCKPT_KEYS:
            continue
        if key in ALIASES:
            target = ALIASES[key][0]
            out[target] = getattr(config, target)
            continue
        out[key] = value
    return out


def prepare(overlay: str | os.PathLike, overrides: Sequence[str], workdir: str | os.PathLike) -> PreparedRun:
    """Validate `overlay` + `overrides` and write MaxText's overlay into `workdir`."""
    mt_base = maxtext_configs_dir() / "base.yml"
    previous = os.environ.get(CONFIGS_DIR_ENV)
    os.environ.setdefault(CONFIGS_DIR_ENV, str(mt_base.parent))
    try:
        layers = read_chain(overlay)
    finally:
        if previous is None:
            os.environ.pop(CONFIGS_DIR_ENV, None)
    root = Path(layers[0].source).resolve()
    # The chain's root is MaxText's base.yml (or a copy the user keeps); if it is not a
    # MaxText base at all, MaxText's own base.yml goes underneath.
    from maxckpt.config.loader import _looks_like_maxtext_base

    if _looks_like_maxtext_base(layers[0].values):
        user_layers = [layer.values for layer in layers[1:]]
    else:
        root = mt_base.resolve()
        user_layers = [layer.values for layer in layers]
    user = _merge(user_layers)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    full = workdir / "overlay_with_maxckpt_keys.yml"
    full.write_text(yaml.safe_dump({BASE_CONFIG_KEY: str(root), **user}, sort_keys=False))
    config = load_config(full, *overrides)

    mt_overlay = workdir / "maxtext_overlay.yml"
    mt_overlay.write_text(yaml.safe_dump({BASE_CONFIG_KEY: str(root), **_for_maxtext(user, config)}, sort_keys=False))
    argv = ["maxtext_train", str(mt_overlay)]
    for item, layer in zip(overrides, parse_overrides(overrides)):
        (key,) = layer.values
        if key in MAXCKPT_KEYS:
            continue
        if key in ALIASES:
            target = ALIASES[key][0]
            argv.append(f"{target}={getattr(config, target)}")
        else:
            argv.append(item)
    return PreparedRun(config=config, maxtext_overlay=mt_overlay, maxtext_argv=argv)
