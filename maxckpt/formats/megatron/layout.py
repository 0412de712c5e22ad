"""Megatron-Core GPT `torch_dist` names and shapes <-> HF, as lazy tensors (no I/O).

What Megatron-Core 0.16 writes for a Llama-style GPT model (checked against a
real `GPTModel.sharded_state_dict()` + `dist_checkpointing.save`, local spec):

- homogeneous layers are stacked on a leading `[L]` axis, one DCP chunk per
  layer: `decoder.layers.self_attention.linear_qkv.weight` `[L, (H+2G)*D, E]`
  (rows grouped per query group: the group's q heads, then k_g, then v_g),
  `...linear_proj.weight` `[L, E, H*D]`, `decoder.layers.mlp.linear_fc1.weight`
  `[L, 2F, E]` = `[gate; up]`, `...linear_fc2.weight` `[L, E, F]`;
- norms under the Transformer-Engine names even for the local spec (its
  `sharded_state_dict_keys_map` renames them):
  `decoder.layers.self_attention.linear_qkv.layer_norm_weight` (input norm),
  `decoder.layers.mlp.linear_fc1.layer_norm_weight` (pre-MLP norm);
  `decoder.final_layernorm.weight`, `embedding.word_embeddings.weight`
  `[V_padded, E]`, `output_layer.weight` (absent when tied);
- one `_extra_state` bytes item per layer and linear module,
  `decoder.layers.self_attention.linear_qkv._extra_state/shard_{i}_{L}`, each a
  `torch.save([None])` (TE modules also accept None: "no FP8 state").
- rotary is rotate-half like HF: q/k rows are not permuted.

Reading also accepts per-layer keys (`decoder.layers.{i}.…`, what
`singleton_local_shards` checkpoints hold, fc1 split into `weight_w`/`weight_v`)
and the local-spec module names (`input_layernorm`, `pre_mlp_layernorm`).

MoE and beyond (SequentialMLP-compatible expert keys, which GroupedMLP and TEGroupedMLP
(`--moe-grouped-gemm`) also read; each checked by loading into Megatron-Core 0.16.1's GPTModel on CPU
against transformers' logits, the TE spec's names through a TE-to-local key map):
mixtral/qwen3-moe add `mlp.router.weight [L, X, E]` and
`mlp.experts.experts.linear_fc1.weight [L, X, 2M, E]`; gpt-oss adds the q/k/v/o,
router and expert biases and `core_attention.softmax_offset` (the sinks);
DeepSeek-V3 is keyed per layer (`moe_layer_freq` is a list for its dense leading
layers) with MLA's `linear_q_down_proj`/`linear_q_up_proj`/`linear_kv_down_proj`/
`linear_kv_up_proj`, `mlp.router.expert_bias` (the routing bias) and
`mlp.shared_experts.*`. The layer spec changes a few norm names for these
(:mod:`maxckpt.formats.megatron.te_spec`); reading takes either spec's names.

The layers are the families' tables (:mod:`maxckpt.families.tables.megatron`, gpt-oss's in its file), in the
mapping vocabulary of :mod:`maxckpt.layouts.mapping`; this module walks them, stacked on `[L]` or per layer.

>>> layout = MegatronLayout(spec="local")                        # doctest: +SKIP
>>> mega = layout.from_hf(hf_tensors, model_spec)                # doctest: +SKIP
>>> sorted(layout.extra_state(model_spec))[:1]                   # doctest: +SKIP
['decoder.layers.mlp.linear_fc1._extra_state/shard_0_2']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.families import FAMILIES
from maxckpt.families.registry import refine_tree_family
from maxckpt.families.tables import megatron as n
from maxckpt.families.tables.megatron import MegatronTable
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.layout import layer_name as _hf
from maxckpt.formats.megatron import te_spec
from maxckpt.formats.megatron.support import check_supported_keys
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import At, Entry, GatedPair, Memo, Padded, Same, check_requirements, hf_infos_of
from maxckpt.layouts.torch_transforms import padded_size
from maxckpt.layouts.transforms import lazy_grid, lazy_layer
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = ["MegatronLayout"]


def _need(tensors: Mapping[str, LazyTensor], name: str, where: str) -> LazyTensor:
    try:
        return tensors[name]
    except KeyError:
        raise ShapeMismatchError(f"{where}: tensor {name!r} is missing") from None


def _check(t: LazyTensor, shape: tuple[int, ...], what: str) -> LazyTensor:
    if tuple(t.shape) != tuple(shape):
        raise ShapeMismatchError(
            f"{t.name}: shape {tuple(t.shape)}, but the model spec implies {tuple(shape)} for {what}; "
            "check the head counts / head_dim / vocab passed for this model"
        )
    return t


@dataclass(frozen=True)
class MegatronLayout:
    """Megatron-Core GPT (`torch_dist`) names and shapes, mapped to and from HF.

    spec: which Megatron layer spec the target run uses ("te" = Transformer
        Engine, Megatron-LM's default; "local" = `--transformer-impl local`).
        It decides which `_extra_state` items are written (TE adds
        `core_attention` and its norms'); tensor names are the same for both in
        core 0.16 for dense models, and differ in the norms of MoE and MLA
        layers (see :mod:`maxckpt.formats.megatron.te_spec`).
    norm_keys: "te" writes norms under the TE names that core 0.16 saves for
        both specs; "local" writes `input_layernorm`/`pre_mlp_layernorm`, as
        releases before the local spec's key map did. Reading accepts both.
    make_vocab_size_divisible_by, tensor_model_parallel_size: Megatron pads the
        vocabulary to a multiple of their product (zero rows); reading drops
        the padding again (`spec.vocab_size` rows are kept).
    """

    spec: Literal["te", "local"] = "te"
    norm_keys: Literal["te", "local"] = "te"
    make_vocab_size_divisible_by: int = 128
    tensor_model_parallel_size: int = 1

    name: ClassVar[str] = "megatron"

    def __post_init__(self) -> None:
        if self.spec not in ("te", "local"):
            raise UnsupportedModelError(f"Megatron spec must be 'te' or 'local', got {self.spec!r}")
        if self.norm_keys not in ("te", "local"):
            raise UnsupportedModelError(f"Megatron norm_keys must be 'te' or 'local', got {self.norm_keys!r}")

    # ------------------------------------------------------------- helpers

    def padded_vocab_size(self, vocab_size: int) -> int:
        """Megatron's `padded_vocab_size` for a true vocabulary size."""
        return padded_size(vocab_size, self.make_vocab_size_divisible_by * self.tensor_model_parallel_size)

    def detect(self, infos: Mapping[str, TensorInfo]) -> bool:
        """True for Megatron GPT key names (stacked or per-layer)."""
        return n.EMBED in infos or any(k.startswith("decoder.layers.") for k in infos)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """What the shapes tell: layers, widths, tie, q/k norms, and H*D / G*D of the fused QKV.

        Head counts come from `common.pt` (or flags) unless q/k layernorms give
        head_dim; the true vocabulary size is not here (only the padded one).
        """
        check_supported_keys(infos)
        if n.EMBED not in infos:
            raise CorruptCheckpointError(
                f"no {n.EMBED!r} among {len(infos)} tensors: not a Megatron-Core GPT checkpoint"
            )
        emb = infos[n.EMBED].shape[1]

        def find(suffix: str) -> tuple[TensorInfo | None, bool]:
            stacked = infos.get(f"decoder.layers.{suffix}")
            return (stacked, True) if stacked is not None else (infos.get(f"decoder.layers.0.{suffix}"), False)

        if any(n.endswith("self_attention.linear_kv_down_proj.weight") for n in infos):  # MLA, with a q LoRA or not
            return self._mla_dims(infos)
        qkv, stacked = find(n.QKV)
        if qkv is None:
            raise CorruptCheckpointError(f"no decoder.layers[.0].{n.QKV} tensor: not a Megatron-Core GPT checkpoint")
        if stacked:
            num_layers = qkv.shape[0]
        else:
            layers = {int(m.group(1)) for n in infos if (m := re.match(r"decoder\.layers\.(\d+)\.", n))}
            num_layers = max(layers) + 1
        proj, _ = find(n.PROJ)
        fc2, _ = find(n.FC2)
        q_norm, _ = find(n.Q_NORM)
        dims: dict[str, Any] = {
            "num_layers": num_layers,
            "emb_dim": emb,
            "tie_word_embeddings": n.OUTPUT not in infos,
            "qk_norm": q_norm is not None,
        }
        if fc2 is not None:
            dims["mlp_dim"] = fc2.shape[-1]
        router, exp_fc2 = infos.get(f"decoder.layers.{n.ROUTER}"), infos.get(f"decoder.layers.{n.EXP_FC2}")
        if router is not None and exp_fc2 is not None:  # MoE: experts from the router, width from fc2
            dims.update(num_experts=router.shape[-2], moe_mlp_dim=exp_fc2.shape[-1], mlp_dim=exp_fc2.shape[-1],
                        _family="qwen3-moe" if q_norm is not None else "mixtral")
        if proj is not None:
            q_features = proj.shape[-1]
            dims["_q_features"] = q_features
            dims["_kv_features"] = (qkv.shape[-2] - q_features) // 2
        if q_norm is not None:
            dims["head_dim"] = q_norm.shape[-1]
        sinks, _ = find(n.SINKS)
        if sinks is None and find(n.QKV_BIAS)[0] is not None and find(n.PROJ_BIAS)[0] is None:
            dims["qkv_bias"] = True  # q/k/v biases alone (--add-qkv-bias): qwen2.5's
        if sinks is not None:  # gpt-oss: one sink per query head tells the head count
            dims.update(_family="gpt-oss", attention_sinks=True, num_heads=sinks.shape[-1],
                        attention_bias=find(n.QKV_BIAS)[0] is not None, router_bias=find(n.ROUTER_BIAS)[0] is not None,
                        expert_bias=find(n.EXP_FC2_BIAS)[0] is not None)
        return dims

    @staticmethod
    def _mla_dims(infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """DeepSeek-V3 dims from Megatron's per-layer shapes, by way of the HF shapes its entries say they are.

        The vocabulary size is left out (Megatron's embedding is padded).
        """
        entries = {e.key: e for e in n.MLA_READING}
        hf_infos: dict[str, TensorInfo] = {"model.embed_tokens.weight": infos[n.EMBED]}
        if n.OUTPUT in infos:
            hf_infos["lm_head.weight"] = infos[n.OUTPUT]
        per_layer: dict[int, dict[str, TensorInfo]] = {}
        for name, info in infos.items():
            if m := re.match(r"decoder\.layers\.(\d+)\.(.+)$", name):
                per_layer.setdefault(int(m.group(1)), {})[te_spec.LOCAL_NAMES.get(m.group(2), m.group(2))] = info
        for i in sorted(per_layer):
            for suffix, info in hf_infos_of(entries, per_layer[i]).items():
                hf_infos[_hf(i, suffix)] = info
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims.pop("vocab_size", None)
        dims["_family"] = refine_tree_family("deepseek3", hf_infos)  # deepseek2-16b: a q_proj
        return dims

    # ------------------------------------------------------------- the table

    @staticmethod
    def table(spec: ModelSpec) -> MegatronTable:
        """The family's Megatron table (:mod:`maxckpt.families.tables.megatron`)."""
        return FAMILIES[spec.family].megatron_table

    @staticmethod
    def per_layer(spec: ModelSpec) -> bool:
        """This family's Megatron keys are per layer (`decoder.layers.{i}.…`), not stacked on [L]."""
        family = FAMILIES.get(spec.family)
        return family is not None and family.megatron_table.per_layer

    def layer_entries(self, spec: ModelSpec, i: int) -> tuple[Entry, ...]:
        """Layer i's entries, in Megatron's module order (norms under the local spec's names)."""
        return self.table(spec).layer(spec, i, FAMILIES[spec.family])

    def layer_key(self, spec: ModelSpec, i: int, meg: str) -> str:
        """The suffix this layout writes layer i's tensor `meg` (an entry's key) under."""
        if self.per_layer(spec):
            return te_spec.layer_key(self.spec == "te", spec, i, meg)
        in_norm, mlp_norm = te_spec.norm_names(self.norm_keys, spec, te=self.spec == "te")
        return {n.IN_NORM_LOCAL: in_norm, n.MLP_NORM_LOCAL: mlp_norm}.get(meg, meg)

    def _check_model(self, spec: ModelSpec, writing: bool) -> MegatronTable:
        table = self.table(spec)
        if spec.num_experts or table.per_layer:
            check_requirements(table.requires + (table.requires_to_write if writing else ()), spec)
        return table

    # ------------------------------------------------------------- from HF

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors as Megatron's `torch_dist` tensors, stacked on [L] or per layer.

        Stacked tensors carry `pieces` (one per layer, or per layer and expert), so a DCP writer stores
        them one chunk at a time.
        """
        where = "HF -> Megatron"
        out: dict[str, LazyTensor] = {}
        shapes = hfl.expected_tensors(spec)

        def get(name: str) -> LazyTensor:
            return _check(_need(hf, name, where), shapes[name], name)

        glob = At(spec, -1, lambda s: s, vocab_rows=self.padded_vocab_size(spec.vocab_size))
        for entry in n.global_entries(spec):
            out[entry.key] = entry.build(get, entry.key, glob)
        table = self._check_model(spec, writing=True)

        def getter(i: int):
            return lambda suffix: get(_hf(i, suffix))

        L = spec.num_layers
        entries = [self.layer_entries(spec, i) for i in range(L)]
        ats = [At(spec, i, lambda s, i=i: _hf(i, s)) for i in range(L)]
        if table.per_layer:
            for i in range(L):
                for entry in entries[i]:
                    name = f"decoder.layers.{i}.{self.layer_key(spec, i, entry.key)}"
                    out[name] = entry.build(getter(i), name, ats[i])
            return out
        odd = next((i for i in range(L) if [e.key for e in entries[i]] != [e.key for e in entries[0]]), None)
        if odd is not None:
            raise UnsupportedModelError(
                f"{spec.family}: layer {odd} has other tensors than layer 0, and Megatron stacks every layer's "
                "tensors on one [L] axis; this family needs a per-layer Megatron table"
            )
        for k, entry in enumerate(entries[0]):  # every layer has the same entries
            name = f"decoder.layers.{self.layer_key(spec, 0, entry.key)}"
            parts = [entries[i][k].parts(getter(i), ats[i]) for i in range(L)]
            if parts[0] is not None:  # [L, X, ...]: one (layer, expert) piece at a time
                out[name] = lazy_grid(name, parts, outer_axis=0, inner_axis=1)
            else:
                out[name] = LazyTensor.stacked(name, [entries[i][k].build(getter(i), f"{name}[{i}]", ats[i])
                                                      for i in range(L)])
        return out

    def extra_state(self, spec: ModelSpec) -> dict[str, Any]:
        """The `_extra_state` bytes items Megatron's loader expects (each `[None]`), as objects to `torch.save`.

        Which modules have one depends on the layer spec (:func:`te_spec.extra_state`); write them with
        `DcpWriter.write_object(name, obj)`.
        """
        entries = (lambda i: self.layer_entries(spec, i)) if self.per_layer(spec) else None
        return te_spec.extra_state(spec, te=self.spec == "te", layer_entries=entries)

    # ------------------------------------------------------------- to HF

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express Megatron tensors (stacked or per-layer keys, either spec's names) as HF tensors.

        Each HF tensor reads one layer of the source: for a DCP source that is
        one stored chunk. Vocabulary padding is dropped (`spec.vocab_size` rows).
        """
        where = "Megatron -> HF"
        if not spec.tie_word_embeddings and n.OUTPUT not in tensors:
            raise ShapeMismatchError(
                f"{where}: {n.OUTPUT!r} is missing but the model spec says the output is untied; "
                "pass tie_word_embeddings=True (Megatron: no --untie-embeddings-and-output-weights)"
            )
        shapes = hfl.expected_tensors(spec)
        glob = At(spec, -1, lambda s: s)
        out: dict[str, LazyTensor] = {}
        for entry in n.global_entries(spec):
            t = _need(tensors, entry.key, where)
            out.update(entry.split(t if isinstance(entry, Padded) else _check(t, shapes[entry.hf], entry.hf), glob))
        out = hfl.in_hf_order(out, shapes)
        self._check_model(spec, writing=False)
        memos: dict[str, Memo] = {}  # q, k and v of a layer (gate and up) come from one read of the fused tensor
        for i in range(spec.num_layers):
            at = At(spec, i, lambda s, i=i: _hf(i, s), memos=memos)
            layer: dict[str, LazyTensor] = {}
            for entry in self.layer_entries(spec, i):
                want = entry.shape(lambda s: shapes[_hf(i, s)], spec)
                t = self._source(tensors, spec, i, entry.key, want)
                if t is None and isinstance(entry, GatedPair):  # singleton_local_shards: fc1 as weight_w / weight_v
                    halves = [Same(entry.key + part, hf) for part, hf in zip(("_w", "_v"), entry.hf)]
                    half = (want[0] // 2, *want[1:])
                    for h in halves:
                        layer.update(h.split(self._required(tensors, spec, i, h.key, half), at))
                    continue
                if t is None:
                    raise ShapeMismatchError(f"{where}: layer {i} has no tensor named decoder.layers[.{i}].{entry.key}")
                layer.update(entry.split(t, at))
            out.update({_hf(i, s): t for s, t in hfl.in_layer_order(layer, spec, i).items()})
        return out

    def _source(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec, i: int, key: str,
                shape: tuple[int, ...]) -> LazyTensor | None:
        """Layer i's tensor `key` (or the name either spec gives it), per layer or from a stacked [L, ...]."""
        L = spec.num_layers
        for suffix in (key, *te_spec.READ_ALIASES.get(key, ())):
            single = tensors.get(f"decoder.layers.{i}.{suffix}")
            if single is not None:
                return _check(single, shape, suffix)
            stacked = tensors.get(f"decoder.layers.{suffix}")
            if stacked is not None:
                if stacked.shape[0] != L:
                    raise ShapeMismatchError(
                        f"{stacked.name}: {stacked.shape[0]} stacked layers, the model spec says {L}")
                return _check(lazy_layer(stacked, i, f"{stacked.name}[{i}]"), shape, suffix)
        return None

    def _required(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec, i: int, key: str,
                  shape: tuple[int, ...]) -> LazyTensor:
        t = self._source(tensors, spec, i, key, shape)
        if t is None:
            raise ShapeMismatchError(f"Megatron -> HF: layer {i} has no tensor named decoder.layers[.{i}].{key}")
        return t
