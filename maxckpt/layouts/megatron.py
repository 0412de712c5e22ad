"""Megatron-Core GPT `torch_dist` layout <-> HF, plus the run-directory sidecars.

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

>>> layout = MegatronLayout(spec="local")                        # doctest: +SKIP
>>> mega = layout.from_hf(hf_tensors, model_spec)                # doctest: +SKIP
>>> sorted(layout.extra_state(model_spec))[:1]                   # doctest: +SKIP
['decoder.layers.mlp.linear_fc1._extra_state/shard_0_2']
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.hf import layer_name as _hf
from maxckpt.layouts.torch_transforms import fuse_gate_up, fuse_qkv, pad_rows, padded_size, split_gate_up, split_qkv
from maxckpt.layouts.transforms import lazy_grid, lazy_layer, lazy_rename, lazy_rows, shared_result
from maxckpt.tensors import LazyTensor, TensorInfo
from maxckpt.containers.megatron_files import (  # noqa: F401 - run-dir I/O moved there; names kept for importers
    COMMON_FILE,
    OpaqueObject,
    find_megatron_checkpoint,
    iteration_dir_name,
    read_megatron_common,
)
from maxckpt.storage.run_dirs import MEGATRON_TRACKER

if TYPE_CHECKING:
    from maxckpt.containers.dcp import DcpWriter

__all__ = [
    "MegatronLayout",
    "OpaqueObject",
    "TRACKER_FILE",
    "check_supported_args",
    "check_supported_keys",
    "find_megatron_checkpoint",
    "iteration_dir_name",
    "megatron_args",
    "megatron_cli_flags",
    "open_megatron_writer",
    "read_megatron_common",
    "spec_fields_from_megatron_args",
    "write_megatron_sidecars",
]

TRACKER_FILE = MEGATRON_TRACKER  # the one definition lives with the run-dir knowledge
METADATA_JSON = "metadata.json"
# What `dist_checkpointing.save` writes next to a torch_dist checkpoint (core 0.16).
METADATA_JSON_CONTENT = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
# Megatron-LM's `generate_state_dict` stamps this; loaders below 3.0 compare
# `model_parallel_size` and try to reorder legacy QKV.
CHECKPOINT_VERSION = 3.0

# Stacked key suffixes (after "decoder.layers.") and their alternatives.
_QKV = "self_attention.linear_qkv.weight"
_PROJ = "self_attention.linear_proj.weight"
_FC1 = "mlp.linear_fc1.weight"
_FC2 = "mlp.linear_fc2.weight"
_IN_NORM_TE = "self_attention.linear_qkv.layer_norm_weight"
_IN_NORM_LOCAL = "input_layernorm.weight"
_MLP_NORM_TE = "mlp.linear_fc1.layer_norm_weight"
_MLP_NORM_LOCAL = "pre_mlp_layernorm.weight"
_Q_NORM = "self_attention.q_layernorm.weight"
_K_NORM = "self_attention.k_layernorm.weight"
# MoE layers (SequentialMLP, `--moe-grouped-gemm` off): router [L, X, E], experts [L, X, ...].
_ROUTER = "mlp.router.weight"
_EXP_FC1 = "mlp.experts.experts.linear_fc1.weight"
_EXP_FC2 = "mlp.experts.experts.linear_fc2.weight"
_EXP_EXTRA = ("mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2")
_EMBED = "embedding.word_embeddings.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"
_OUTPUT = "output_layer.weight"

# Modules whose `_extra_state` Megatron saves per layer: the four linears for
# both specs; TE's DotProductAttention too with the TE spec.
_EXTRA_LOCAL = (
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)
_EXTRA_TE = _EXTRA_LOCAL + ("self_attention.core_attention",)


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
        `core_attention`); tensor names are the same for both in core 0.16.
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
        return _EMBED in infos or any(k.startswith("decoder.layers.") for k in infos)

    def infer_dims(self, infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """What the shapes tell: layers, widths, tie, q/k norms, and H*D / G*D of the fused QKV.

        Head counts come from `common.pt` (or flags) unless q/k layernorms give
        head_dim; the true vocabulary size is not here (only the padded one).
        """
        check_supported_keys(infos)
        if _EMBED not in infos:
            raise CorruptCheckpointError(
                f"no {_EMBED!r} among {len(infos)} tensors: not a Megatron-Core GPT checkpoint"
            )
        emb = infos[_EMBED].shape[1]

        def find(suffix: str) -> tuple[TensorInfo | None, bool]:
            stacked = infos.get(f"decoder.layers.{suffix}")
            return (stacked, True) if stacked is not None else (infos.get(f"decoder.layers.0.{suffix}"), False)

        qkv, stacked = find(_QKV)
        if qkv is None:
            raise CorruptCheckpointError(f"no decoder.layers[.0].{_QKV} tensor: not a Megatron-Core GPT checkpoint")
        if stacked:
            num_layers = qkv.shape[0]
        else:
            layers = {int(m.group(1)) for n in infos if (m := re.match(r"decoder\.layers\.(\d+)\.", n))}
            num_layers = max(layers) + 1
        proj, _ = find(_PROJ)
        fc2, _ = find(_FC2)
        q_norm, _ = find(_Q_NORM)
        dims: dict[str, Any] = {
            "num_layers": num_layers,
            "emb_dim": emb,
            "tie_word_embeddings": _OUTPUT not in infos,
            "qk_norm": q_norm is not None,
        }
        if fc2 is not None:
            dims["mlp_dim"] = fc2.shape[-1]
        router, exp_fc2 = infos.get(f"decoder.layers.{_ROUTER}"), infos.get(f"decoder.layers.{_EXP_FC2}")
        if router is not None and exp_fc2 is not None:  # MoE: experts from the router, width from fc2
            dims.update(num_experts=router.shape[-2], moe_mlp_dim=exp_fc2.shape[-1], mlp_dim=exp_fc2.shape[-1],
                        _family="qwen3-moe" if q_norm is not None else "mixtral")
        if proj is not None:
            q_features = proj.shape[-1]
            dims["_q_features"] = q_features
            dims["_kv_features"] = (qkv.shape[-2] - q_features) // 2
        if q_norm is not None:
            dims["head_dim"] = q_norm.shape[-1]
        return dims

    @staticmethod
    def _qkv_rows(spec: ModelSpec) -> int:
        return (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim

    # ------------------------------------------------------------- from HF

    def from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express HF tensors as Megatron's stacked `torch_dist` tensors.

        Stacked tensors carry `pieces` (one per layer), so a DCP writer stores
        them one layer chunk at a time.
        """
        L, E, F, D = spec.num_layers, spec.emb_dim, spec.mlp_dim, spec.head_dim
        H, G = spec.num_heads, spec.num_kv_heads
        where = "HF -> Megatron"
        out: dict[str, LazyTensor] = {}

        vp = self.padded_vocab_size(spec.vocab_size)
        embed = _check(_need(hf, "model.embed_tokens.weight", where), (spec.vocab_size, E), "the embedding")
        out[_EMBED] = _padded(embed, vp, _EMBED)
        if not spec.tie_word_embeddings:
            head = _check(_need(hf, "lm_head.weight", where), (spec.vocab_size, E), "lm_head")
            out[_OUTPUT] = _padded(head, vp, _OUTPUT)
        out[_FINAL_NORM] = lazy_rename(_check(_need(hf, "model.norm.weight", where), (E,), "the final norm"), _FINAL_NORM)

        def layers(suffix: str, per_layer) -> None:
            name = f"decoder.layers.{suffix}"
            out[name] = LazyTensor.stacked(name, [per_layer(i) for i in range(L)])

        def get(i: int, what: str, shape: tuple[int, ...]) -> LazyTensor:
            return _check(_need(hf, _hf(i, what), where), shape, what)

        def qkv(i: int) -> LazyTensor:
            q = get(i, "self_attn.q_proj.weight", (H * D, E))
            k = get(i, "self_attn.k_proj.weight", (G * D, E))
            v = get(i, "self_attn.v_proj.weight", (G * D, E))
            return LazyTensor.computed(
                f"qkv{i}", (self._qkv_rows(spec), E), q.dtype, lambda: fuse_qkv(q.read(), k.read(), v.read(), H, G, D)
            )

        def fc1(i: int) -> LazyTensor:
            gate = get(i, "mlp.gate_proj.weight", (F, E))
            up = get(i, "mlp.up_proj.weight", (F, E))
            return LazyTensor.computed(f"fc1_{i}", (2 * F, E), gate.dtype, lambda: fuse_gate_up(gate.read(), up.read()))

        layers(_QKV, qkv)
        layers(_PROJ, lambda i: get(i, "self_attn.o_proj.weight", (E, H * D)))
        if spec.num_experts:
            self._check_moe(spec)
            out.update(self._experts_from_hf(hf, spec, get))
        else:
            layers(_FC1, fc1)
            layers(_FC2, lambda i: get(i, "mlp.down_proj.weight", (E, F)))
        in_norm, mlp_norm = (_IN_NORM_TE, _MLP_NORM_TE) if self.norm_keys == "te" else (_IN_NORM_LOCAL, _MLP_NORM_LOCAL)
        layers(in_norm, lambda i: get(i, "input_layernorm.weight", (E,)))
        layers(mlp_norm, lambda i: get(i, "post_attention_layernorm.weight", (E,)))
        if spec.qk_norm:
            layers(_Q_NORM, lambda i: get(i, "self_attn.q_norm.weight", (D,)))
            layers(_K_NORM, lambda i: get(i, "self_attn.k_norm.weight", (D,)))
        return out

    def _check_moe(self, spec: ModelSpec, writing: bool = True) -> None:
        """Megatron MoE as maxckpt writes it: every layer MoE, SequentialMLP experts, no shared experts."""
        if writing and self.spec != "local":
            raise UnsupportedModelError(
                f"{spec.family}: maxckpt writes and reads Megatron MoE checkpoints of the local layer spec "
                "(SequentialMLP experts); pass --megatron-spec local and run Megatron-LM with --transformer-impl local"
            )
        if spec.first_dense_layers or spec.num_shared_experts or spec.q_lora_rank or spec.expert_bias or spec.router_bias:
            raise UnsupportedModelError(
                f"{spec.family}: maxckpt's Megatron mapping covers MoE models whose every layer routes to plain "
                "experts (mixtral, qwen3-moe); dense leading layers, shared experts, MLA and biases are not written yet"
            )

    @staticmethod
    def _hf_expert_names(spec: ModelSpec) -> tuple[str, str, str, str]:
        """HF router and per-expert gate/up/down suffixes (`{e}` for the expert) of this family."""
        if spec.family == "mixtral":
            return ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                    "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight")
        return ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                "mlp.experts.{e}.down_proj.weight")

    def _experts_from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec, get) -> dict[str, LazyTensor]:
        """Router [L, X, E] and experts [L, X, 2M, E] / [L, X, E, M], one (layer, expert) piece at a time."""
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        router, gate, up, down = self._hf_expert_names(spec)
        out: dict[str, LazyTensor] = {}
        name = f"decoder.layers.{_ROUTER}"
        out[name] = LazyTensor.stacked(name, [get(i, router, (X, E)) for i in range(L)])

        def fc1(i: int, e: int) -> LazyTensor:
            g, u = get(i, gate.format(e=e), (M, E)), get(i, up.format(e=e), (M, E))
            return LazyTensor.computed(f"fc1_{i}_{e}", (2 * M, E), g.dtype, lambda: fuse_gate_up(g.read(), u.read()))

        name = f"decoder.layers.{_EXP_FC1}"
        out[name] = lazy_grid(name, [[fc1(i, e) for e in range(X)] for i in range(L)], outer_axis=0, inner_axis=1)
        name = f"decoder.layers.{_EXP_FC2}"
        out[name] = lazy_grid(name, [[get(i, down.format(e=e), (E, M)) for e in range(X)] for i in range(L)], outer_axis=0, inner_axis=1)
        return out

    def extra_state(self, spec: ModelSpec) -> dict[str, Any]:
        """The `_extra_state` bytes items Megatron's loader expects, as objects to `torch.save`.

        Each is `[None]` - what core 0.16 itself saves for a model without FP8
        state (local linears return None; TE modules accept None on load).
        Write them with `DcpWriter.write_object(name, obj)`.
        """
        L = spec.num_layers
        modules = _EXTRA_TE if self.spec == "te" else _EXTRA_LOCAL
        if spec.num_experts:  # the experts' linears have one item per (layer, expert); no dense MLP
            modules = tuple(m for m in modules if not m.startswith("mlp."))
            X = spec.num_experts
            experts = {f"decoder.layers.{m}._extra_state/shard_{i}.{e}_{L}.{X}": [None] for m in _EXP_EXTRA for i in range(L) for e in range(X)}
        else:
            experts = {}
        return {**{f"decoder.layers.{m}._extra_state/shard_{i}_{L}": [None] for m in modules for i in range(L)}, **experts}

    # ------------------------------------------------------------- to HF

    def to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Lazily express Megatron tensors (stacked or per-layer keys) as HF tensors.

        Each HF tensor reads one layer of the source: for a DCP source that is
        one stored chunk. Vocabulary padding is dropped (`spec.vocab_size` rows).
        """
        L, E, F, D = spec.num_layers, spec.emb_dim, spec.mlp_dim, spec.head_dim
        H, G = spec.num_heads, spec.num_kv_heads
        where = "Megatron -> HF"
        out: dict[str, LazyTensor] = {}

        embed = _need(tensors, _EMBED, where)
        out["model.embed_tokens.weight"] = _unpadded(embed, spec.vocab_size, E, "model.embed_tokens.weight")
        out["model.norm.weight"] = lazy_rename(_check(_need(tensors, _FINAL_NORM, where), (E,), "the final norm"), "model.norm.weight")
        if not spec.tie_word_embeddings:
            if _OUTPUT not in tensors:
                raise ShapeMismatchError(
                    f"{where}: {_OUTPUT!r} is missing but the model spec says the output is untied; "
                    "pass tie_word_embeddings=True (Megatron: no --untie-embeddings-and-output-weights)"
                )
            out["lm_head.weight"] = _unpadded(tensors[_OUTPUT], spec.vocab_size, E, "lm_head.weight")

        def layer(suffixes: tuple[str, ...], i: int, shape: tuple[int, ...]) -> LazyTensor | None:
            for suffix in suffixes:
                stacked = tensors.get(f"decoder.layers.{suffix}")
                if stacked is not None:
                    if stacked.shape[0] != L:
                        raise ShapeMismatchError(
                            f"{stacked.name}: {stacked.shape[0]} stacked layers, the model spec says {L}"
                        )
                    return _check(lazy_layer(stacked, i, f"{stacked.name}[{i}]"), shape, suffix)
                single = tensors.get(f"decoder.layers.{i}.{suffix}")
                if single is not None:
                    return _check(single, shape, suffix)
            return None

        def required(suffixes: tuple[str, ...], i: int, shape: tuple[int, ...]) -> LazyTensor:
            t = layer(suffixes, i, shape)
            if t is None:
                raise ShapeMismatchError(f"{where}: layer {i} has no tensor named decoder.layers[.{i}].{suffixes[0]}")
            return t

        # q, k and v of a layer (gate and up) come from one read of the fused tensor when
        # asked for in a row, as HF order does; the caches hold one layer each.
        @shared_result(keep=2)
        def qkv_of(i: int) -> tuple:
            return split_qkv(required((_QKV,), i, (self._qkv_rows(spec), E)).read(), H, G, D)

        @shared_result(keep=2)
        def fc1_of(i: int) -> tuple:
            return split_gate_up(required((_FC1,), i, (2 * F, E)).read())

        for i in range(L):
            qkv = required((_QKV,), i, (self._qkv_rows(spec), E))

            def part(j: int, i: int = i) -> Any:
                return lambda: qkv_of(i)[j]

            out[_hf(i, "self_attn.q_proj.weight")] = LazyTensor.computed(_hf(i, "self_attn.q_proj.weight"), (H * D, E), qkv.dtype, part(0))
            out[_hf(i, "self_attn.k_proj.weight")] = LazyTensor.computed(_hf(i, "self_attn.k_proj.weight"), (G * D, E), qkv.dtype, part(1))
            out[_hf(i, "self_attn.v_proj.weight")] = LazyTensor.computed(_hf(i, "self_attn.v_proj.weight"), (G * D, E), qkv.dtype, part(2))
            out[_hf(i, "self_attn.o_proj.weight")] = lazy_rename(required((_PROJ,), i, (E, H * D)), _hf(i, "self_attn.o_proj.weight"))

            if spec.num_experts:
                out.update(self._experts_to_hf(tensors, spec, i))
            else:
                out.update(self._dense_mlp_to_hf(i, spec, layer, required, fc1_of))
            out[_hf(i, "input_layernorm.weight")] = lazy_rename(
                required((_IN_NORM_TE, _IN_NORM_LOCAL), i, (E,)), _hf(i, "input_layernorm.weight")
            )
            out[_hf(i, "post_attention_layernorm.weight")] = lazy_rename(
                required((_MLP_NORM_TE, _MLP_NORM_LOCAL), i, (E,)), _hf(i, "post_attention_layernorm.weight")
            )
            if spec.qk_norm:
                out[_hf(i, "self_attn.q_norm.weight")] = lazy_rename(required((_Q_NORM,), i, (D,)), _hf(i, "self_attn.q_norm.weight"))
                out[_hf(i, "self_attn.k_norm.weight")] = lazy_rename(required((_K_NORM,), i, (D,)), _hf(i, "self_attn.k_norm.weight"))
        return out


    @staticmethod
    def _dense_mlp_to_hf(i: int, spec: ModelSpec, layer, required, fc1_of) -> dict[str, LazyTensor]:
        """Layer i's gate/up (from the fused fc1, or its _w/_v halves) and down projections."""
        E, F = spec.emb_dim, spec.mlp_dim
        gate, up, down = _hf(i, "mlp.gate_proj.weight"), _hf(i, "mlp.up_proj.weight"), _hf(i, "mlp.down_proj.weight")
        fc1 = layer((_FC1,), i, (2 * F, E))
        if fc1 is not None:
            out = {
                gate: LazyTensor.computed(gate, (F, E), fc1.dtype, lambda: fc1_of(i)[0]),
                up: LazyTensor.computed(up, (F, E), fc1.dtype, lambda: fc1_of(i)[1]),
            }
        else:  # singleton_local_shards checkpoints split fc1 into weight_w (gate) / weight_v (up)
            out = {gate: lazy_rename(required((_FC1 + "_w",), i, (F, E)), gate),
                   up: lazy_rename(required((_FC1 + "_v",), i, (F, E)), up)}
        out[down] = lazy_rename(required((_FC2,), i, (E, F)), down)
        return out

    def _experts_to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec, i: int) -> dict[str, LazyTensor]:
        """Layer i's router and experts as HF tensors; each expert reads its own (layer, expert) slice."""
        self._check_moe(spec, writing=False)
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        router, gate, up, down = self._hf_expert_names(spec)
        where = "Megatron -> HF"
        r = _check(_need(tensors, f"decoder.layers.{_ROUTER}", where), (L, X, E), "the router")
        fc1 = _check(_need(tensors, f"decoder.layers.{_EXP_FC1}", where), (L, X, 2 * M, E), "the experts' fc1")
        fc2 = _check(_need(tensors, f"decoder.layers.{_EXP_FC2}", where), (L, X, E, M), "the experts' fc2")
        out = {_hf(i, router): lazy_layer(r, i, _hf(i, router))}

        @shared_result(keep=2)
        def fc1_of(e: int) -> tuple:
            return split_gate_up(fc1.read((i, e)))

        for e in range(X):
            for name, j in ((gate.format(e=e), 0), (up.format(e=e), 1)):
                out[_hf(i, name)] = LazyTensor.computed(_hf(i, name), (M, E), fc1.dtype, lambda e=e, j=j: fc1_of(e)[j])
            name = _hf(i, down.format(e=e))
            out[name] = LazyTensor.computed(name, (E, M), fc2.dtype, lambda e=e: fc2.read((i, e)))
        return out


