"""The MaxText layout (every family of maxckpt.families), scanned or not, mapped to and from HF.

The mapping is the parameter tables of :mod:`maxckpt.formats.maxtext.params`, written in the shared vocabulary of
:mod:`maxckpt.layouts.mapping` (one entry per MaxText path and its HF names, with both directions), laid out in
the stacks of the family's scan style (:mod:`maxckpt.formats.maxtext.scans`). Unscanned checkpoints name layers
`decoder/layers_{i}/...` (`dense_layers_{i}`, `moe_layers_{i}`). Training checkpoints nest params under
`params/params/`, param-only ones do not; both are read, and written checkpoints use `params/params/` (what
MaxText's `load_parameters_path` reads).

>>> from maxckpt.layouts.base import ModelSpec
>>> spec = ModelSpec("llama2", 2, 8, 2, 1, 4, 16, 32)
>>> names = list(MaxTextLayout(scan_layers=True).from_hf(_zeros_hf(spec), spec))
>>> names[0], len(names)
('params/params/token_embedder/embedding', 12)
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError
from maxckpt.families import FAMILIES
from maxckpt.families.registry import refine_tree_family
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.maxtext import local_global
from maxckpt.formats.maxtext.params import (
    AUX_PREFIX, PARAMS_PREFIX, ModelVariable, global_params, maxtext_values, model_dtype,
)
from maxckpt.formats.maxtext.scans import SCANS, Stack, layer_stacks, scan_of
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import At, Entry, Experts, Part
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = ["MaxTextLayout", "as_tree", "canonical_names"]

_SKIPPED_ROOTS = ("opt_state/", "nnx_aux/", "step")


def canonical_names(names: Iterable[str]) -> dict[str, str]:
    """Canonical MaxText param path (no `params/params/`) -> stored name.

    Training state (`opt_state`, `step`, `nnx_aux` RNG state) is left out;
    model variables kept in `nnx_aux/model/` (DeepSeek's routing bias) stay,
    under their full path.
    """
    names = list(names)
    prefixed = [n for n in names if n.startswith(PARAMS_PREFIX)]
    aux = {n: n for n in names if n.startswith(AUX_PREFIX) and "/rngs/" not in n}
    if prefixed:
        return {**{n[len(PARAMS_PREFIX):]: n for n in prefixed}, **aux}
    return {**{n: n for n in names if not n.startswith(_SKIPPED_ROOTS)}, **aux}


def _tree_family(names: Iterable[str]) -> str | None:
    """The family MaxText module names alone say (MoE, MLA and Gemma trees), else None."""
    found = _generic_tree_family(names)
    return refine_tree_family(found, names) if found else None


def _generic_tree_family(names: Iterable[str]) -> str | None:
    text = "\n".join(names)
    if local_global.family_of(text):
        return local_global.family_of(text)
    if "/in_proj_qkvz/" in text:  # unscanned, the two hybrids' trees are alike: qwen3-next, or --model qwen3.5
        return "qwen3.5" if re.search(r"^decoder/layers/layer_\d+/", text, re.MULTILINE) else "qwen3-next"
    if "decoder/dense_layers" in text or "decoder/moe_layers" in text:
        return "deepseek3"
    for family in FAMILIES.values():  # a style's own stacks or modules name it (llama4's Llama4MoEBlock_0)
        if SCANS[family.maxtext_scan].owns(family, text):
            return family.name
    if "GptOssAttention/" in text:
        return "gpt-oss"
    if "self_attention_local/" in text:
        return "gemma2"
    if "/post_mlp_layer_norm/" in text:  # norms after attention and the MLP
        return "olmo3"
    if "/post_ffw_norm/" in text:  # sandwich norms
        return "gemma3"
    if "/pre_ffw_norm/" in text:  # a pre-MLP norm alone: gemma (v1)
        return "gemma"
    if "/MoeBlock_0/" in text:
        return "mixtral"
    if "/moe_block/" in text:
        return "qwen3-moe"
    return None


class MaxTextLayout:
    """MaxText <-> HF for every family of maxckpt.families, scanned or not."""

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
        scanned = ("decoder/layers/", "decoder/dense_layers/", "decoder/moe_layers/", "decoder/layers_remainder/",
                   *local_global.SCANNED_ROOTS)
        return any(n.startswith(scanned) for n in canonical_names(names))

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        names = canonical_names(infos)
        if "token_embedder/embedding" not in names:
            raise CorruptCheckpointError(
                "no token_embedder/embedding among the checkpoint's params: not a MaxText decoder checkpoint"
            )
        scanned = self.is_scanned(names)
        family = _tree_family(names)
        return scan_of(family).infer_dims(names, infos, scanned, self.scan_axis, family)

    def expected_tensors(self, spec: ModelSpec, scanned: bool, prefix: str = "") -> dict[str, tuple[int, ...]]:
        """MaxText path -> shape for this spec."""
        out = {prefix + p.key: p.framework_shape(spec) for p in global_params(spec)}
        for stack in layer_stacks(spec, scanned):
            sized = stack.sized(spec)
            for p in stack.params:
                aux = isinstance(p, ModelVariable)
                if stack.scanned:
                    path = stack.path(p)
                    out[(path if aux else prefix + path)] = stack.stacked_shape(p.framework_shape(sized),
                                                                                0 if aux else self.scan_axis)
                else:
                    for k in range(len(stack.hf_layers)):
                        path = stack.path(p, k)
                        out[(path if aux else prefix + path)] = p.framework_shape(sized)
        return out

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """HF tensors computed lazily from MaxText ones, kind by kind, layer by layer, expert by expert.

        The order (all q_proj layers, then all k_proj, ...) lets :class:`LayerGroups`
        decode each stacked tensor's chunks once; an `[X, L, ...]` expert tensor is
        read a group of layers at a time and handed out expert by expert (or, when
        one layer of it exceeds the budget, read one expert slice at a time).
        """
        names = canonical_names(tensors)
        scanned = self.is_scanned(names)
        expected = self.expected_tensors(spec, scanned)
        aux = [n for n in expected if n.startswith(AUX_PREFIX) and n not in names]
        if aux:
            raise CorruptCheckpointError(
                f"MaxText checkpoint: {aux[0]} is missing. It is {spec.family}'s routing bias, which MaxText keeps "
                "in the training state (nnx_aux), not in params: convert a training checkpoint (checkpoints/N/items "
                "of the run), not a params-only one; without it the model routes differently."
            )
        unread = [n for n in names if n.startswith(AUX_PREFIX) and "/rngs/" not in n and n not in expected]
        if unread:  # e.g. a deepseek3 run converted as deepseek2, whose routing has no bias: refused, not dropped
            raise UnsupportedModelError(
                f"MaxText checkpoint: {unread[0]} is a model variable (a routing bias) that {spec.family} "
                f"(routing {spec.routing}) has no place for; converting would drop it and route differently. "
                "Check that --model names the run's family."
            )
        hfl.check_shapes({c: tensors[s].shape for c, s in names.items()}, expected, "MaxText checkpoint")
        groups = self._layer_groups = tf.LayerGroups(self.read_budget)
        main = model_dtype(tensors)
        memos: dict = {}
        out: dict[str, LazyTensor] = {}
        at = _at(spec, None, main, memos)
        for p in global_params(spec):
            out.update(p.split(tensors[names[p.key]], at))
        for stack in layer_stacks(spec, scanned):
            sized = stack.sized(spec)  # this stack's own geometry (gemma4's global layers)
            ats = [_at(sized, layer, main, memos) for layer in stack.hf_layers]
            parts: dict[str, list[Part]] = {}
            for p in stack.params:
                if isinstance(p, Part):
                    parts.setdefault(p.hf, []).append(p)
            for p in stack.params:
                if isinstance(p, Part) and p is not parts[p.hf][0]:
                    continue  # joined with its first part
                for k, (layer, at) in enumerate(zip(stack.hf_layers, ats)):
                    if isinstance(p, Part):
                        layer_tensors = [self._layer(stack, q, k, tensors, names, groups, sized) for q in parts[p.hf]]
                        out.update(_full_names(p.join(layer_tensors, at), layer))
                    else:
                        out.update(_full_names(p.split(self._layer(stack, p, k, tensors, names, groups, sized), at),
                                               layer))
        return out

    def read_within_layers(self, lo: int, hi: int) -> None:
        """A process of a multi-process conversion converts HF layers [lo, hi) only: stacked reads stay within them."""
        groups = getattr(self, "_layer_groups", None)
        if groups is not None:
            groups.window = (lo, hi)

    def _layer(self, stack: Stack, p: Entry, k: int, tensors, names, groups: tf.LayerGroups, spec: ModelSpec
               ) -> LazyTensor:
        """Entry `p`'s MaxText tensor at stack position k, one layer's (`read((e,))`: that expert's)."""
        src = tensors[names[stack.path(p, None if stack.scanned else k)]]
        read = self._reader(stack, p, k, src, groups, spec)

        def fn(index):
            if index is None:
                return read()
            if len(index) == 1 and isinstance(index[0], (int, np.integer)):
                return read(int(index[0]))
            return read()[index]

        return LazyTensor(f"{src.name}[{k}]" if stack.scanned else src.name, p.framework_shape(spec), src.dtype, fn)

    def _reader(self, stack: Stack, p: Entry, k: int, src: LazyTensor, groups: tf.LayerGroups, spec: ModelSpec):
        """A function (expert or None) -> the MaxText array of entry `p` at stack position k (that expert's)."""
        expert = isinstance(p, Experts)
        uses = len(p.hf_suffixes(spec))  # how many HF tensors read this layer (one per expert, per split part)
        if not stack.scanned:
            return lambda e=None: src.read((e,)) if e is not None else src.read()
        axis = 0 if isinstance(p, ModelVariable) else self.scan_axis
        groups.positions[src.name] = tuple(stack.hf_layers)
        if stack.inner:  # [.., block, position, ..]: read the block, take the position (now on `axis`)
            b, j = divmod(k, stack.inner)
            uses *= stack.inner

            def nested(e=None):
                block = groups.layer(src, axis, b, uses)
                return block[e, j] if e is not None else block[tf.on_axis(axis, j)]

            return nested
        if expert and not groups.fits(src, axis):  # one layer of all experts is too big: read one expert's slice
            return lambda e=None: src.read((e, k)) if e is not None else src.read(tf.on_axis(axis, k))
        return lambda e=None: groups.layer(src, axis, k, uses)[e] if e is not None else groups.layer(src, axis, k, uses)

    # ---------------------------------------------------------------- writing

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """MaxText tensors (named `params/params/...`) built lazily from HF ones.

        Scanned tensors are stacks whose `pieces` are the layers (and, for
        `[X, L, ...]` expert tensors, one piece per expert per layer), so
        writers stream them one piece at a time.
        """
        hfl.check_shapes({n: t.shape for n, t in hf.items()}, hfl.expected_tensors(spec), "HF tensors")
        main = model_dtype(hf)
        out: dict[str, LazyTensor] = {}
        at = _at(spec, None, main, {})
        for p in global_params(spec):
            name = PARAMS_PREFIX + p.key
            out[name] = p.build(hf.__getitem__, name, at)
        scanned = self.scan_layers is not False
        for stack in layer_stacks(spec, scanned):
            sized = stack.sized(spec)  # this stack's own geometry (gemma4's global layers)
            ats = [_at(sized, layer, main, {}) for layer in stack.hf_layers]
            readers = [_layer_reader(hf, layer) for layer in stack.hf_layers]
            for p in stack.params:
                root = "" if isinstance(p, ModelVariable) else PARAMS_PREFIX
                expert = isinstance(p, Experts)
                per_layer = []
                for k, (at, get) in enumerate(zip(ats, readers)):
                    name = root + stack.path(p, k)
                    per_layer.append(p.parts(get, at) if expert else [p.build(get, name, at)])
                if stack.scanned and stack.inner:  # one tensor per block, then the blocks stacked
                    name = root + stack.path(p)
                    rows = []
                    for b in range(len(per_layer) // stack.inner):
                        block = per_layer[b * stack.inner : (b + 1) * stack.inner]
                        rows.append(
                            tf.lazy_grid(f"{name}[{b}]", block, outer_axis=self.scan_axis, inner_axis=0) if expert
                            else LazyTensor.stacked(f"{name}[{b}]", [parts[0] for parts in block], axis=self.scan_axis)
                        )
                    out[name] = LazyTensor.stacked(name, rows, axis=self.scan_axis)
                elif stack.scanned:
                    name = root + stack.path(p)
                    if expert:
                        out[name] = tf.lazy_grid(name, per_layer, outer_axis=self.scan_axis, inner_axis=0)
                    else:
                        out[name] = LazyTensor.stacked(
                            name, [parts[0] for parts in per_layer],
                            axis=0 if isinstance(p, ModelVariable) else self.scan_axis
                        )
                else:
                    for k, parts in enumerate(per_layer):
                        name = root + stack.path(p, k)
                        out[name] = LazyTensor.stacked(name, parts, axis=0) if expert else parts[0]
        return out


def _at(spec: ModelSpec, layer: int | None, main: np.dtype | None, memos: dict) -> At:
    """Where MaxText's entries apply: HF layer `layer` (None: the globals, named as they are), MaxText's rotary
    order and values (`main`: the model's dtype)."""
    def hf_name(suffix: str) -> str:
        return suffix if layer is None else hfl.layer_name(layer, suffix)

    return At(spec, -1 if layer is None else layer, hf_name, rotary=spec.maxtext_rotary, memos=memos,
              values=maxtext_values(spec, main))


def _full_names(tensors: Mapping[str, LazyTensor], layer: int) -> dict[str, LazyTensor]:
    """HF suffix -> tensor of layer `layer`, keyed by the full HF name (the tensors are named so already)."""
    return {hfl.layer_name(layer, suffix): t for suffix, t in tensors.items()}


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


def _layer_reader(hf: Mapping[str, LazyTensor], layer: int):
    """HF suffix -> that tensor of one HF layer (what entries' `build`/`parts` read through)."""
    return lambda suffix: hf[hfl.layer_name(layer, suffix)]


def _zeros_hf(spec: ModelSpec) -> dict[str, LazyTensor]:
    """Zero HF tensors for a spec (doctest helper)."""
    return {n: LazyTensor.from_array(n, np.zeros(s, np.float32)) for n, s in hfl.expected_tensors(spec).items()}
