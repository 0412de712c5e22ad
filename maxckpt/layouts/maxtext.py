"""The MaxText layout (Llama-family decoder), scanned or not, mapped to and from HF.

The mapping is a table (:data:`LAYER_PARAMS`, :data:`GLOBAL_PARAMS`): MaxText
path, HF name, and the kernel's input/output dimensions in spec symbols. Two
family-dependent steps come from the :class:`ModelSpec` (see families.py):
the rotary feature order of q/k (`maxtext_rotary`) and whether the query
kernel carries MaxText's 1/sqrt(head_dim) (`maxtext_query_scale`).

Scanned checkpoints stack layers on `param_scan_axis` (1 in MaxText, for
every layer tensor including norm scales: [E, L]); unscanned ones name them
`decoder/layers_{i}/...`. Training checkpoints nest params under
`params/params/`, param-only ones do not; both are read, and written
checkpoints use `params/params/` (what MaxText's `load_parameters_path` reads).

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("llama2", 2, 8, 2, 1, 4, 16, 32)
>>> names = list(MaxTextLayout(scan_layers=True).from_hf(_zeros_hf(spec), spec))
>>> names[0], len(names)
('params/params/token_embedder/embedding', 12)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError
from maxckpt.layouts import hf as hfl
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.tensors import LazyTensor, TensorInfo

PARAMS_PREFIX = "params/params/"
_LAYER_RE = re.compile(r"^decoder/layers_(\d+)/(.+)$")
_SKIPPED_ROOTS = ("opt_state/", "nnx_aux/", "step")


@dataclass(frozen=True)
class Param:
    """One MaxText parameter and its HF counterpart.

    `in_dims`/`out_dims` are the kernel's input and output dimensions as spec
    symbols; an empty `in_dims` marks a vector/table copied as is.
    """

    maxtext: str
    hf: str
    in_dims: tuple[str, ...]
    out_dims: tuple[str, ...]
    rotary: bool = False  # q/k per-head features: reordered when MaxText is interleaved
    query: bool = False  # carries MaxText's folded 1/sqrt(head_dim)
    when: str | None = None  # "qk_norm" or "untied": present only then

    def maxtext_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        return hfl.shape_of(self.in_dims + self.out_dims, spec)

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        if not self.in_dims:
            return hfl.shape_of(self.out_dims, spec)
        return (math.prod(hfl.shape_of(self.out_dims, spec)), math.prod(hfl.shape_of(self.in_dims, spec)))

    def present(self, spec: ModelSpec) -> bool:
        if self.when == "qk_norm":
            return spec.qk_norm
        if self.when == "untied":
            return not spec.tie_word_embeddings
        return True

    # ------------------------------------------------------------ transforms

    def to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        if self.rotary and spec.maxtext_rotary == "interleaved":
            x = tf.permute_last(x, tf.half_from_interleaved(spec.head_dim))
        if self.query and spec.maxtext_query_scale:
            x = tf.scale(x, math.sqrt(spec.head_dim))
        return tf.kernel_to_torch(x, len(self.in_dims)) if self.in_dims else x

    def from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        x = w
        if self.in_dims:
            x = tf.torch_to_kernel(w, hfl.shape_of(self.in_dims, spec), hfl.shape_of(self.out_dims, spec))
        if self.query and spec.maxtext_query_scale:
            x = tf.unscale(x, math.sqrt(spec.head_dim))
        if self.rotary and spec.maxtext_rotary == "interleaved":
            x = tf.permute_last(x, tf.interleaved_from_half(spec.head_dim))
        return x


# Paths under decoder/layers (scanned) or decoder/layers_{i} (unscanned).
LAYER_PARAMS: tuple[Param, ...] = (
    Param("self_attention/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "D"), rotary=True, query=True),
    Param("self_attention/key/kernel", "self_attn.k_proj.weight", ("E",), ("Hkv", "D"), rotary=True),
    Param("self_attention/value/kernel", "self_attn.v_proj.weight", ("E",), ("Hkv", "D")),
    Param("self_attention/out/kernel", "self_attn.o_proj.weight", ("Hq", "D"), ("E",)),
    Param("self_attention/query_norm/scale", "self_attn.q_norm.weight", (), ("D",), rotary=True, when="qk_norm"),
    Param("self_attention/key_norm/scale", "self_attn.k_norm.weight", (), ("D",), rotary=True, when="qk_norm"),
    Param("mlp/wi_0/kernel", "mlp.gate_proj.weight", ("E",), ("F",)),
    Param("mlp/wi_1/kernel", "mlp.up_proj.weight", ("E",), ("F",)),
    Param("mlp/wo/kernel", "mlp.down_proj.weight", ("F",), ("E",)),
    Param("pre_self_attention_layer_norm/scale", "input_layernorm.weight", (), ("E",)),
    Param("post_self_attention_layer_norm/scale", "post_attention_layernorm.weight", (), ("E",)),
)

GLOBAL_PARAMS: tuple[Param, ...] = (
    Param("token_embedder/embedding", hfl.EMBED, (), ("V", "E")),
    Param("decoder/decoder_norm/scale", hfl.FINAL_NORM, (), ("E",)),
    Param("decoder/logits_dense/kernel", hfl.LM_HEAD, ("E",), ("V",), when="untied"),
)


def canonical_names(names: Iterable[str]) -> dict[str, str]:
    """Canonical MaxText param path (no `params/params/`) -> stored name.

    Training state (`opt_state`, `nnx_aux`, `step`) is left out.
    """
    names = list(names)
    prefixed = [n for n in names if n.startswith(PARAMS_PREFIX)]
    if prefixed:
        return {n[len(PARAMS_PREFIX):]: n for n in prefixed}
    return {n: n for n in names if not n.startswith(_SKIPPED_ROOTS)}


class MaxTextLayout:
    """MaxText <-> HF for the Llama family (llama2/3/3.1, mistral, qwen3)."""

    name = "maxtext"

    def __init__(self, scan_layers: bool | None = True, scan_axis: int = 1, read_budget: int | None = None):
        # scan_layers=None: write the layout the source had (from_hf then uses scanned).
        self.scan_layers = scan_layers
        self.scan_axis = scan_axis
        self.read_budget = read_budget

    # ---------------------------------------------------------------- reading

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        names = canonical_names(infos)
        return "token_embedder/embedding" in names and any(n.startswith("decoder/") for n in names)

    def is_scanned(self, names: Iterable[str]) -> bool:
        return any(n.startswith("decoder/layers/") for n in canonical_names(names))

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        names = canonical_names(infos)
        if "token_embedder/embedding" not in names:
            raise CorruptCheckpointError(
                "no token_embedder/embedding among the checkpoint's params: not a MaxText Llama-family checkpoint"
            )

        def shape(path: str) -> tuple[int, ...]:
            # A MaxText tree of another architecture (MoE, MLA, Gemma...) lacks Llama's tensors.
            if path not in names:
                raise UnsupportedModelError(
                    f"MaxText checkpoint has no {path}: not a Llama-family (llama2/llama3/mistral/qwen3) "
                    "parameter tree, which is what maxckpt converts"
                )
            return tuple(infos[names[path]].shape)

        vocab, emb = shape("token_embedder/embedding")
        if self.is_scanned(names):
            q = shape("decoder/layers/self_attention/query/kernel")
            num_layers, heads, head_dim = q[self.scan_axis], *tf.remove_axis(q, self.scan_axis)[1:]
            kv_heads = tf.remove_axis(shape("decoder/layers/self_attention/key/kernel"), self.scan_axis)[1]
            mlp = tf.remove_axis(shape("decoder/layers/mlp/wi_0/kernel"), self.scan_axis)[1]
            qk_norm = "decoder/layers/self_attention/query_norm/scale" in names
        else:
            layers = sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n))})
            if not layers:
                raise CorruptCheckpointError("MaxText checkpoint has neither decoder/layers nor decoder/layers_0")
            num_layers = layers[-1] + 1
            _, heads, head_dim = shape("decoder/layers_0/self_attention/query/kernel")
            kv_heads = shape("decoder/layers_0/self_attention/key/kernel")[1]
            mlp = shape("decoder/layers_0/mlp/wi_0/kernel")[1]
            qk_norm = "decoder/layers_0/self_attention/query_norm/scale" in names
        return {
            "num_layers": num_layers,
            "emb_dim": emb,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "mlp_dim": mlp,
            "vocab_size": vocab,
            "tie_word_embeddings": "decoder/logits_dense/kernel" not in names,
            "qk_norm": qk_norm,
        }

    def expected_tensors(self, spec: ModelSpec, scanned: bool, prefix: str = "") -> dict[str, tuple[int, ...]]:
        """MaxText path -> shape for this spec."""
        out = {prefix + p.maxtext: p.maxtext_shape(spec) for p in GLOBAL_PARAMS if p.present(spec)}
        for p in LAYER_PARAMS:
            if not p.present(spec):
                continue
            if scanned:
                out[f"{prefix}decoder/layers/{p.maxtext}"] = tf.insert_axis(p.maxtext_shape(spec), self.scan_axis, spec.num_layers)
            else:
                for i in range(spec.num_layers):
                    out[f"{prefix}decoder/layers_{i}/{p.maxtext}"] = p.maxtext_shape(spec)
        return out

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """HF tensors computed lazily from MaxText ones, kind by kind, layer by layer.

        The order (all q_proj layers, then all k_proj, ...) lets :class:`LayerGroups`
        decode each stacked tensor's chunks once.
        """
        names = canonical_names(tensors)
        scanned = self.is_scanned(names)
        hfl.check_shapes({c: tensors[s].shape for c, s in names.items()}, self.expected_tensors(spec, scanned), "MaxText checkpoint")
        groups = tf.LayerGroups(self.read_budget)
        out: dict[str, LazyTensor] = {}
        for p in GLOBAL_PARAMS:
            if p.present(spec):
                out[p.hf] = tf.lazy_map(p.hf, tensors[names[p.maxtext]], lambda x, p=p: p.to_hf(x, spec), p.hf_shape(spec))
        for p in LAYER_PARAMS:
            if not p.present(spec):
                continue
            for i in range(spec.num_layers):
                hf_name = hfl.layer_name(i, p.hf)
                convert = lambda x, p=p: p.to_hf(x, spec)  # noqa: E731
                if scanned:
                    src = tensors[names[f"decoder/layers/{p.maxtext}"]]
                    read_layer = lambda src=src, i=i: groups.layer(src, self.scan_axis, i)  # noqa: E731
                    out[hf_name] = LazyTensor.computed(hf_name, p.hf_shape(spec), src.dtype, lambda r=read_layer, c=convert: c(r()))
                else:
                    src = tensors[names[f"decoder/layers_{i}/{p.maxtext}"]]
                    out[hf_name] = tf.lazy_map(hf_name, src, convert, p.hf_shape(spec))
        return out

    # ---------------------------------------------------------------- writing

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """MaxText tensors (named `params/params/...`) built lazily from HF ones.

        Scanned tensors are stacks whose `pieces` are the layers, so writers
        stream them one layer at a time.
        """
        hfl.check_shapes({n: t.shape for n, t in hf.items()}, hfl.expected_tensors(spec), "HF tensors")
        out: dict[str, LazyTensor] = {}
        for p in GLOBAL_PARAMS:
            if p.present(spec):
                name = PARAMS_PREFIX + p.maxtext
                out[name] = tf.lazy_map(name, hf[p.hf], lambda w, p=p: p.from_hf(w, spec), p.maxtext_shape(spec))
        scanned = self.scan_layers is not False
        for p in LAYER_PARAMS:
            if not p.present(spec):
                continue
            parts = []
            for i in range(spec.num_layers):
                name = f"{PARAMS_PREFIX}decoder/layers_{i}/{p.maxtext}"
                parts.append(tf.lazy_map(name, hf[hfl.layer_name(i, p.hf)], lambda w, p=p: p.from_hf(w, spec), p.maxtext_shape(spec)))
            if scanned:
                name = f"{PARAMS_PREFIX}decoder/layers/{p.maxtext}"
                out[name] = LazyTensor.stacked(name, parts, axis=self.scan_axis)
            else:
                out.update({part.name: part for part in parts})
        return out


def as_tree(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`{"a/b/c": x}` -> `{"a": {"b": {"c": x}}}`: the nested dict Orbax saves and restores.

    >>> as_tree({"params/params/token_embedder/embedding": 1})
    {'params': {'params': {'token_embedder': {'embedding': 1}}}}
    """
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _zeros_hf(spec: ModelSpec) -> dict[str, LazyTensor]:
    """Zero HF tensors for a spec (doctest helper)."""
    return {n: LazyTensor.from_array(n, np.zeros(s, np.float32)) for n, s in hfl.expected_tensors(spec).items()}