def check_supported_keys(names: Mapping[str, Any]) -> None:
    """Refuse Megatron models outside the dense Llama family, naming what was found."""
    for name in names:
        moe_ok = name.startswith((f"decoder.layers.{_ROUTER}", "decoder.layers.mlp.experts.experts."))
        if (".mlp.experts." in name or ".mlp.router." in name) and not moe_ok:
            raise UnsupportedModelError(
                f"{name!r}: a Mixture-of-Experts Megatron layout maxckpt does not read (grouped-GEMM experts, "
                "shared experts, per-layer keys or a router bias); it reads SequentialMLP experts stacked as "
                "decoder.layers.mlp.experts.experts.* (mixtral, qwen3-moe, written with --moe-grouped-gemm off)"
            )
        if name.startswith(("decoder.", "output_layer.")) and name.endswith(".bias"):
            raise UnsupportedModelError(
                f"{name!r}: linear biases (--add-bias-linear / --add-qkv-bias) have no place in the "
                "Llama-family models maxckpt converts"
            )
        if name.startswith("embedding.position_embeddings."):
            raise UnsupportedModelError(
                f"{name!r}: learned absolute position embeddings (GPT-2 style); maxckpt converts RoPE models only"
            )


# Megatron args that must have these values for a Llama-family model (None: unset is fine).
_REQUIRED_ARGS: dict[str, tuple[Any, ...]] = {
    "normalization": ("RMSNorm",),
    "swiglu": (True,),
    "position_embedding_type": ("rope",),
    "add_bias_linear": (False,),
    "add_qkv_bias": (False,),
    "rotary_interleaved": (False,),
    "apply_layernorm_1p": (False,),
    "moe_grouped_gemm": (None, False),
    "moe_shared_expert_intermediate_size": (None, 0),
}


