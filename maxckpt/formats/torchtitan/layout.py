"""TorchTitan Llama 3 (and Qwen 3, Qwen 3 MoE, DeepSeek V3, gpt-oss) model keys <-> HF, as lazy tensors (no I/O).

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
The `step-N` folders and `train_state` are the files module's (:mod:`maxckpt.formats.torchtitan.files`).

The layers are the families' tables (:mod:`maxckpt.families.tables.torchtitan`, gpt-oss's in its file), in the
mapping vocabulary of :mod:`maxckpt.layouts.mapping`; this module walks them.

>>> layout = TorchTitanLayout(keys="2026")                          # doctest: +SKIP
>>> tt = layout.from_hf(hf_tensors, model_spec)                    # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.families import FAMILIES
from maxckpt.families.tables.torchtitan import (
    QKV_NAMES, ROUTER, KeyGeneration, TorchTitanLayer, global_entries, reading_entries,
)
from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import At, Entry, Memo, ZeroBias, hf_infos_of
from maxckpt.layouts.transforms import lazy_rename
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = ["KeyGeneration", "TorchTitanLayout", "layer_table", "strip_model_prefix"]

MODEL_PREFIX = "model."


def layer_table(spec: ModelSpec, keys: KeyGeneration, i: int) -> TorchTitanLayer:
    """Layer i's entries, from its family's table (see :mod:`maxckpt.families.tables.torchtitan`)."""
    return FAMILIES[spec.family].torchtitan_table(spec, keys, hfl.is_moe_layer(spec, i))


def _get(
    tensors: Mapping[str, LazyTensor], name: str, shape: tuple[int, ...], where: str, note: str = ""
) -> LazyTensor:
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
        if self.keys not in QKV_NAMES:
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
        if "layers.0.attention.wkv_a.weight" in names:  # MLA
            return self._dims_through_hf(names, reading_entries(self.detect_keys(names)))
        for family in FAMILIES.values():  # a family with keys of its own (gpt-oss's sinks and biases)
            entries = self._family_reading(family, names)
            if entries:
                return self._dims_through_hf(names, entries)
        if moe is not None and ("layers.0." + ROUTER not in names or "layers.0.attention.q_norm.weight" not in names):
            raise UnsupportedModelError(
                f"{moe!r}: a Mixture-of-Experts TorchTitan checkpoint other than Qwen 3 MoE (deepseek_v3, "
                "gpt_oss); maxckpt reads TorchTitan's dense llama3/qwen3 and its qwen3 MoE models only"
            )
        if "tok_embeddings.weight" not in names:
            raise CorruptCheckpointError(
                f"no 'tok_embeddings.weight' among {len(names)} items: not a TorchTitan Llama-family checkpoint"
            )
        vocab, emb = names["tok_embeddings.weight"].shape
        layers = {int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))}
        if not layers:
            raise CorruptCheckpointError("no layers.{i}.* tensors: not a TorchTitan decoder checkpoint")
        wq, wk, _ = QKV_NAMES[self.detect_keys(names)]
        dims: dict[str, Any] = {
            "num_layers": max(layers) + 1,
            "emb_dim": emb,
            "vocab_size": vocab,
            "qk_norm": "layers.0.attention.q_norm.weight" in names,
        }
        w1 = names.get("layers.0.feed_forward.w1.weight")
        if w1 is not None:
            dims["mlp_dim"] = w1.shape[0]
        if moe is not None:
            experts = names["layers.0.moe.routed_experts.inner_experts.w1_EFD"].shape  # [X, M, E]
            dims.update(num_experts=experts[0], moe_mlp_dim=experts[1], mlp_dim=experts[1], _family="qwen3-moe")
        q, k = names.get("layers.0." + wq), names.get("layers.0." + wk)
        if q is not None and k is not None:
            dims["_q_features"], dims["_kv_features"] = q.shape[0], k.shape[0]
        if dims["qk_norm"]:
            dims["head_dim"] = names["layers.0.attention.q_norm.weight"].shape[0]
        return dims

    def _family_reading(self, family: Any, names: Mapping[str, TensorInfo]) -> tuple[Entry, ...]:
        """The entries to read a checkpoint of `family` by, when it has keys of its own there (else ())."""
        if not family.torchtitan_reading:
            return ()
        standard = reading_entries(self.detect_keys(names))
        own = {e.key for e in family.torchtitan_reading} - {e.key for e in standard}
        if not any(f"layers.0.{key}" in names for key in own):
            return ()
        return (*standard, *family.torchtitan_reading)

    @staticmethod
    def _dims_through_hf(names: Mapping[str, TensorInfo], entries: tuple[Entry, ...]) -> dict[str, Any]:
        """Dims from TorchTitan shapes, by way of the HF shapes its entries say they are (later entries win)."""
        by_key = {e.key: e for e in entries}
        hf_infos: dict[str, TensorInfo] = {hfl.EMBED: names["tok_embeddings.weight"]}
        per_layer: dict[int, dict[str, TensorInfo]] = {}
        for name, info in names.items():
            if m := re.match(r"layers\.(\d+)\.(.+)$", name):
                per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = info
        for i in sorted(per_layer):
            for suffix, info in hf_infos_of(by_key, per_layer[i]).items():
                hf_infos[hfl.layer_name(i, suffix)] = info
        if "lm_head.weight" in names:
            hf_infos[hfl.LM_HEAD] = names["lm_head.weight"]
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims["tie_word_embeddings"] = False  # TorchTitan stores the output weight either way
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
        # Family.torchtitan_rotary: qwen3 uses HF's rotate-half; DeepSeek V3's MLA rope pairs are interleaved in
        # TorchTitan and in HF's rope_interleave alike, so nothing is permuted there either.
        return FAMILIES[spec.family].torchtitan_rotary

    def _check(self, spec: ModelSpec) -> str:
        """The rotary order q/k rows take; refuses what no TorchTitan model holds."""
        family = FAMILIES[spec.family]
        if spec.num_experts and family.torchtitan_model is None:
            raise UnsupportedModelError(
                f"{spec.family}: maxckpt's TorchTitan mapping covers Qwen 3 MoE, DeepSeek V3 and gpt-oss "
                "among MoE models"
            )
        return self.rotary_for(spec)

    # ------------------------------------------------------------- from HF

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors under TorchTitan's flat model keys.

        Globals first, then kind by kind (every layer's wq, every layer's wk, ...):
        a scanned MaxText source stores each kind as one [.., L, ..] array, and
        reading it kind by kind decodes its chunks once (see transforms.LayerGroups).
        The MoE entries of each layer follow, layer by layer.
        """
        rotary = self.rotary_for(spec)
        if spec.qk_norm and rotary == "interleaved":
            raise UnsupportedModelError(
                "q/k norms with interleaved rotary: TorchTitan has no such model; use rotary='half' (Qwen 3)"
            )
        self._check(spec)
        shapes = hfl.expected_tensors(spec)

        def get(name: str) -> LazyTensor:
            return _get(hf, name, shapes[name], "HF -> TorchTitan")

        def getter(i: int):
            return lambda suffix: get(hfl.layer_name(i, suffix))

        glob = At(spec, -1, lambda s: s)
        out = {entry.key: entry.build(get, entry.key, glob) for entry in global_entries(spec, self.keys)}
        tables = [layer_table(spec, self.keys, i) for i in range(spec.num_layers)]
        ats = [At(spec, i, lambda s, i=i: hfl.layer_name(i, s), rotary) for i in range(spec.num_layers)]
        kinds = dict.fromkeys(e.key for t in tables for e in t.renames)
        for key in kinds:
            for i, table in enumerate(tables):
                entry = next((e for e in table.renames if e.key == key), None)
                if entry is not None:
                    name = f"layers.{i}.{key}"
                    out[name] = entry.build(getter(i), name, ats[i])
        for i, table in enumerate(tables):
            for entry in table.moe:
                name = f"layers.{i}.{entry.key}"
                out[name] = entry.build(getter(i), name, ats[i])
        return out

    # ------------------------------------------------------------- to HF

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express TorchTitan tensors (either key generation, `model.` prefix or not) as HF.

        A balancing bias HF has no place for must be zero: the router refuses to be read otherwise.
        """
        tensors = strip_model_prefix(tensors)
        gen = self.detect_keys(tensors)
        rotary = self._check(spec)
        shapes = hfl.expected_tensors(spec)
        where, note = "TorchTitan -> HF", f" ({gen} key names)"

        out: dict[str, LazyTensor] = {}
        glob = At(spec, -1, lambda s: s)
        for entry in global_entries(spec, gen):
            if entry.hf in out:  # tied: the stored output copy (the embedding's values) is left alone
                continue
            out.update(entry.split(_get(tensors, entry.key, shapes[entry.hf], where, note), glob))
        out = hfl.in_hf_order(out, shapes)
        memos: dict[str, Memo] = {}
        for i in range(spec.num_layers):
            table = layer_table(spec, gen, i)
            at = At(spec, i, lambda s, i=i: hfl.layer_name(i, s), rotary, memos)
            layer: dict[str, LazyTensor] = {}
            guards: list[tuple[ZeroBias, LazyTensor]] = []
            for entry in (*table.renames, *table.moe):
                key = f"layers.{i}.{entry.key}"
                if isinstance(entry, ZeroBias):
                    if key in tensors:
                        guards.append((entry, lazy_rename(tensors[key], key)))
                    continue
                want = entry.shape(lambda s: shapes[hfl.layer_name(i, s)], spec)
                layer.update(entry.split(_get(tensors, key, want, where, note), at))
            for entry, bias in guards:
                entry.guard(bias, layer, "TorchTitan")
            out.update({hfl.layer_name(i, s): t for s, t in hfl.in_layer_order(layer, spec, i).items()})
        return out
