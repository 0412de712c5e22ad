"""What a MaxText source's model settings are, and where each came from: the run's config, or a preset.

A MaxText checkpoint states its shapes and nothing else. The settings that
change the logits without changing a shape (the routing top-k, group-limited
routing, windows, rope, soft caps, norm epsilon) come, in this order of
preference, from:

1. the run's MaxText config given with `--maxtext-config CONFIG.yml`, with the
   run's command-line overrides as `--set KEY=VALUE` under MaxText's names,
   resolved as MaxText does (:mod:`maxckpt.config.maxtext_run`);
2. the `config.yml` MaxText wrote into the run directory (`save_config_to_gcs`);
3. the family preset of `--model`, which is a guess: every logit-relevant value
   taken from it is named in the conversion's notes (:func:`assumed_note`).

`--set` with maxckpt's or MaxText's names still beats all of them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from maxckpt.config.loader import maxtext_keys, read_chain
from maxckpt.config.maxtext_run import RunConfig, read_run_config_file, resolve_run_config, run_config_file
from maxckpt.config.maxtext_run import spec_settings as _spec_settings
from maxckpt.conversion.spec import MAXTEXT_SETTINGS, SPEC_FIELDS, TREE_FAMILY
from maxckpt.errors import ConfigError
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES, MAXTEXT_MODELS, resolve_model

# Logit-relevant settings no shape shows, for every model (what a preset would silently decide); each family
# adds its own (Family.unshown_settings).
_ALWAYS = ("rope_theta", "rope_scaling", "rms_norm_eps")


def _maxtext_only(key: str) -> bool:
    """A MaxText key that is no ModelSpec field nor one maxckpt translates (base_emb_dim, model_name, ...)."""
    return key in maxtext_keys() and key not in SPEC_FIELDS and key not in MAXTEXT_SETTINGS


def split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ModelSpec overrides, MaxText-only keys) of `--set`: the latter only mean something to a MaxText run."""
    spec = {k: v for k, v in overrides.items() if not _maxtext_only(k)}
    return spec, {k: v for k, v in overrides.items() if _maxtext_only(k)}


def run_config(path: str | os.PathLike, config: str | os.PathLike | None, model: str | None,
               overrides: Mapping[str, Any]) -> RunConfig | None:
    """The run's resolved MaxText config for a MaxText source at `path`, or None when nothing states one."""
    maxtext_sets = {k: v for k, v in overrides.items() if k in maxtext_keys()}
    preset = model if model and model.strip().lower() in MAXTEXT_MODELS else None
    if config is not None:
        sets = dict(maxtext_sets)
        named = any(layer.values.get("model_name") not in (None, "", "default") for layer in read_chain(config))
        if preset and "model_name" not in sets and not named:
            sets["model_name"] = preset  # --model names the MaxText model the run's config leaves implicit
        return resolve_run_config(config, _as_items(sets))
    written = run_config_file(path)
    if written is not None:
        return read_run_config_file(written)
    if any(_maxtext_only(k) for k in overrides):
        sets = dict(maxtext_sets)
        if preset and "model_name" not in sets:
            sets["model_name"] = preset
        return resolve_run_config(None, _as_items(sets))
    return None