def check_supported_args(args: argparse.Namespace | Mapping[str, Any], where: str = "common.pt") -> None:
    """Refuse a Megatron run whose saved args describe a model outside the Llama family."""
    a = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    for key, allowed in _REQUIRED_ARGS.items():
        if key in a and a[key] not in allowed:
            raise UnsupportedModelError(
                f"{where}: the run was trained with {key}={a[key]!r}; maxckpt converts Llama-family models "
                f"({key}={allowed[0]!r}) only"
            )
    rotary_percent = a.get("rotary_percent")
    if rotary_percent not in (None, 1.0, 1):
        raise UnsupportedModelError(f"{where}: rotary_percent={rotary_percent}; only full-width RoPE (1.0) is supported")


def _padded(t: LazyTensor, rows: int, name: str) -> LazyTensor:
    if rows == t.shape[0]:
        return lazy_rename(t, name)
    return LazyTensor.computed(name, (rows, *t.shape[1:]), t.dtype, lambda: pad_rows(t.read(), rows))


def _unpadded(t: LazyTensor, vocab: int, emb: int, name: str) -> LazyTensor:
    if len(t.shape) != 2 or t.shape[1] != emb or t.shape[0] < vocab:
        raise ShapeMismatchError(
            f"{t.name}: shape {tuple(t.shape)}, expected [padded vocab >= {vocab}, {emb}]; "
            "check the vocabulary size passed for this model"
        )
    return lazy_rename(t, name) if t.shape[0] == vocab else lazy_rows(t, vocab, name)


