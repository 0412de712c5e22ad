"""The HuggingFace layout: the hub every other layout maps to and from.

HF names and shapes (`model.layers.{i}.self_attn.q_proj.weight` [Hq*D, E],
rotate-half q/k rows, no folded query scaling) are the common language of
the conversion pipeline. This module also reads and writes the sidecar files
an HF model directory needs: `config.json` (both the transformers 5.x
`rope_parameters` form and the 4.x `rope_theta`/`rope_scaling` form are read;
both are written, consistently) and `generation_config.json`.

>>> spec = ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 256)
>>> sorted(expected_tensors(spec))[:2]
['lm_head.weight', 'model.embed_tokens.weight']
"""

from __future__ import annotations

import json
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from maxckpt.bounded import read_json
from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.families import FAMILIES, family_from_hf_config, hf_rope
from maxckpt.tensors import LazyTensor, TensorInfo
from maxckpt.storage.urls import as_path

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
LAYER = "model.layers.{i}."
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# Per-layer tensors: suffix -> shape in spec dimension symbols.
LAYER_TENSORS: dict[str, tuple[str, ...]] = {
    "self_attn.q_proj.weight": ("Hq*D", "E"),
    "self_attn.k_proj.weight": ("Hkv*D", "E"),
    "self_attn.v_proj.weight": ("Hkv*D", "E"),
    "self_attn.o_proj.weight": ("E", "Hq*D"),
    "mlp.gate_proj.weight": ("F", "E"),
    "mlp.up_proj.weight": ("F", "E"),
    "mlp.down_proj.weight": ("E", "F"),
    "input_layernorm.weight": ("E",),
    "post_attention_layernorm.weight": ("E",),
}
QK_NORM_TENSORS: dict[str, tuple[str, ...]] = {
    "self_attn.q_norm.weight": ("D",),
    "self_attn.k_norm.weight": ("D",),
}

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def layer_name(i: int, suffix: str) -> str:
    """The HF name of a per-layer tensor: `layer_name(3, "mlp.up_proj.weight")` -> `model.layers.3.mlp.up_proj.weight`."""
    return LAYER.format(i=i) + suffix


def dim(symbol: str, spec: ModelSpec) -> int:
    """The size a dimension symbol (`E`, `Hq*D`, ...) stands for in `spec`."""
    sizes = {
        "E": spec.emb_dim,
        "Hq": spec.num_heads,
        "Hkv": spec.num_kv_heads,
        "D": spec.head_dim,
        "F": spec.mlp_dim,
        "V": spec.vocab_size,
        "L": spec.num_layers,
    }
    out = 1
    for part in symbol.split("*"):
        out *= sizes[part]
    return out


def shape_of(symbols: tuple[str, ...], spec: ModelSpec) -> tuple[int, ...]:
    return tuple(dim(s, spec) for s in symbols)


def expected_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name this model has, with its shape, in HF's usual order."""
    out: dict[str, tuple[int, ...]] = {EMBED: (spec.vocab_size, spec.emb_dim)}
    per_layer = dict(LAYER_TENSORS)
    if spec.qk_norm:
        per_layer.update(QK_NORM_TENSORS)
    for i in range(spec.num_layers):
        for suffix, symbols in per_layer.items():
            out[layer_name(i, suffix)] = shape_of(symbols, spec)
    out[FINAL_NORM] = (spec.emb_dim,)
    if not spec.tie_word_embeddings:
        out[LM_HEAD] = (spec.vocab_size, spec.emb_dim)
    return out


