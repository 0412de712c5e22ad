"""What HF states of a family whose layers are not all alike, one record per layer pattern (no I/O).

Most families' layers are alike, and config.json's common keys say all there is. The rest have a pattern
of their own, named by the family record's `maxtext_scan` (the same structure decides how MaxText stacks
them, :mod:`maxckpt.formats.maxtext.scans`); this table is the only place the HF side asks which:

- "dense_moe": DeepSeek's leading dense layers (`first_k_dense_replace`) and routing keys;
- "hybrid": Gated DeltaNet and full attention layers (:mod:`maxckpt.formats.hf.hybrid`);
- "cycle": llama4's NoPE / chunked / interleaved-MoE layer lists (:mod:`maxckpt.formats.hf.layer_cycle`);
- "local_global": Gemma 4's local and global layers of their own widths (:mod:`maxckpt.formats.hf.gemma4`).

>>> LAYER_PATTERNS["hybrid"].reads_layer_types, LAYER_PATTERNS["layers"].reads_layer_types
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from maxckpt.families import Family
from maxckpt.formats.hf import gemma4, hybrid, layer_cycle
from maxckpt.layouts.base import ModelSpec

__all__ = ["LAYER_PATTERNS", "LayerPattern", "layer_pattern"]

Config = Mapping[str, Any]
LayerName = Callable[[int, str], str]  # (layer index, HF suffix) -> the tensor's name


def _no_hints(config: Config, hints: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def _no_keys(spec: ModelSpec, config: dict[str, Any]) -> None:
    return None


def _loadable(spec: ModelSpec) -> str | None:
    return None


def _no_dims(infos: Mapping[str, Any], layer_name: LayerName, num_layers: int) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class LayerPattern:
    """The config.json keys of one layer pattern, both ways, and what transformers cannot run of it.

    `hints(config, hints)`: ModelSpec fields the pattern's keys state (given the common ones read so far);
    `write(spec, config)`: states them in a config.json being written (in place: some keys are dropped);
    `reads_layer_types`: its hints read and check `layer_types` themselves (else the common check does);
    `unloadable(spec)`: why transformers' model cannot compute this model, or None.
    Reading dims from tensor shapes (`infos`, `layer_name(i, suffix)`, layer count): `layer_dims`, when set,
    is what the pattern's own layers show and stands for the common attention reading (a hybrid's first
    layers are not attention); `head_dims` adds what layers other than layer 0 show once the per-head
    widths are known (Gemma 4's wider global layers).
    """

    hints: Callable[[Config, Mapping[str, Any]], dict[str, Any]] = _no_hints
    write: Callable[[ModelSpec, dict[str, Any]], None] = _no_keys
    reads_layer_types: bool = False
    unloadable: Callable[[ModelSpec], str | None] = _loadable
    layer_dims: Callable[[Mapping[str, Any], LayerName, int], dict[str, Any]] | None = None
    head_dims: Callable[[Mapping[str, Any], LayerName, int], dict[str, Any]] = _no_dims


def _dense_moe_hints(config: Config, hints: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("first_k_dense_replace") is not None and "num_layers" in hints:
        return {"first_dense_layers": min(int(config["first_k_dense_replace"]), int(hints["num_layers"]))}
    return {}


def _dense_moe_keys(spec: ModelSpec, config: dict[str, Any]) -> None:
    """DeepSeek's MoE keys (deepseek_v2, deepseek_v3, deepseek_v32)."""
    if spec.num_experts:
        config.update(n_shared_experts=spec.num_shared_experts, first_k_dense_replace=spec.first_dense_layers,
                      routed_scaling_factor=spec.routed_scaling_factor, n_group=spec.n_group,
                      topk_group=spec.topk_group)


def _hybrid_keys(spec: ModelSpec, config: dict[str, Any]) -> None:
    keys = hybrid.hybrid_config(spec)
    config["rope_parameters"] = {**config["rope_parameters"], **keys.pop("_rope_parameters")}
    config.update(keys)


def _cycle_keys(spec: ModelSpec, config: dict[str, Any]) -> None:
    config.update(layer_cycle.cycle_config(spec))


def _local_global_keys(spec: ModelSpec, config: dict[str, Any]) -> None:
    gemma4.drop_keys(config)
    config.update(gemma4.config_keys(spec))


LAYER_PATTERNS: dict[str, LayerPattern] = {
    "layers": LayerPattern(),
    "pairs": LayerPattern(),
    "blocks": LayerPattern(),
    "dense_moe": LayerPattern(hints=_dense_moe_hints, write=_dense_moe_keys),
    "hybrid": LayerPattern(hints=lambda config, hints: hybrid.hybrid_hints(config), write=_hybrid_keys,
                           reads_layer_types=True,
                           layer_dims=lambda infos, layer_name, num_layers: hybrid.hybrid_dims(infos, layer_name)),
    "cycle": LayerPattern(hints=lambda config, hints: layer_cycle.cycle_hints(config), write=_cycle_keys,
                          reads_layer_types=True),
    "local_global": LayerPattern(hints=lambda config, hints: gemma4.hints(config), write=_local_global_keys,
                                 unloadable=gemma4.unloadable_reason, head_dims=gemma4.dims),
}


def layer_pattern(family: Family) -> LayerPattern:
    """The layer pattern of a family's models."""
    return LAYER_PATTERNS[family.maxtext_scan]