# --------------------------------------------------------------------------
# Run-directory sidecars


def megatron_args(spec: ModelSpec, layout: MegatronLayout, *, seq_length: int | None = None) -> argparse.Namespace:
    """The `args` namespace Megatron-LM stores in `common.pt`, with this model's dimensions.

    Megatron-LM reads it to check the run's model flags (`check_checkpoint_args`:
    num_layers, hidden_size, num_attention_heads, add_position_embedding) and
    fills the run's args from it under `--use-checkpoint-args`.
    `no_save_optim`/`no_save_rng` are True because the checkpoint holds neither,
    which tells the loader not to look for RNG state.
    """
    rope = dict(spec.rope_scaling or {})
    rope_type = rope.get("rope_type", rope.get("type"))
    return argparse.Namespace(
        num_layers=spec.num_layers,
        hidden_size=spec.emb_dim,
        ffn_hidden_size=spec.mlp_dim,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        group_query_attention=spec.num_kv_heads != spec.num_heads,
        kv_channels=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        seq_length=seq_length or spec.max_position_embeddings,
        position_embedding_type="rope",
        add_position_embedding=False,
        use_rotary_position_embeddings=True,
        rotary_base=int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        rotary_percent=1.0,
        rotary_interleaved=False,
        use_rope_scaling=rope_type == "llama3",
        rope_scaling_factor=float(rope.get("factor", 8.0)) if rope_type == "llama3" else 8.0,
        add_bias_linear=False,
        add_qkv_bias=False,
        swiglu=True,
        squared_relu=False,
        untie_embeddings_and_output_weights=not spec.tie_word_embeddings,
        normalization="RMSNorm",
        norm_epsilon=spec.rms_norm_eps,
        apply_layernorm_1p=False,
        qk_layernorm=spec.qk_norm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by,
        vocab_size=spec.vocab_size,  # the true size (Megatron's --vocab-size); the padding is dropped on reading
        padded_vocab_size=layout.padded_vocab_size(spec.vocab_size),
        transformer_impl="transformer_engine" if layout.spec == "te" else "local",
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=1,
        num_experts=spec.num_experts or None,
        moe_router_topk=spec.num_experts_per_tok or 2,
        moe_ffn_hidden_size=spec.moe_mlp_dim or None,
        moe_grouped_gemm=False,
        moe_router_pre_softmax=False,
        ckpt_format="torch_dist",
        use_dist_ckpt=True,
        no_save_optim=True,
        no_save_rng=True,
        consumed_train_samples=0,
        skipped_train_samples=0,
        consumed_valid_samples=0,
    )


