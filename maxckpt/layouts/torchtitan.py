"""TorchTitan Llama 3 (and Qwen 3) DCP layout <-> HF, plus `step-N` dirs and train_state.

TorchTitan saves `<checkpoint.folder>/step-<N>/` DCP directories whose model
keys sit flat at the top level (older full checkpoints prefixed them with
`model.`). Two key generations exist:

=========================================  ==============================================
classic (2024-2025)                        2026 (torchtitan 0.3.0)
=========================================  ==============================================
`layers.{i}.attention.wq.weight` (wk, wv)   `layers.{i}.attention.qkv_linear.wq.weight` ...
`output.weight`                            `lm_head.weight`
=========================================  ==============================================

shared by both: `tok_embeddings.weight`, `layers.{i}.attention.wo.weight`,
`layers.{i}.feed_forward.w1/w3/w2.weight` (gate/up/down),
`layers.{i}.attention_norm.weight`, `layers.{i}.ffn_norm.weight`,
`norm.weight`; Qwen 3 adds `layers.{i}.attention.q_norm/k_norm.weight`.
With weight tying the model state dict holds both the embedding and the
output key (same values); both are written.

Rotary: TorchTitan's Llama uses interleaved-pair rotary (Meta's layout), so q/k
rows are permuted per head against HF, as its own `Llama3StateDictAdapter`
does; its Qwen 3 uses HF's rotate-half layout and needs no permutation.

>>> layout = TorchTitanLayout(keys="2026")                          # doctest: +SKIP
>>> tt = layout.from_hf(hf_tensors, model_spec)                    # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.layouts import hf as hfl
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.torch_transforms import rotary_rows
from maxckpt.layouts.transforms import lazy_rename
from maxckpt.tensors import LazyTensor, TensorInfo
from maxckpt.containers.torchtitan_files import (  # noqa: F401 - run-dir I/O moved there; names kept for importers
    TRAIN_STATE,
    find_step_dir,
    read_train_step,
    step_dir_name,
    write_train_state,
)

__all__ = [
    "TorchTitanLayout",
    "find_step_dir",
    "torchtitan_model_notes",
    "open_torchtitan_writer",
    "read_train_step",
    "step_dir_name",
    "strip_model_prefix",
    "write_train_state",
]

KeyGeneration = Literal["2026", "classic"]

_QKV_NAMES = {
    "2026": ("attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight", "attention.qkv_linear.wv.weight"),
    "classic": ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight"),
}
_OUTPUT_NAMES = {"2026": "lm_head.weight", "classic": "output.weight"}
# Per-layer keys after `layers.{i}.` that both generations share, with their HF suffix.
_SHARED_LAYER_KEYS = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_QK_NORM_KEYS = {"attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight"}
# Model families whose TorchTitan model uses HF's rotate-half rotary.
_HALF_ROTARY_FAMILIES = ("qwen3",)
MODEL_PREFIX = "model."


def _layer_keys(keys: KeyGeneration, qk_norm: bool) -> dict[str, str]:
    """TorchTitan per-layer key suffix -> HF suffix, in TorchTitan's state-dict order."""
    wq, wk, wv = _QKV_NAMES[keys]
    out = {wq: "self_attn.q_proj.weight", wk: "self_attn.k_proj.weight", wv: "self_attn.v_proj.weight", **_SHARED_LAYER_KEYS}
    return {**out, **_QK_NORM_KEYS} if qk_norm else out


def _get(tensors: Mapping[str, LazyTensor], name: str, shape: tuple[int, ...], where: str, note: str = "") -> LazyTensor:
    t = tensors.get(name)
    if t is None:
        raise ShapeMismatchError(f"{where}: tensor {name!r} is missing{note}")
    if tuple(t.shape) != shape:
        raise ShapeMismatchError(f"{name}: shape {tuple(t.shape)}, the model spec implies {shape}")
    return t