def check_shapes(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """Raise ShapeMismatchError for the first tensor whose shape differs, CorruptCheckpointError if one is missing."""
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CorruptCheckpointError(
            f"{where}: tensor {missing[0]!r}{more} is missing; the model spec expects it. "
            "Check that the checkpoint is complete and that --model names the right family."
        )
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise ShapeMismatchError(
                f"{where}: tensor {name!r} has shape {tuple(found[name])}, expected {tuple(shape)} "
                "from the model dimensions; the checkpoint and its config disagree."
            )


class HFLayout:
    """HF names are the hub, so both directions are (validated) identities."""

    name = "hf"

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        return EMBED in infos and any(n.startswith("model.layers.") for n in infos)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        if EMBED not in infos:
            raise CorruptCheckpointError(f"no {EMBED!r} among {len(infos)} tensors: not a Llama-family HF model")
        vocab, emb = infos[EMBED].shape
        layers = {int(m.group(1)) for n in infos if (m := _LAYER_RE.match(n))}
        num_layers = max(layers) + 1 if layers else 0
        dims: dict[str, Any] = {
            "vocab_size": vocab,
            "emb_dim": emb,
            "num_layers": num_layers,
            "tie_word_embeddings": LM_HEAD not in infos,
            "qk_norm": "model.layers.0.self_attn.q_norm.weight" in infos,
        }
        gate = infos.get("model.layers.0.mlp.gate_proj.weight")
        if gate is not None:
            dims["mlp_dim"] = gate.shape[0]
        q, k = infos.get("model.layers.0.self_attn.q_proj.weight"), infos.get("model.layers.0.self_attn.k_proj.weight")
        if q is not None and k is not None:  # H*D and G*D: one factor (config or --set) gives the rest
            dims["_q_features"], dims["_kv_features"] = q.shape[0], k.shape[0]
        if dims["qk_norm"]:
            # q/k norms are per head feature, so they tell head_dim and thus the head counts.
            head_dim = infos["model.layers.0.self_attn.q_norm.weight"].shape[0]
            dims["head_dim"] = head_dim
            dims["num_heads"] = infos["model.layers.0.self_attn.q_proj.weight"].shape[0] // head_dim
            dims["num_kv_heads"] = infos["model.layers.0.self_attn.k_proj.weight"].shape[0] // head_dim
        return dims

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        expected = expected_tensors(spec)
        check_shapes({n: t.shape for n, t in tensors.items()}, expected, "HF checkpoint")
        return {name: tensors[name] for name in expected}

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        expected = expected_tensors(spec)
        check_shapes({n: t.shape for n, t in hf.items()}, expected, "HF tensors")
        # Keep the incoming order: sources that stream stacked tensors rely on it.
        return {name: t for name, t in hf.items() if name in expected}


# ------------------------------------------------------------- config files


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict, with a clear error when it is not a JSON object."""
    try:
        config = read_json(as_path(path))
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(f"{path}: cannot read it as JSON ({err}); pass a valid HF config.json") from None
    if not isinstance(config, dict):
        raise CorruptCheckpointError(f"{path}: holds a JSON {type(config).__name__}, not an object; pass a valid HF config.json")
    return config


def config_hints(path: Path) -> dict[str, Any]:
    """The ModelSpec fields (and `family`) an HF config.json file states.

    >>> config_hints("llama-hf/config.json")["rope_theta"]  # doctest: +SKIP
    500000.0
    """
    config = read_config(path)
    try:
        return hints_from_config(config)
    except (AttributeError, TypeError, ValueError) as err:  # a value of the wrong type, e.g. "rope_theta": null
        raise CorruptCheckpointError(f"{path}: not a usable HF config ({type(err).__name__}: {err}); fix or replace it") from None


def hints_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields an HF config.json states (plus `family`)."""
    family = family_from_hf_config(config)
    theta, scaling = hf_rope(config)
    hints: dict[str, Any] = {"family": family.name, "rope_theta": theta, "rope_scaling": scaling}
    mapping = {
        "num_hidden_layers": "num_layers",
        "hidden_size": "emb_dim",
        "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "intermediate_size": "mlp_dim",
        "vocab_size": "vocab_size",
        "rms_norm_eps": "rms_norm_eps",
        "max_position_embeddings": "max_position_embeddings",
        "tie_word_embeddings": "tie_word_embeddings",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
    }
    for key, field_name in mapping.items():
        if config.get(key) is not None:
            hints[field_name] = config[key]
    if "num_kv_heads" not in hints and "num_heads" in hints:
        hints["num_kv_heads"] = hints["num_heads"]
    if "head_dim" not in hints and "num_heads" in hints and "emb_dim" in hints:
        hints["head_dim"] = hints["emb_dim"] // hints["num_heads"]
    if "tie_word_embeddings" not in hints:
        hints["tie_word_embeddings"] = False  # transformers' default for these models
    return hints


def _rope_json(spec: ModelSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
    scaling = dict(spec.rope_scaling) if spec.rope_scaling else None
    params = {"rope_theta": float(spec.rope_theta), "rope_type": "default"}
    if scaling:
        params.update({k: v for k, v in scaling.items() if k != "type"})
        params.setdefault("rope_type", scaling.get("type", "default"))
    return params, scaling


def _dtype_name(dtype: np.dtype | None) -> str:
    return {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}.get(np.dtype(dtype).name, "float32") if dtype is not None else "float32"


def config_json(spec: ModelSpec, dtype: np.dtype | None = None) -> dict[str, Any]:
    """The config.json transformers loads for `spec` (5.x form plus the 4.x rope keys)."""
    family = FAMILIES[spec.family]
    rope_parameters, rope_scaling = _rope_json(spec)
    config: dict[str, Any] = {
        "architectures": [family.hf_architecture],
        "model_type": family.hf_model_type,
        "hidden_act": "silu",
        "hidden_size": spec.emb_dim,
        "intermediate_size": spec.mlp_dim,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": rope_parameters,
        # transformers 4.x reads these two; 5.x prefers rope_parameters (same values).
        "rope_theta": float(spec.rope_theta),
        "rope_scaling": rope_scaling,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "pad_token_id": None,
        "dtype": _dtype_name(dtype),
        "torch_dtype": _dtype_name(dtype),
    }
    config.update(family.hf_config_extra)
    if family.hf_model_type == "qwen3":
        config["max_window_layers"] = spec.num_layers
        config["layer_types"] = ["full_attention"] * spec.num_layers
    version = _transformers_version()
    if version:
        config["transformers_version"] = version
    return dict(sorted(config.items()))


def generation_config_json(spec: ModelSpec) -> dict[str, Any]:
    config: dict[str, Any] = {"_from_model_config": True, "bos_token_id": spec.bos_token_id, "eos_token_id": spec.eos_token_id}
    version = _transformers_version()
    if version:
        config["transformers_version"] = version
    return config


def _transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def write_sidecars(directory: Path, spec: ModelSpec, dtype: np.dtype | None = None, tokenizer: Path | None = None) -> list[Path]:
    """Write config.json, generation_config.json and copy tokenizer files; returns what was written."""
    directory = Path(directory)
    written = []
    for name, content in (("config.json", config_json(spec, dtype)), ("generation_config.json", generation_config_json(spec))):
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
        written.append(directory / name)
    if tokenizer is not None:
        written += copy_tokenizer(Path(tokenizer), directory)
    return written


def copy_tokenizer(source: Path, directory: Path) -> list[Path]:
    """Copy the tokenizer files HF knows from `source` (a dir) into `directory`."""
    if not source.is_dir():
        raise CorruptCheckpointError(f"--tokenizer {source}: not a directory; pass the folder holding tokenizer.json")
    copied = [shutil.copy2(source / name, directory / name) for name in TOKENIZER_FILES if (source / name).is_file()]
    if not copied:
        raise CorruptCheckpointError(
            f"--tokenizer {source}: none of {', '.join(TOKENIZER_FILES)} found there"
        )
    return [Path(p) for p in copied]