def megatron_cli_flags(spec: ModelSpec, layout: MegatronLayout) -> list[str]:
    """The Megatron-LM command-line flags that build the model this checkpoint holds.

    Megatron-LM takes the architecture from its command line (or from
    `common.pt` under `--use-checkpoint-args`, which does not cover rope
    scaling or q/k layernorm), so the hand-off prints these.

    >>> from maxckpt.layouts.base import ModelSpec
    >>> " ".join(megatron_cli_flags(ModelSpec("llama2", 2, 64, 4, 2, 16, 128, 250), MegatronLayout(spec="local")))[:60]
    '--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-'
    """
    rope = dict(spec.rope_scaling or {})
    flags = [
        f"--num-layers {spec.num_layers}",
        f"--hidden-size {spec.emb_dim}",
        f"--ffn-hidden-size {spec.mlp_dim}",
        f"--num-attention-heads {spec.num_heads}",
    ]
    if spec.num_kv_heads != spec.num_heads:
        flags += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
    theta = int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta
    flags += [
        f"--kv-channels {spec.head_dim}",
        f"--max-position-embeddings {spec.max_position_embeddings}",
        "--position-embedding-type rope",
        f"--rotary-base {theta}",
        "--normalization RMSNorm",
        f"--norm-epsilon {spec.rms_norm_eps:g}",
        "--swiglu",
        "--disable-bias-linear",
    ]
    if rope.get("rope_type", rope.get("type")) == "llama3":
        flags += ["--use-rope-scaling", f"--rope-scaling-factor {float(rope.get('factor', 8.0)):g}"]
    if spec.qk_norm:
        flags.append("--qk-layernorm")
    if spec.num_experts:
        flags += [f"--num-experts {spec.num_experts}", f"--moe-router-topk {spec.num_experts_per_tok}",
                  f"--moe-ffn-hidden-size {spec.moe_mlp_dim}", "--moe-router-score-function softmax"]
    if not spec.tie_word_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    flags += [
        f"--make-vocab-size-divisible-by {layout.make_vocab_size_divisible_by}",
        f"--transformer-impl {'transformer_engine' if layout.spec == 'te' else 'local'}",
        "--ckpt-format torch_dist",
    ]
    return flags