def strip_model_prefix(names: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the `model.` prefix older TorchTitan full checkpoints put on model keys.

    Only applied when the model keys carry it (`model.tok_embeddings.weight`),
    so flat 0.3.0 checkpoints pass through unchanged; non-model keys
    (`optimizer.*`, `train_state.*`) are dropped when stripping.
    """
    if f"{MODEL_PREFIX}tok_embeddings.weight" not in names:
        return dict(names)
    return {k[len(MODEL_PREFIX):]: v for k, v in names.items() if k.startswith(MODEL_PREFIX)}


@dataclass(frozen=True)
class TorchTitanLayout:
    """TorchTitan Llama-family model keys, mapped to and from HF.

    keys: "2026" (`attention.qkv_linear.wq`, `lm_head`; torchtitan 0.3.0) or
        "classic" (`attention.wq`, `output`); only used when writing, reading
        detects the generation (and a `model.` prefix) from the names.
    rotary: "interleaved" or "half"; None picks TorchTitan's choice for the
        family (half for qwen3, interleaved for the Llama family).
    """

    keys: KeyGeneration = "2026"
    rotary: Literal["interleaved", "half"] | None = None

    name: ClassVar[str] = "torchtitan"

    def __post_init__(self) -> None:
        if self.keys not in _QKV_NAMES:
            raise UnsupportedModelError(f"TorchTitan keys must be '2026' or 'classic', got {self.keys!r}")
        if self.rotary not in (None, "interleaved", "half"):
            raise UnsupportedModelError(f"TorchTitan rotary must be 'interleaved' or 'half', got {self.rotary!r}")

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        """True for TorchTitan model key names (either generation, with or without `model.`)."""
        names = strip_model_prefix(infos)
        return "tok_embeddings.weight" in names and any(k.startswith("layers.") for k in names)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """What the shapes tell: layers, widths, vocab, q/k norms, and H*D / G*D of wq / wk.

        Tying is not visible (TorchTitan stores the output weight either way) and,
        without q/k norms, neither is head_dim: both come from `maxckpt_model.json`
        next to the tensors, a config or flags.
        """
        names = strip_model_prefix(infos)
        moe = next((n for n in names if re.match(r"layers\.\d+\.moe\.", n)), None)
        if moe is not None:
            raise UnsupportedModelError(
                f"{moe!r}: a Mixture-of-Experts TorchTitan checkpoint; maxckpt converts dense "
                "Llama-family models (llama2/3/3.1, mistral, qwen3) only"
            )
        if "tok_embeddings.weight" not in names:
            raise CorruptCheckpointError(
                f"no 'tok_embeddings.weight' among {len(names)} items: not a TorchTitan Llama-family checkpoint"
            )
        vocab, emb = names["tok_embeddings.weight"].shape
        layers = {int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))}
        if not layers:
            raise CorruptCheckpointError("no layers.{i}.* tensors: not a TorchTitan decoder checkpoint")
        wq, wk, _ = _QKV_NAMES[self.detect_keys(names)]
        dims: dict[str, Any] = {
            "num_layers": max(layers) + 1,
            "emb_dim": emb,
            "vocab_size": vocab,
            "qk_norm": "layers.0.attention.q_norm.weight" in names,
        }
        w1 = names.get("layers.0.feed_forward.w1.weight")
        if w1 is not None:
            dims["mlp_dim"] = w1.shape[0]
        q, k = names.get("layers.0." + wq), names.get("layers.0." + wk)
        if q is not None and k is not None:
            dims["_q_features"], dims["_kv_features"] = q.shape[0], k.shape[0]
        if dims["qk_norm"]:
            dims["head_dim"] = names["layers.0.attention.q_norm.weight"].shape[0]
        return dims

    @staticmethod
    def detect_keys(names: Mapping[str, Any]) -> KeyGeneration:
        """Which key generation a (prefix-stripped) TorchTitan checkpoint uses."""
        if any(".attention.qkv_linear." in k for k in names) or "lm_head.weight" in names:
            return "2026"
        return "classic"

    def rotary_for(self, spec: ModelSpec) -> str:
        if self.rotary is not None:
            return self.rotary
        return "half" if spec.family in _HALF_ROTARY_FAMILIES else "interleaved"

    # ------------------------------------------------------------- from HF

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors under TorchTitan's flat model keys.

        Globals first, then kind by kind (every layer's wq, every layer's wk, ...):
        a scanned MaxText source stores each kind as one [.., L, ..] array, and
        reading it kind by kind decodes its chunks once (see transforms.LayerGroups).
        """
        permute = self.rotary_for(spec) == "interleaved"
        if spec.qk_norm and permute:
            raise UnsupportedModelError(
                "q/k norms with interleaved rotary: TorchTitan has no such model; use rotary='half' (Qwen 3)"
            )
        shapes = hfl.expected_tensors(spec)

        def get(name: str) -> LazyTensor:
            return _get(hf, name, shapes[name], "HF -> TorchTitan")

        output = _OUTPUT_NAMES[self.keys]
        embed = get(hfl.EMBED)
        out = {
            "tok_embeddings.weight": lazy_rename(embed, "tok_embeddings.weight"),
            # The model state dict holds the output weight even when tied (then the embedding's values).
            output: lazy_rename(embed if spec.tie_word_embeddings else get(hfl.LM_HEAD), output),
            "norm.weight": lazy_rename(get(hfl.FINAL_NORM), "norm.weight"),
        }
        for suffix, hf_suffix in _layer_keys(self.keys, spec.qk_norm).items():
            for i in range(spec.num_layers):
                key = f"layers.{i}.{suffix}"
                out[key] = self._rows(get(hfl.layer_name(i, hf_suffix)), hf_suffix, spec, permute, "interleaved", key)
        return out

    # ------------------------------------------------------------- to HF

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express TorchTitan tensors (either key generation, `model.` prefix or not) as HF."""
        tensors = strip_model_prefix(tensors)
        gen = self.detect_keys(tensors)
        permute = self.rotary_for(spec) == "interleaved"
        shapes = hfl.expected_tensors(spec)

        def get(key: str, hf_name: str) -> LazyTensor:
            return _get(tensors, key, shapes[hf_name], "TorchTitan -> HF", f" ({gen} key names)")

        globals_ = {hfl.EMBED: "tok_embeddings.weight", hfl.FINAL_NORM: "norm.weight"}
        if not spec.tie_word_embeddings:  # tied: the stored output copy is left alone
            globals_[hfl.LM_HEAD] = _OUTPUT_NAMES[gen]
        out = {hf_name: lazy_rename(get(key, hf_name), hf_name) for hf_name, key in globals_.items()}
        layer_keys = _layer_keys(gen, spec.qk_norm)
        for i in range(spec.num_layers):
            for suffix, hf_suffix in layer_keys.items():
                hf_name = hfl.layer_name(i, hf_suffix)
                out[hf_name] = self._rows(get(f"layers.{i}.{suffix}", hf_name), hf_suffix, spec, permute, "half", hf_name)
        return out

    @staticmethod
    def _rows(t: LazyTensor, hf_suffix: str, spec: ModelSpec, permute: bool, to: str, name: str) -> LazyTensor:
        """`t` renamed; q/k weights with their rows in `to` rotary order when the layouts differ."""
        heads = {"self_attn.q_proj.weight": spec.num_heads, "self_attn.k_proj.weight": spec.num_kv_heads}.get(hf_suffix)
        if not permute or heads is None:
            return lazy_rename(t, name)
        return LazyTensor.computed(name, t.shape, t.dtype, lambda: rotary_rows(t.read(), heads, spec.head_dim, to))


def torchtitan_model_notes(spec: ModelSpec) -> list[str]:
    """What a TorchTitan run must configure to load this model (its settings live in the job config).

    >>> from maxckpt.layouts.base import ModelSpec
    >>> torchtitan_model_notes(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250))[0][:40]
    'TorchTitan model: llama3 with dim 64, n_'
    """
    if spec.qk_norm:
        return [
            f"TorchTitan model: qwen3 with dim {spec.emb_dim}, n_layers {spec.num_layers}, n_heads {spec.num_heads}, "
            f"n_kv_heads {spec.num_kv_heads}, head_dim {spec.head_dim}, hidden_dim {spec.mlp_dim}, "
            f"vocab_size {spec.vocab_size}, rope theta {spec.rope_theta:g}, norm eps {spec.rms_norm_eps:g}, "
            f"enable_weight_tying={spec.tie_word_embeddings}"
        ]
    rope = dict(spec.rope_scaling or {})
    scaling = (
        f"ComplexRoPE scaling='llama' (factor {rope.get('factor')}, low {rope.get('low_freq_factor')}, "
        f"high {rope.get('high_freq_factor')}, original {rope.get('original_max_position_embeddings')})"
        if rope.get("rope_type", rope.get("type")) == "llama3"
        else "ComplexRoPE scaling='none' (the stock llama3 flavors use Llama 3.1's 'llama' scaling)"
    )
    notes = [
        f"TorchTitan model: llama3 with dim {spec.emb_dim}, n_layers {spec.num_layers}, n_heads {spec.num_heads}, "
        f"n_kv_heads {spec.num_kv_heads}, hidden_dim {spec.mlp_dim}, vocab_size {spec.vocab_size}, "
        f"rope theta {spec.rope_theta:g}, {scaling}, norm eps {spec.rms_norm_eps:g}, "
        f"enable_weight_tying={spec.tie_word_embeddings}"
    ]
    if spec.head_dim * spec.num_heads != spec.emb_dim:
        notes.append(
            f"head_dim {spec.head_dim} is not dim / n_heads = {spec.emb_dim // spec.num_heads}: TorchTitan's llama3 "
            "builder derives head_dim that way, so its attention config must set head_dim explicitly"
        )
    return notes


# --------------------------------------------------------------------------
# step-N directories and train_state

def open_torchtitan_writer(folder: str | os.PathLike, step: int, *, train_state: bool = False) -> Any:
    """A DcpWriter for `<folder>/step-<step>`; with `train_state`, `train_state.step` is already in.

    Model only by default: TorchTitan's `initial_load_model_only` loads just
    the model keys, and a model-only `step-0` needs nothing else.
    """
    from maxckpt.containers.dcp import DcpWriter

    writer = DcpWriter(Path(folder) / step_dir_name(step))
    if train_state:
        write_train_state(writer, step)
    return writer