def _as_items(values: Mapping[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in values.items()]


def _family_of(run: RunConfig) -> str | None:
    """The family a run that names no model_name (MaxText's "default" model) runs, by its decoder_block.

    Of the families with that block (Family.maxtext_decoder_block), the first whose MaxText rope_type is the
    run's, else the first that needs none (llama2's block with rope_type llama3.1 is llama3.1).
    """
    block, rope = str(run.values.get("decoder_block", "")), run.values.get("rope_type")
    candidates = [f for f in FAMILIES.values() if f.maxtext_decoder_block == block]
    chosen = next((f for f in candidates if f.maxtext_rope_type is not None and f.maxtext_rope_type == rope), None)
    chosen = chosen or next((f for f in candidates if f.maxtext_rope_type is None), None)
    return chosen.name if chosen else None


def run_hints(run: RunConfig, model: str | None, dims: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """ModelSpec fields the run's config states for the source's family, and the model name to use."""
    name = model or (run.model_name if run.model_name and run.model_name.lower() in MAXTEXT_MODELS else None)
    name = name or (_family_of(run) if run.model_name is None else None)
    family = resolve_model(name) if name else FAMILIES.get(dims.get(TREE_FAMILY) or "", None)
    if family is None:
        return {}, name  # the family is guessed later, with a note; the config's settings need a family
    settings = _spec_settings(run, family.maxtext_settings, moe=bool(dims.get("num_experts")),
                              preset_rope=family.rope_scaling, mla=family.attention == "mla",
                              layer_span=2 if family.maxtext_scan == "pairs" else 1)
    return settings, name


def refuse_for(fmt: str, config: str | os.PathLike | None, maxtext_only: Mapping[str, Any]) -> None:
    """A MaxText config (or MaxText-only `--set` keys) describes a MaxText run, not another format's checkpoint."""
    if config is not None:
        raise ConfigError(f"--maxtext-config describes a MaxText run, but the source is a {fmt} checkpoint; drop it")
    if maxtext_only:
        key = next(iter(maxtext_only))
        raise ConfigError(
            f"--set {key}: a MaxText config key that only a MaxText source reads (the source is a {fmt} "
            "checkpoint); use maxckpt's setting names, or --hf-config"
        )


def settled_note(run: RunConfig, hints: Mapping[str, Any], spec: ModelSpec) -> str:
    """Which logit-relevant settings the run's config settled, for the conversion's notes."""
    keys = [k for k in (*_ALWAYS, *FAMILIES[spec.family].unshown_settings) if k in hints]
    shown = ", ".join(f"{k}={_short(getattr(spec, k))}" for k in keys)
    return f"model settings from {run.description}: {shown or 'none of the logit-relevant ones'}"


def _assumed_keys(spec: ModelSpec, stated: set[str]) -> list[str]:
    unshown = FAMILIES[spec.family].unshown_settings
    assumed = [k for k in (*_ALWAYS, *unshown) if k not in stated]
    if not unshown and spec.num_experts and "num_experts_per_tok" not in stated:
        assumed.append("num_experts_per_tok")
    return assumed


def assumed_settings(spec: ModelSpec, stated: set[str], model: str | None) -> dict[str, Any] | None:
    """The values :func:`assumed_note` names, as outputs record them (plus `source`); None when none were."""
    assumed = _assumed_keys(spec, stated)
    if not assumed:
        return None
    return {**{k: _plain(getattr(spec, k)) for k in assumed}, "source": f"{model or spec.family} preset"}


def _plain(value: Any) -> Any:
    """A JSON-ready copy (mappings as dicts, tuples as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def assumed_note(spec: ModelSpec, stated: set[str], model: str | None) -> str | None:
    """The logit-relevant values taken from the preset because nothing else stated them; None when none were."""
    assumed = _assumed_keys(spec, stated)
    if not assumed:
        return None
    shown = ", ".join(f"{k}={_short(getattr(spec, k))}" for k in assumed)
    return (
        f"assumed from the {model or spec.family} preset, since no MaxText config of the run was given: {shown}. "
        "A MaxText checkpoint records none of these; if the run was trained otherwise, pass its config "
        "(--maxtext-config CONFIG.yml, with its command-line overrides as --set KEY=VALUE) or --set KEY=VALUE"
    )


def _short(value: Any) -> str:
    text = repr(dict(value)) if isinstance(value, Mapping) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def settle(path: str | os.PathLike, fmt: str, options: Any, dims: Mapping[str, Any], hints: dict[str, Any],
           source: str) -> tuple[dict[str, Any], str, str | None, dict[str, Any], RunConfig | None]:
    """(hints, hints source, model, ModelSpec overrides, run config) for a source of format `fmt`: a MaxText
    source adds what its run's config states (see the module docstring); any other refuses a MaxText config."""
    overrides, maxtext_only = split_overrides(options.overrides)
    config = getattr(options, "maxtext_config", None)
    if fmt != "maxtext":
        refuse_for(fmt, config, maxtext_only)
        return hints, source, options.model, overrides, None
    run = run_config(path, config, options.model, options.overrides)
    if run is None:
        return hints, source, options.model, overrides, None
    settings, model = run_hints(run, options.model, dims)
    return {**settings, **hints}, run.description, model, overrides, run


def notes_for(spec: ModelSpec, run: RunConfig | None, hints: Mapping[str, Any], overrides: Mapping[str, Any],
              model: str | None) -> list[str]:
    """What the user should know about where a MaxText source's logit-relevant settings came from."""
    stated = set(hints) | set(overrides)
    if run is not None:
        return [settled_note(run, hints, spec)]
    note = assumed_note(spec, stated, model)
    return [note] if note else []