def write_megatron_sidecars(
    root: str | os.PathLike,
    spec: ModelSpec,
    layout: MegatronLayout,
    iteration: int | None = None,
    *,
    common: bool = True,
) -> Path:
    """Write what Megatron-LM expects around the DCP files; returns the iteration dir.

    `<root>/latest_checkpointed_iteration.txt` (the iteration, or `release`),
    `<iter dir>/metadata.json` (the torch_dist backend marker that
    `dist_checkpointing.check_is_distributed_checkpoint` looks for), and, for
    core releases that keep the common state in a file (0.16 does),
    `<iter dir>/common.pt`: `args`, `checkpoint_version` 3.0, `iteration`,
    `num_floating_point_operations_so_far`, `content_metadata`. Call it after
    the DCP files are in place: the tracker file is written last.

    `iteration=None` writes a `release/` checkpoint, which Megatron-LM loads
    with iteration 0 and without looking for optimizer or RNG state.
    """
    import torch

    root = Path(root)
    it_dir = root / iteration_dir_name(iteration)
    it_dir.mkdir(parents=True, exist_ok=True)
    (it_dir / METADATA_JSON).write_text(json.dumps(METADATA_JSON_CONTENT))
    if common:
        state = {
            "args": megatron_args(spec, layout),
            "checkpoint_version": CHECKPOINT_VERSION,
            "iteration": 0 if iteration is None else int(iteration),
            "num_floating_point_operations_so_far": 0,
            # Stacked (not per-layer) sharded keys; read by Megatron-LM's loader.
            "content_metadata": {"singleton_local_shards": False},
        }
        torch.save(state, it_dir / COMMON_FILE)
    tmp = root / (TRACKER_FILE + ".tmp")
    tmp.write_text("release" if iteration is None else str(int(iteration)))
    os.replace(tmp, root / TRACKER_FILE)
    return it_dir


def spec_fields_from_megatron_args(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields Megatron's saved args tell (dims, heads, tie, rope, eps, qk norm), plus `family`.

    The true vocabulary size is there only when the run set `--vocab-size`
    (maxckpt's own output does); otherwise take it from an HF config or a flag.
    The family is stated when the args pin it: q/k layernorm means qwen3,
    llama3 rope scaling means llama3.1.
    """
    a = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    out: dict[str, Any] = {}

    def put(field: str, key: str, fn=lambda v: v) -> None:
        if a.get(key) is not None:
            out[field] = fn(a[key])

    put("num_layers", "num_layers", int)
    put("vocab_size", "vocab_size", int)
    put("emb_dim", "hidden_size", int)
    put("mlp_dim", "ffn_hidden_size", int)
    put("num_heads", "num_attention_heads", int)
    if a.get("group_query_attention") and a.get("num_query_groups"):
        out["num_kv_heads"] = int(a["num_query_groups"])
    elif "num_heads" in out:
        out["num_kv_heads"] = out["num_heads"]
    if a.get("kv_channels"):
        out["head_dim"] = int(a["kv_channels"])
    elif "emb_dim" in out and "num_heads" in out:
        out["head_dim"] = out["emb_dim"] // out["num_heads"]
    if "untie_embeddings_and_output_weights" in a:
        out["tie_word_embeddings"] = not a["untie_embeddings_and_output_weights"]
    put("rope_theta", "rotary_base", float)
    put("rms_norm_eps", "norm_epsilon", float)
    put("max_position_embeddings", "max_position_embeddings", int)
    if "qk_layernorm" in a:
        out["qk_norm"] = bool(a["qk_layernorm"])
    if a.get("use_rope_scaling"):
        from maxckpt.layouts.families import LLAMA3_ROPE_SCALING

        out["rope_scaling"] = {**LLAMA3_ROPE_SCALING, "factor": float(a.get("rope_scaling_factor") or 8.0)}
        out["family"] = "llama3.1"
    if out.get("qk_norm"):
        out["family"] = "qwen3"
    if a.get("num_experts"):
        out["num_experts"] = int(a["num_experts"])
        put("num_experts_per_tok", "moe_router_topk", int)
        put("moe_mlp_dim", "moe_ffn_hidden_size", int)
        if "moe_mlp_dim" in out:
            out["mlp_dim"] = out["moe_mlp_dim"]
        out["family"] = "qwen3-moe" if out.get("qk_norm") else "mixtral"
    return out



def open_megatron_writer(
    root: str | os.PathLike, spec: ModelSpec, layout: MegatronLayout, iteration: int | None = None
) -> "DcpWriter":
    """A DcpWriter for `<root>/iter_NNNNNNN` (or `release`) with the `_extra_state` items already in.

    Stream the tensors of `layout.from_hf(...)` into it, close it, then call
    :func:`write_megatron_sidecars` with the same arguments.
    """
    from maxckpt.containers.dcp import DcpWriter

    writer = DcpWriter(Path(root) / iteration_dir_name(iteration))
    for name, obj in layout.extra_state(spec).items():
        writer.write_object(name, obj)
    return writer
