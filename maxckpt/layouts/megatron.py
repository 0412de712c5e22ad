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

MoE and beyond (SequentialMLP-compatible expert keys, which GroupedMLP and TEGroupedMLP
(`--moe-grouped-gemm`) also read; each checked by loading into Megatron-Core 0.16.1's GPTModel on CPU
against transformers' logits, the TE spec's names through a TE-to-local key map):
mixtral/qwen3-moe add `mlp.router.weight [L, X, E]` and
`mlp.experts.experts.linear_fc1.weight [L, X, 2M, E]`; gpt-oss adds the q/k/v/o,
router and expert biases and `core_attention.softmax_offset` (the sinks);
DeepSeek-V3 is keyed per layer (`moe_layer_freq` is a list for its dense leading
layers) with MLA's `linear_q_down_proj`/`linear_q_up_proj`/`linear_kv_down_proj`/
`linear_kv_up_proj`, `mlp.router.expert_bias` (the routing bias) and
`mlp.shared_experts.*`.

The layer spec changes a few norm names for these (megatron-core 0.16.1's
`get_gpt_layer_with_transformer_engine_spec` vs `get_gpt_layer_local_spec`):
a MoE layer of the TE spec keeps its pre-MLP norm as a module (a TENorm),
`decoder.layers.pre_mlp_layernorm.weight`, where the local spec's key map
writes `mlp.linear_fc1.layer_norm_weight`; an MLA layer of the TE spec fuses
the q and kv norms into `self_attention.linear_q_up_proj.layer_norm_weight` /
`linear_kv_up_proj.layer_norm_weight` (local: `q_layernorm` / `kv_layernorm`)
and, in a dense layer, the pre-MLP norm into `mlp.linear_fc1.layer_norm_weight`.
The TE spec's norms are TENorms, TE 2's fusible ops, which save an
`_extra_state` too. Reading takes either spec's names.

>>> layout = MegatronLayout(spec="local")                        # doctest: +SKIP
>>> mega = layout.from_hf(hf_tensors, model_spec)                # doctest: +SKIP
>>> sorted(layout.extra_state(model_spec))[:1]                   # doctest: +SKIP
['decoder.layers.mlp.linear_fc1._extra_state/shard_0_2']
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.layouts.base import ModelSpec
from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts.families import FAMILIES
from maxckpt.formats.hf.layout import layer_name as _hf
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
# MoE layers (SequentialMLP's torch_dist keys, which (TE)GroupedMLP shares): router [L, X, E], experts [L, X, ...].
_ROUTER = "mlp.router.weight"
_EXP_FC1 = "mlp.experts.experts.linear_fc1.weight"
_EXP_FC2 = "mlp.experts.experts.linear_fc2.weight"
_EXP_EXTRA = ("mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2")
# gpt-oss (`--add-qkv-bias`, bias linears, `--softmax-type learnable`): stacked like the rest.
_QKV_BIAS = "self_attention.linear_qkv.bias"
_PROJ_BIAS = "self_attention.linear_proj.bias"
_SINKS = "self_attention.core_attention.softmax_offset"  # HF self_attn.sinks: the learned extra logit per head
_ROUTER_BIAS = "mlp.router.bias"
_EXP_FC1_BIAS = "mlp.experts.experts.linear_fc1.bias"
_EXP_FC2_BIAS = "mlp.experts.experts.linear_fc2.bias"
_EMBED = "embedding.word_embeddings.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"
_OUTPUT = "output_layer.weight"

# DeepSeek-V3 layers (MLA, dense leading layers, shared experts, routing bias) as Megatron-Core 0.16.1
# keys them with the local spec: per layer (`decoder.layers.{i}.` + suffix), checked against a real
# GPTModel built by `get_gpt_decoder_block_spec(MLATransformerConfig(...), use_transformer_engine=False)`
# and saved by `dist_checkpointing.save`. Megatron suffix -> HF suffix; MLA's projections keep HF's shapes
# and row order (q_b rows per head [nope | rope], kv_a rows [kv_lora | rope], kv_b rows per head [k_nope | v]).
_MLA_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
# The Transformer-Engine spec fuses these norms of an MLA layer into the following linear (a
# TELayerNormColumnParallelLinear); writing with spec "te" uses these names, reading accepts both.
_TE_FUSED_NORMS = {
    "self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
    "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight",
    "pre_mlp_layernorm.weight": _MLP_NORM_TE,  # dense layers only (MoE layers keep a separate norm)
}
_EXPERT_BIAS = "mlp.router.expert_bias"
_SHARED_FC1 = "mlp.shared_experts.linear_fc1.weight"
_SHARED_FC2 = "mlp.shared_experts.linear_fc2.weight"
# What Megatron-Core 0.16's MLATransformerConfig assumes and Megatron-LM's flags do not set: the YaRN
# settings a spec must have for the hand-off flags to rebuild the same model.
_MEGATRON_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}

# One per-layer mapping entry: (Megatron suffix, how, HF suffixes). How: "same" (one tensor, same
# shape), "gate_up" ([gate; up] rows), "experts_gate_up" ([X, 2M, E] of per-expert gate/up, `{e}` in the
# HF names), "experts" ([X, ...] of one per-expert tensor).
_Entry = tuple[str, str, tuple[str, ...]]

# Modules whose `_extra_state` Megatron saves per layer: the four linears for
# both specs; TE's DotProductAttention too with the TE spec (core 0.16.1 asks for it only with
# `--softmax-type learnable`, earlier releases always: an item no model asks for is ignored on load).
_EXTRA_LOCAL = (
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)
_EXTRA_TE = _EXTRA_LOCAL + ("self_attention.core_attention",)
# TE 2's norms (TENorm = te.pytorch.RMSNorm, a fusible op) save an `_extra_state` as well.
_FINAL_NORM_EXTRA = "decoder.final_layernorm._extra_state/shard_0_1"


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
        layers (see the module docstring).
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

        if any(n.endswith("self_attention.linear_q_down_proj.weight") for n in infos):
            return self._mla_dims(infos)
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
        sinks, _ = find(_SINKS)
        if sinks is not None:  # gpt-oss: one sink per query head tells the head count
            dims.update(_family="gpt-oss", attention_sinks=True, num_heads=sinks.shape[-1],
                        attention_bias=find(_QKV_BIAS)[0] is not None, router_bias=find(_ROUTER_BIAS)[0] is not None,
                        expert_bias=find(_EXP_FC2_BIAS)[0] is not None)
        return dims

    @staticmethod
    def _mla_dims(infos: Mapping[str, TensorInfo]) -> dict[str, Any]:
        """DeepSeek-V3 dims from Megatron's per-layer shapes, by way of the HF names they map to.

        The vocabulary size is left out (Megatron's embedding is padded).
        """
        back = {meg: hf for meg, hf in _MLA_LAYER.items()}
        back.update({te: _MLA_LAYER[meg] for meg, te in _TE_FUSED_NORMS.items()})
        back.update({_ROUTER: "mlp.gate.weight", _EXPERT_BIAS: "mlp.gate.e_score_correction_bias",
                     _FC2: "mlp.down_proj.weight", _SHARED_FC2: "mlp.shared_experts.down_proj.weight"})
        hf_infos: dict[str, TensorInfo] = {"model.embed_tokens.weight": infos[_EMBED]}
        if _OUTPUT in infos:
            hf_infos["lm_head.weight"] = infos[_OUTPUT]
        for name, info in infos.items():
            m = re.match(r"decoder\.layers\.(\d+)\.(.+)$", name)
            if not m:
                continue
            i, suffix = int(m.group(1)), m.group(2)
            if suffix in back:
                hf_infos[_hf(i, back[suffix])] = info
            elif suffix in (_FC1, _SHARED_FC1):  # [2F, E]: gate and up halves
                half = TensorInfo("", (info.shape[0] // 2, *info.shape[1:]), info.dtype)
                prefix = "mlp." if suffix == _FC1 else "mlp.shared_experts."
                hf_infos[_hf(i, prefix + "gate_proj.weight")] = hf_infos[_hf(i, prefix + "up_proj.weight")] = half
            elif suffix == _EXP_FC1:  # [X, 2M, E]: one HF gate per expert
                for e in range(info.shape[0]):
                    hf_infos[_hf(i, f"mlp.experts.{e}.gate_proj.weight")] = TensorInfo("", (info.shape[1] // 2, info.shape[2]), info.dtype)
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims.pop("vocab_size", None)
        dims["_family"] = "deepseek3"
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
        if self.per_layer(spec):
            self._check_moe(spec)
            out.update(self._per_layer_from_hf(hf, spec))
            return out

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
        if spec.attention_bias:

            def qkv_bias(i: int) -> LazyTensor:
                q = get(i, "self_attn.q_proj.bias", (H * D,))
                k = get(i, "self_attn.k_proj.bias", (G * D,))
                v = get(i, "self_attn.v_proj.bias", (G * D,))
                return LazyTensor.computed(
                    f"qkv_bias{i}", (self._qkv_rows(spec),), q.dtype,
                    lambda: fuse_qkv(q.read()[:, None], k.read()[:, None], v.read()[:, None], H, G, D)[:, 0],
                )

            layers(_QKV_BIAS, qkv_bias)
            layers(_PROJ_BIAS, lambda i: get(i, "self_attn.o_proj.bias", (E,)))
        if spec.attention_sinks:
            layers(_SINKS, lambda i: get(i, "self_attn.sinks", (H,)))
        if spec.num_experts:
            self._check_moe(spec)
            out.update(self._experts_from_hf(hf, spec, get))
        else:
            layers(_FC1, fc1)
            layers(_FC2, lambda i: get(i, "mlp.down_proj.weight", (E, F)))
        in_norm, mlp_norm = (_IN_NORM_TE, _MLP_NORM_TE) if self.norm_keys == "te" else (_IN_NORM_LOCAL, _MLP_NORM_LOCAL)
        if spec.num_experts and self.spec == "te":
            mlp_norm = _MLP_NORM_LOCAL  # the TE spec's MoE layer keeps its pre-MLP norm as its own TENorm
        layers(in_norm, lambda i: get(i, "input_layernorm.weight", (E,)))
        layers(mlp_norm, lambda i: get(i, "post_attention_layernorm.weight", (E,)))
        if spec.qk_norm:
            layers(_Q_NORM, lambda i: get(i, "self_attn.q_norm.weight", (D,)))
            layers(_K_NORM, lambda i: get(i, "self_attn.k_norm.weight", (D,)))
        return out

    def _check_moe(self, spec: ModelSpec, writing: bool = True) -> None:
        """Megatron MoE as maxckpt writes it (SequentialMLP-compatible expert keys); DeepSeek's extras per layer."""
        extras = spec.first_dense_layers or spec.num_shared_experts or spec.q_lora_rank or spec.routing == "sigmoid_bias"
        if extras and not self.per_layer(spec):
            raise UnsupportedModelError(
                f"{spec.family}: maxckpt's Megatron mapping writes dense leading layers, shared experts, MLA and "
                "routing biases for the DeepSeek-V3 family only"
            )
        oss = self.gpt_oss(spec)
        if (spec.router_bias or spec.expert_bias or spec.attention_bias or spec.attention_sinks) and not oss:
            raise UnsupportedModelError(
                f"{spec.family}: router, expert and attention biases and attention sinks are mapped to Megatron "
                "for gpt-oss only"
            )
        if oss and writing:
            yarn = dict(spec.rope_scaling or {})
            if spec.sliding_window_pattern not in (0, 2) or str(yarn.get("rope_type")) != "yarn":
                raise UnsupportedModelError(
                    f"{spec.family}: maxckpt's Megatron mapping takes gpt-oss's layout (sliding window on every "
                    "other layer, YaRN rope)"
                )
        if writing and spec.q_lora_rank:
            yarn = dict(spec.rope_scaling or {})
            if str(yarn.get("rope_type", yarn.get("type"))) != "yarn":
                raise UnsupportedModelError(
                    f"{spec.family}: Megatron-Core's MLA takes YaRN rope (rope_type 'yarn'); this model has {yarn or 'none'}"
                )
            for key, default in _MEGATRON_YARN_DEFAULTS.items():
                if float(yarn.get(key, default)) != float(default):
                    raise UnsupportedModelError(
                        f"{spec.family}: YaRN {key}={yarn[key]}, but Megatron-LM takes no flag for it and "
                        f"Megatron-Core 0.16's MLATransformerConfig fixes it at {default}"
                    )

    @staticmethod
    def gpt_oss(spec: ModelSpec) -> bool:
        """gpt-oss's extras (attention biases and sinks, router and expert biases, fused interleaved experts)."""
        family = FAMILIES.get(spec.family)
        return family is not None and family.hf_experts == "fused_interleaved"

    @staticmethod
    def per_layer(spec: ModelSpec) -> bool:
        """This family's Megatron keys are per layer (`decoder.layers.{i}.…`), not stacked on [L]."""
        family = FAMILIES.get(spec.family)
        return family is not None and family.megatron_layers == "per_layer"

    def layer_key(self, spec: ModelSpec, i: int, meg: str) -> str:
        """The suffix this layout's spec gives layer i's tensor `meg` (a `layer_entries` name, local spec's)."""
        if self.spec != "te" or meg not in _TE_FUSED_NORMS:
            return meg
        if meg == _MLP_NORM_LOCAL and hfl.is_moe_layer(spec, i):
            return meg  # a MoE layer keeps its pre-MLP TENorm; a dense one fuses it into fc1
        return _TE_FUSED_NORMS[meg]

    def layer_entries(self, spec: ModelSpec, i: int) -> list[_Entry]:
        """Layer i of a per-layer family: (Megatron suffix, how, HF suffixes), in Megatron's module order."""
        if not spec.q_lora_rank:
            raise UnsupportedModelError(f"{spec.family}: per-layer Megatron keys are mapped for MLA models only")
        out: list[_Entry] = [(meg, "same", (hf,)) for meg, hf in _MLA_LAYER.items()]
        if not hfl.is_moe_layer(spec, i):
            return out + [
                (_FC1, "gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
                (_FC2, "same", ("mlp.down_proj.weight",)),
            ]
        router, gate, up, down = self._hf_expert_names(spec)
        out.append((_ROUTER, "same", (router,)))
        if spec.routing == "sigmoid_bias":  # DeepSeek's routing bias: HF's e_score_correction_bias
            out.append((_EXPERT_BIAS, "same", ("mlp.gate.e_score_correction_bias",)))
        out += [(_EXP_FC1, "experts_gate_up", (gate, up)), (_EXP_FC2, "experts", (down,))]
        if spec.num_shared_experts:  # all shared experts as one MLP of width S = shared x M, as HF has them
            out += [
                (_SHARED_FC1, "gate_up", ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")),
                (_SHARED_FC2, "same", ("mlp.shared_experts.down_proj.weight",)),
            ]
        return out

    def _megatron_shape(self, spec: ModelSpec, i: int, how: str, hf_suffixes: tuple[str, ...]) -> tuple[int, ...]:
        """The Megatron tensor's shape for an entry, from the HF shapes of layer i."""
        shapes = hfl.layer_tensors(spec, i)
        first = hfl.shape_of(shapes[hf_suffixes[0].format(e=0)], spec)
        if how == "same":
            return first
        if how == "gate_up":
            return (2 * first[0], *first[1:])
        if how == "experts_gate_up":
            return (spec.num_experts, 2 * first[0], *first[1:])
        return (spec.num_experts, *first)

    def _per_layer_from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """Every layer's tensors under `decoder.layers.{i}.…`; experts stacked [X, ...], one expert per piece."""
        where = "HF -> Megatron"
        out: dict[str, LazyTensor] = {}
        for i in range(spec.num_layers):
            shapes = hfl.layer_tensors(spec, i)

            def get(suffix: str, i: int = i, shapes=shapes) -> LazyTensor:
                return _check(_need(hf, _hf(i, suffix), where), hfl.shape_of(shapes[suffix], spec), suffix)

            def fused(suffixes: tuple[str, str], tag: str) -> LazyTensor:
                g, u = get(suffixes[0]), get(suffixes[1])
                return LazyTensor.computed(tag, (2 * g.shape[0], *g.shape[1:]), g.dtype, lambda: fuse_gate_up(g.read(), u.read()))

            for meg, how, names in self.layer_entries(spec, i):
                name = f"decoder.layers.{i}.{self.layer_key(spec, i, meg)}"
                if how == "same":
                    out[name] = lazy_rename(get(names[0]), name)
                elif how == "gate_up":
                    out[name] = lazy_rename(fused((names[0], names[1]), name), name)
                elif how == "experts_gate_up":
                    X = spec.num_experts
                    parts = [fused((names[0].format(e=e), names[1].format(e=e)), f"{name}[{e}]") for e in range(X)]
                    out[name] = LazyTensor.stacked(name, parts)
                else:
                    out[name] = LazyTensor.stacked(name, [get(names[0].format(e=e)) for e in range(spec.num_experts)])
        return out

    def _per_layer_to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec) -> dict[str, LazyTensor]:
        """HF tensors of a per-layer family; each reads its own layer (and expert) of the source."""
        self._check_moe(spec, writing=False)
        where = "Megatron -> HF"
        L = spec.num_layers
        out: dict[str, LazyTensor] = {}

        def source(i: int, meg: str, shape: tuple[int, ...]) -> LazyTensor:
            for suffix in (meg, _TE_FUSED_NORMS.get(meg)):
                if suffix is None:
                    continue
                single = tensors.get(f"decoder.layers.{i}.{suffix}")
                if single is not None:
                    return _check(single, shape, suffix)
                stacked = tensors.get(f"decoder.layers.{suffix}")
                if stacked is not None and stacked.shape[0] == L:
                    return _check(lazy_layer(stacked, i, f"{stacked.name}[{i}]"), shape, suffix)
            raise ShapeMismatchError(f"{where}: layer {i} has no tensor named decoder.layers.{i}.{meg}")

        for i in range(L):
            shapes = hfl.layer_tensors(spec, i)
            for meg, how, names in self.layer_entries(spec, i):
                t = source(i, meg, self._megatron_shape(spec, i, how, names))
                if how == "same":
                    out[_hf(i, names[0])] = lazy_rename(t, _hf(i, names[0]))
                    continue
                half = hfl.shape_of(shapes[names[0].format(e=0)], spec)
                if how == "gate_up":
                    cached = functools.lru_cache(maxsize=1)(lambda t=t: split_gate_up(t.read()))
                    for j, n in enumerate(names):
                        out[_hf(i, n)] = LazyTensor.computed(_hf(i, n), half, t.dtype, lambda j=j, c=cached: c()[j])
                elif how == "experts_gate_up":
                    expert = functools.lru_cache(maxsize=1)(lambda e, t=t: split_gate_up(t.read((e,))))
                    for e in range(spec.num_experts):
                        for j, n in enumerate(names):
                            name = _hf(i, n.format(e=e))
                            out[name] = LazyTensor.computed(name, half, t.dtype, lambda e=e, j=j, c=expert: c(e)[j])
                else:
                    for e in range(spec.num_experts):
                        name = _hf(i, names[0].format(e=e))
                        out[name] = LazyTensor.computed(name, half, t.dtype, lambda e=e, t=t: t.read((e,)))
        return out

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
        if FAMILIES[spec.family].hf_experts == "fused_interleaved":
            return self._fused_experts_from_hf(spec, get)
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

    def _fused_experts_from_hf(self, spec: ModelSpec, get) -> dict[str, LazyTensor]:
        """gpt-oss: HF's per-layer `gate_up_proj [X, E, 2M]` (gate and up interleaved column by column) and
        `down_proj [X, M, E]` -> Megatron's `[L, X, 2M, E]` ([gate; up] rows) and `[L, X, E, M]`, plus the
        router and expert biases; one (layer, expert) piece at a time."""
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        out: dict[str, LazyTensor] = {}

        def stacked(suffix: str, per_layer) -> None:
            name = f"decoder.layers.{suffix}"
            out[name] = LazyTensor.stacked(name, [per_layer(i) for i in range(L)])

        def grid(suffix: str, shape: tuple[int, ...], piece) -> None:
            name = f"decoder.layers.{suffix}"
            parts = [[piece(i, e, shape) for e in range(X)] for i in range(L)]
            out[name] = lazy_grid(name, parts, outer_axis=0, inner_axis=1)

        def gate_up(i: int, e: int, shape: tuple[int, ...]) -> LazyTensor:
            t = get(i, "mlp.experts.gate_up_proj", (X, E, 2 * M))
            return LazyTensor.computed(f"fc1_{i}_{e}", shape, t.dtype, lambda: deinterleave_gate_up(t.read((e,))))

        def down(i: int, e: int, shape: tuple[int, ...]) -> LazyTensor:
            t = get(i, "mlp.experts.down_proj", (X, M, E))
            return LazyTensor.computed(f"fc2_{i}_{e}", shape, t.dtype, lambda: np.ascontiguousarray(t.read((e,)).T))

        stacked(_ROUTER, lambda i: get(i, "mlp.router.weight", (X, E)))
        grid(_EXP_FC1, (2 * M, E), gate_up)
        grid(_EXP_FC2, (E, M), down)
        if spec.router_bias:
            stacked(_ROUTER_BIAS, lambda i: get(i, "mlp.router.bias", (X,)))
        if spec.expert_bias:
            stacked(_EXP_FC1_BIAS, lambda i: _computed_from(get(i, "mlp.experts.gate_up_proj_bias", (X, 2 * M)),
                                                           lambda b: deinterleave_gate_up(b[:, None, :])[..., 0]))
            stacked(_EXP_FC2_BIAS, lambda i: get(i, "mlp.experts.down_proj_bias", (X, E)))
        return out

    def _fused_experts_to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec, i: int) -> dict[str, LazyTensor]:
        """Layer i's gpt-oss router, fused experts and biases as HF tensors (the inverse of the above)."""
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        where = "Megatron -> HF"

        def layer(suffix: str, shape: tuple[int, ...], what: str) -> LazyTensor:
            t = _check(_need(tensors, f"decoder.layers.{suffix}", where), (L, *shape), what)
            return lazy_layer(t, i, f"{t.name}[{i}]")

        out: dict[str, LazyTensor] = {}

        def put(hf_suffix: str, t: LazyTensor, shape: tuple[int, ...], fn=None) -> None:
            name = _hf(i, hf_suffix)
            out[name] = lazy_rename(t, name) if fn is None else LazyTensor.computed(name, shape, t.dtype, lambda: fn(t.read()))

        put("mlp.router.weight", layer(_ROUTER, (X, E), "the router"), (X, E))
        if spec.router_bias:
            put("mlp.router.bias", layer(_ROUTER_BIAS, (X,), "the router bias"), (X,))
        put("mlp.experts.gate_up_proj", layer(_EXP_FC1, (X, 2 * M, E), "the experts' fc1"), (X, E, 2 * M), interleave_gate_up)
        if spec.expert_bias:
            put("mlp.experts.gate_up_proj_bias", layer(_EXP_FC1_BIAS, (X, 2 * M), "the experts' fc1 bias"), (X, 2 * M),
                lambda b: interleave_gate_up(b[:, :, None])[:, 0, :])
        put("mlp.experts.down_proj", layer(_EXP_FC2, (X, E, M), "the experts' fc2"), (X, M, E),
            lambda w: np.ascontiguousarray(np.swapaxes(w, -1, -2)))
        if spec.expert_bias:
            put("mlp.experts.down_proj_bias", layer(_EXP_FC2_BIAS, (X, E), "the experts' fc2 bias"), (X, E))
        return out

    def extra_state(self, spec: ModelSpec) -> dict[str, Any]:
        """The `_extra_state` bytes items Megatron's loader expects, as objects to `torch.save`.

        Each is `[None]` - what core 0.16 itself saves for a model without FP8
        state (local linears return None; TE modules accept None on load).
        Write them with `DcpWriter.write_object(name, obj)`.

        Local spec: one per linear (per layer, and per expert). TE spec: every
        TE module's - the linears, `core_attention`, and the TENorms (the final
        norm, q/k norms, a MoE layer's `pre_mlp_layernorm`, an MLA layer's
        `input_layernorm`); norms fused into a linear share its item.
        """
        L = spec.num_layers
        te = self.spec == "te"
        out: dict[str, Any] = {_FINAL_NORM_EXTRA: [None]} if te else {}
        if self.per_layer(spec):  # per-layer keys: each layer's modules are a shard 0 of 1; experts e of X
            for i in range(L):
                modules: dict[str, int] = {}
                for meg, how, _ in self.layer_entries(spec, i):
                    module = self.layer_key(spec, i, meg).rsplit(".", 1)[0]
                    if module == "mlp.router" or ("layernorm" in module and not te):
                        continue
                    modules.setdefault(module, spec.num_experts if how.startswith("experts") else 1)
                    if te and module == "self_attention.linear_kv_up_proj":
                        modules.setdefault("self_attention.core_attention", 1)
                for module, count in modules.items():
                    for e in range(count):
                        out[f"decoder.layers.{i}.{module}._extra_state/shard_{e}_{count}"] = [None]
            return out
        modules = list(_EXTRA_TE if te else _EXTRA_LOCAL)
        if te and spec.qk_norm:
            modules += ["self_attention.q_layernorm", "self_attention.k_layernorm"]
        if spec.num_experts:  # the experts' linears have one item per (layer, expert); no dense MLP
            modules = [m for m in modules if not m.startswith("mlp.")] + (["pre_mlp_layernorm"] if te else [])
            X = spec.num_experts
            experts = {f"decoder.layers.{m}._extra_state/shard_{i}.{e}_{L}.{X}": [None] for m in _EXP_EXTRA for i in range(L) for e in range(X)}
        else:
            experts = {}
        out.update({f"decoder.layers.{m}._extra_state/shard_{i}_{L}": [None] for m in modules for i in range(L)})
        out.update(experts)
        return out

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
        if self.per_layer(spec):
            out.update(self._per_layer_to_hf(tensors, spec))
            return out

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
            if spec.attention_bias:
                out.update(self._attention_biases_to_hf(i, spec, required))
            if spec.attention_sinks:
                out[_hf(i, "self_attn.sinks")] = lazy_rename(required((_SINKS,), i, (H,)), _hf(i, "self_attn.sinks"))

            if spec.num_experts and FAMILIES[spec.family].hf_experts == "fused_interleaved":
                self._check_moe(spec, writing=False)
                out.update(self._fused_experts_to_hf(tensors, spec, i))
            elif spec.num_experts:
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


    def _attention_biases_to_hf(self, i: int, spec: ModelSpec, required) -> dict[str, LazyTensor]:
        """Layer i's q/k/v biases (from the fused, per-group `linear_qkv.bias`) and o_proj bias."""
        H, G, D, E = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.emb_dim
        fused = required((_QKV_BIAS,), i, (self._qkv_rows(spec),))
        parts = functools.lru_cache(maxsize=1)(lambda: [p[:, 0] for p in split_qkv(fused.read()[:, None], H, G, D)])
        out = {}
        for j, (p, rows) in enumerate((("q", H * D), ("k", G * D), ("v", G * D))):
            name = _hf(i, f"self_attn.{p}_proj.bias")
            out[name] = LazyTensor.computed(name, (rows,), fused.dtype, lambda j=j: parts()[j])
        name = _hf(i, "self_attn.o_proj.bias")
        out[name] = lazy_rename(required((_PROJ_BIAS,), i, (E,)), name)
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
    """Refuse Megatron models outside what maxckpt maps (Llama family, mixtral/qwen3-moe, DeepSeek-V3)."""
    mla = any(n.endswith("self_attention.linear_q_down_proj.weight") for n in names)
    sinks = any(n.endswith(_SINKS) for n in names)  # gpt-oss: its biases are mapped too
    oss_biases = re.compile(r"decoder\.layers\.(\d+\.)?(self_attention\.linear_(qkv|proj)|mlp\.router|mlp\.experts\.experts\.linear_fc[12])\.bias$")
    per_layer_moe = re.compile(r"decoder\.layers\.(\d+\.)?mlp\.(router\.weight|experts\.experts\.linear_fc[12]\.)")
    deepseek_only = re.compile(r"decoder\.layers\.(\d+\.)?mlp\.(router\.expert_bias|shared_experts\.linear_fc[12]\.)")
    for name in names:
        if sinks and oss_biases.match(name):
            continue
        moe_ok = bool(per_layer_moe.match(name)) or (mla and bool(deepseek_only.match(name)))
        if (".mlp.experts." in name or ".mlp.router." in name or ".mlp.shared_experts." in name) and not moe_ok:
            raise UnsupportedModelError(
                f"{name!r}: a Mixture-of-Experts Megatron layout maxckpt does not read (grouped-GEMM experts "
                "outside torch_dist's sharded keys, shared experts or a routing bias outside an MLA model, a "
                "shared-expert gate); it reads the torch_dist expert keys of SequentialMLP, GroupedMLP and "
                "TEGroupedMLP (decoder.layers[.i].mlp.experts.experts.*) of mixtral, qwen3-moe, DeepSeek-V3 and gpt-oss"
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
    "moe_shared_expert_intermediate_size": (None, 0),
}


_GPT_OSS_ARGS = ("swiglu", "position_embedding_type", "add_bias_linear", "add_qkv_bias")


def check_supported_args(args: argparse.Namespace | Mapping[str, Any], where: str = "common.pt") -> None:
    """Refuse a Megatron run whose saved args describe a model outside the Llama family."""
    a = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    for key, allowed in _REQUIRED_ARGS.items():
        if key == "moe_shared_expert_intermediate_size" and a.get("multi_latent_attention"):
            continue  # DeepSeek-V3's shared experts are mapped
        if a.get("softmax_type") == "learnable" and key in _GPT_OSS_ARGS:
            continue  # gpt-oss: biases, quick-GeGLU with offset and clamp, YaRN positions
        if key in a and a[key] not in allowed:
            raise UnsupportedModelError(
                f"{where}: the run was trained with {key}={a[key]!r}; maxckpt converts Llama-family models "
                f"({key}={allowed[0]!r}) only"
            )
    rotary_percent = a.get("rotary_percent")
    if rotary_percent not in (None, 1.0, 1):
        raise UnsupportedModelError(f"{where}: rotary_percent={rotary_percent}; only full-width RoPE (1.0) is supported")
    if a.get("multi_latent_attention"):
        _check_family_args(a, where, "DeepSeek-V3 (MLA)", {
            "moe_shared_expert_gate": (None, False),
            "moe_router_score_function": ("sigmoid",),
            "rope_type": (None, "yarn"),
        })
        if not a.get("q_lora_rank"):
            raise UnsupportedModelError(f"{where}: MLA without q_lora_rank (a q_proj) is not mapped; DeepSeek-V3 has one")
    if a.get("softmax_type") == "learnable":
        from maxckpt.layouts.families import FAMILIES as _F

        limit = float(_F["gpt-oss"].hf_config_extra["swiglu_limit"])
        _check_family_args(a, where, "gpt-oss", {
            "quick_geglu": (True,), "glu_linear_offset": (1.0, 1), "activation_func_clamp_value": (limit,),
            "position_embedding_type": ("yarn",),
        })
        window = a.get("window_size")
        if window is not None and tuple(window)[1:] != (0,):
            raise UnsupportedModelError(f"{where}: window_size={window}; gpt-oss's windows look back only (right 0)")


def _check_family_args(a: Mapping[str, Any], where: str, what: str, allowed: Mapping[str, tuple[Any, ...]]) -> None:
    """Refuse a run whose args leave the family maxckpt maps (the HF side could not say it)."""
    for key, values in allowed.items():
        if key in a and a[key] not in values:
            raise UnsupportedModelError(
                f"{where}: the run was trained with {key}={a[key]!r}; maxckpt maps {what} with "
                f"{key}={values[-1]!r} (HF's config cannot state anything else)"
            )


def deinterleave_gate_up(w: np.ndarray) -> np.ndarray:
    """gpt-oss `gate_up_proj` `[..., E, 2M]` (gate at even columns, up at odd) -> Megatron `[..., 2M, E]` = [gate; up]."""
    return np.ascontiguousarray(np.concatenate([w[..., 0::2], w[..., 1::2]], axis=-1).swapaxes(-1, -2))


def interleave_gate_up(fc1: np.ndarray) -> np.ndarray:
    """Megatron `[..., 2M, E]` = [gate; up] -> gpt-oss `[..., E, 2M]` interleaved; the inverse of the above."""
    m = fc1.shape[-2] // 2
    out = np.empty((*fc1.shape[:-2], fc1.shape[-1], 2 * m), dtype=fc1.dtype)
    out[..., 0::2] = fc1[..., :m, :].swapaxes(-1, -2)
    out[..., 1::2] = fc1[..., m:, :].swapaxes(-1, -2)
    return out


def _computed_from(t: LazyTensor, fn) -> LazyTensor:
    """`fn(t.read())` as a lazy tensor of the same shape and dtype."""
    return LazyTensor.computed(t.name, t.shape, t.dtype, lambda: fn(t.read()))


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
    args = argparse.Namespace(
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
        moe_grouped_gemm=bool(spec.num_experts) and layout.spec == "te",  # the flags below; same keys either way
        moe_router_pre_softmax=False,
        ckpt_format="torch_dist",
        use_dist_ckpt=True,
        no_save_optim=True,
        no_save_rng=True,
        consumed_train_samples=0,
        skipped_train_samples=0,
        consumed_valid_samples=0,
    )
    vars(args).update(_mla_moe_args(spec))  # DeepSeek-V3: MLA, YaRN, dense/MoE pattern, routing
    vars(args).update(_gpt_oss_args(spec))  # gpt-oss: biases, sinks, windows, clamped GLU, YaRN
    return args


def _moe_layer_freq(spec: ModelSpec) -> list[int]:
    """Megatron's `moe_layer_freq` list: 0 for a dense layer, 1 for a MoE layer."""
    return [int(hfl.is_moe_layer(spec, i)) for i in range(spec.num_layers)]


def _mla_moe_args(spec: ModelSpec) -> dict[str, Any]:
    """`common.pt` args of a DeepSeek-V3 model: MLA dims, YaRN, dense/MoE layer pattern, sigmoid routing."""
    if not spec.q_lora_rank:
        return {}
    yarn = dict(spec.rope_scaling or {})
    return dict(
        multi_latent_attention=True,
        q_lora_rank=spec.q_lora_rank,
        kv_lora_rank=spec.kv_lora_rank,
        qk_head_dim=spec.qk_nope_head_dim,
        qk_pos_emb_head_dim=spec.qk_rope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_channels=spec.v_head_dim,  # the local core attention's output width per head
        qk_layernorm=True,  # MLA's q_a / kv_a layernorms
        rope_type="yarn",
        rotary_scaling_factor=float(yarn.get("factor", 40.0)),
        mscale=float(yarn.get("mscale", 1.0)),
        mscale_all_dim=float(yarn.get("mscale_all_dim", 0.0)),
        original_max_position_embeddings=int(yarn.get("original_max_position_embeddings", 4096)),
        beta_fast=float(yarn.get("beta_fast", 32.0)),
        beta_slow=float(yarn.get("beta_slow", 1.0)),
        moe_layer_freq=_moe_layer_freq(spec),
        moe_shared_expert_intermediate_size=spec.num_shared_experts * spec.moe_mlp_dim or None,
        moe_router_score_function="sigmoid" if spec.routing == "sigmoid_bias" else "softmax",
        moe_router_enable_expert_bias=spec.routing == "sigmoid_bias",
        moe_router_topk_scaling_factor=spec.routed_scaling_factor,
        moe_router_num_groups=_router_groups(spec)[0],  # group-limited routing (DeepSeek)
        moe_router_group_topk=_router_groups(spec)[1],
    )


def _gpt_oss_args(spec: ModelSpec) -> dict[str, Any]:
    """`common.pt` args of a gpt-oss model, under Megatron-Core 0.16.1's TransformerConfig names.

    The window: HF's `sliding_window` W lets a query see W keys (itself and W - 1 before);
    Megatron's `window_size` (left, right) masks keys more than `left` before, so left = W - 1.
    """
    if not MegatronLayout.gpt_oss(spec):
        return {}
    yarn = dict(spec.rope_scaling or {})
    limit = float(FAMILIES[spec.family].hf_config_extra.get("swiglu_limit", 7.0))
    return dict(
        position_embedding_type="yarn",
        add_bias_linear=spec.expert_bias or spec.attention_bias,
        add_qkv_bias=spec.attention_bias,
        swiglu=False,
        quick_geglu=True,  # gated, activation x * sigmoid(1.702 x): gpt-oss's alpha
        glu_linear_offset=1.0,  # (up + 1)
        activation_func_clamp_value=limit,
        softmax_type="learnable",
        window_size=(spec.sliding_window - 1, 0) if spec.sliding_window else None,
        window_attn_skip_freq=spec.sliding_window_pattern or None,
        yarn_rotary_scaling_factor=float(yarn.get("factor", 1.0)),
        yarn_original_max_position_embeddings=int(yarn.get("original_max_position_embeddings", 4096)),
        yarn_beta_fast=float(yarn.get("beta_fast", 32.0)),
        yarn_beta_slow=float(yarn.get("beta_slow", 1.0)),
        yarn_mscale=float(yarn.get("mscale", 1.0)),
        yarn_mscale_all_dim=float(yarn.get("mscale_all_dim", 0.0)),
        yarn_correction_range_round_to_int=bool(yarn.get("truncate", True)),
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
        f"--kv-channels {spec.v_head_dim if spec.q_lora_rank else spec.head_dim}",
        f"--max-position-embeddings {spec.max_position_embeddings}",
        f"--position-embedding-type {'yarn' if MegatronLayout.gpt_oss(spec) else 'rope'}",
        f"--rotary-base {theta}",
        "--normalization RMSNorm",
        f"--norm-epsilon {spec.rms_norm_eps:g}",
    ]
    oss = _gpt_oss_args(spec)
    if oss:
        flags += ["--quick-geglu", "--glu-linear-offset 1", f"--activation-func-clamp-value {oss['activation_func_clamp_value']:g}",
                  "--softmax-type learnable", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion"]
        if oss["add_qkv_bias"]:
            flags.append("--add-qkv-bias")
        if not oss["add_bias_linear"]:
            flags.append("--disable-bias-linear")
        if oss["window_size"]:
            flags += [f"--window-size {oss['window_size'][0]},0", f"--window-attn-skip-freq {oss['window_attn_skip_freq']}"]
        flags += [f"--yarn-rotary-scaling-factor {oss['yarn_rotary_scaling_factor']:g}",
                  f"--yarn-original-max-position-embeddings {oss['yarn_original_max_position_embeddings']}",
                  f"--yarn-beta-fast {oss['yarn_beta_fast']:g}", f"--yarn-beta-slow {oss['yarn_beta_slow']:g}",
                  f"--yarn-mscale {oss['yarn_mscale']:g}", f"--yarn-mscale-all-dim {oss['yarn_mscale_all_dim']:g}"]
        if not oss["yarn_correction_range_round_to_int"]:
            flags.append("--no-yarn-correction-range-round-to-int")
    else:
        flags += ["--swiglu", "--disable-bias-linear"]
    if rope.get("rope_type", rope.get("type")) == "llama3":
        flags += ["--use-rope-scaling", f"--rope-scaling-factor {float(rope.get('factor', 8.0)):g}"]
    if spec.qk_norm:
        flags.append("--qk-layernorm")
    mla = _mla_moe_args(spec)
    if mla:
        flags += [
            "--multi-latent-attention", f"--q-lora-rank {spec.q_lora_rank}", f"--kv-lora-rank {spec.kv_lora_rank}",
            f"--qk-head-dim {spec.qk_nope_head_dim}", f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}",
            f"--v-head-dim {spec.v_head_dim}", "--qk-layernorm", "--rope-type yarn",
            f"--rotary-scaling-factor {mla['rotary_scaling_factor']:g}", f"--mscale {mla['mscale']:g}",
            f"--mscale-all-dim {mla['mscale_all_dim']:g}",
        ]
    if spec.num_experts:
        flags += [f"--num-experts {spec.num_experts}", f"--moe-router-topk {spec.num_experts_per_tok}",
                  f"--moe-ffn-hidden-size {spec.moe_mlp_dim}"]
        if layout.spec == "te":  # TEGroupedMLP reads SequentialMLP's keys; it runs every family here (bias, GLU clamp)
            flags.append("--moe-grouped-gemm")
        if mla:
            k = spec.first_dense_layers
            flags += [f"--moe-layer-freq '([0]*{k}+[1]*{spec.num_layers - k})'",
                      f"--moe-router-score-function {mla['moe_router_score_function']}",
                      f"--moe-router-topk-scaling-factor {spec.routed_scaling_factor:g}"]
            if mla["moe_router_enable_expert_bias"]:
                flags.append("--moe-router-enable-expert-bias")
            if spec.n_group > 1:
                flags += [f"--moe-router-num-groups {spec.n_group}", f"--moe-router-group-topk {spec.topk_group}"]
            if spec.num_shared_experts:
                flags.append(f"--moe-shared-expert-intermediate-size {mla['moe_shared_expert_intermediate_size']}")
        else:
            flags.append("--moe-router-score-function softmax")
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
    assumed: Mapping[str, Any] | None = None,
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
        args = megatron_args(spec, layout)
        if assumed:  # a MaxText source's values taken from a preset; no Megatron argument, read by no loader
            args.maxckpt_assumed_settings = dict(assumed)
        state = {
            "args": args,
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
    if a.get("multi_latent_attention"):
        return {**out, **_mla_spec_fields(a)}
    if a.get("softmax_type") == "learnable" and a.get("num_experts"):
        out.update(_gpt_oss_spec_fields(a))
        return out
    if a.get("num_experts"):
        out["num_experts"] = int(a["num_experts"])
        put("num_experts_per_tok", "moe_router_topk", int)
        put("moe_mlp_dim", "moe_ffn_hidden_size", int)
        if "moe_mlp_dim" in out:
            out["mlp_dim"] = out["moe_mlp_dim"]
        out["family"] = "qwen3-moe" if out.get("qk_norm") else "mixtral"
    return out


def _gpt_oss_spec_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    """gpt-oss fields from a run's args: learnable softmax offsets (sinks), biases, windows, YaRN."""
    out: dict[str, Any] = {
        "family": "gpt-oss", "attention_sinks": True, "attention_bias": bool(a.get("add_qkv_bias")),
        "router_bias": bool(a.get("add_bias_linear")), "expert_bias": bool(a.get("add_bias_linear")),
        "num_experts": int(a["num_experts"]),
    }
    if a.get("moe_router_topk"):
        out["num_experts_per_tok"] = int(a["moe_router_topk"])
    if a.get("moe_ffn_hidden_size"):
        out["moe_mlp_dim"] = out["mlp_dim"] = int(a["moe_ffn_hidden_size"])
    window = a.get("window_size")
    if window:
        out["sliding_window"] = int(window[0]) + 1
        out["sliding_window_pattern"] = int(a.get("window_attn_skip_freq") or 0)
    if a.get("position_embedding_type") == "yarn":
        out["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(a.get("yarn_rotary_scaling_factor") or 1.0),
            "original_max_position_embeddings": int(a.get("yarn_original_max_position_embeddings") or 4096),
            "beta_fast": float(a.get("yarn_beta_fast") or 32.0), "beta_slow": float(a.get("yarn_beta_slow") or 1.0),
            "truncate": bool(a.get("yarn_correction_range_round_to_int", True)),
        }
    return out


def _mla_spec_fields(a: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3 fields from a multi-latent-attention run's args (qk_layernorm there is MLA's, not qwen3's)."""
    heads = int(a["num_attention_heads"])
    out: dict[str, Any] = {
        "family": "deepseek3", "qk_norm": False, "num_kv_heads": heads,
        "q_lora_rank": int(a["q_lora_rank"]), "kv_lora_rank": int(a["kv_lora_rank"]),
        "qk_nope_head_dim": int(a["qk_head_dim"]), "qk_rope_head_dim": int(a["qk_pos_emb_head_dim"]),
        "v_head_dim": int(a["v_head_dim"]), "head_dim": int(a["qk_pos_emb_head_dim"]),
    }
    if a.get("rope_type", "yarn") == "yarn":
        out["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(a.get("rotary_scaling_factor") or 40.0),
            "original_max_position_embeddings": int(a.get("original_max_position_embeddings") or 4096),
            "beta_fast": float(a.get("beta_fast") or 32.0), "beta_slow": float(a.get("beta_slow") or 1.0),
            "mscale": float(a.get("mscale") or 1.0), "mscale_all_dim": float(a.get("mscale_all_dim") or 0.0),
            "truncate": True,
        }
    if a.get("num_experts"):
        out["num_experts"] = int(a["num_experts"])
        if a.get("moe_router_topk"):
            out["num_experts_per_tok"] = int(a["moe_router_topk"])
        moe = int(a.get("moe_ffn_hidden_size") or 0)
        if moe:
            out["moe_mlp_dim"] = moe
            out["num_shared_experts"] = int(a.get("moe_shared_expert_intermediate_size") or 0) // moe
        freq = a.get("moe_layer_freq")
        if isinstance(freq, (list, tuple)):
            out["first_dense_layers"] = next((i for i, f in enumerate(freq) if f), len(freq))
        if a.get("moe_router_score_function") == "sigmoid" and a.get("moe_router_enable_expert_bias"):
            out["routing"] = "sigmoid_bias"
        if a.get("moe_router_topk_scaling_factor") is not None:
            out["routed_scaling_factor"] = float(a["moe_router_topk_scaling_factor"])
        if (a.get("moe_router_num_groups") or 1) > 1:
            out["n_group"] = int(a["moe_router_num_groups"])
            out["topk_group"] = int(a.get("moe_router_group_topk") or 1)
            if int(a.get("moe_router_topk") or 0) != 2 * out["topk_group"]:
                raise UnsupportedModelError(
                    f"the run routes with moe_router_num_groups={out['n_group']}, moe_router_group_topk="
                    f"{out['topk_group']} and moe_router_topk={a.get('moe_router_topk')}: Megatron scores each group "
                    "by its top topk // group_topk experts, DeepSeek (HF, MaxText) by its top 2, which agree only "
                    "when moe_router_topk = 2 * moe_router_group_topk; this run's routing has no HF equivalent"
                )
    return out



def _router_groups(spec: ModelSpec) -> tuple[int | None, int | None]:
    """Megatron's moe_router_num_groups / moe_router_group_topk for the spec's group-limited routing.

    Megatron scores a group by the sum of its top (topk // group_topk) expert scores, DeepSeek (HF,
    MaxText) by its top 2: the two route alike only when top-k = 2 * topk_group (DeepSeek-V3: 8 = 2 * 4).
    """
    if spec.n_group <= 1:
        return None, None
    if spec.num_experts_per_tok != 2 * spec.topk_group:
        raise UnsupportedModelError(
            f"group-limited routing with n_group={spec.n_group}, topk_group={spec.topk_group} and top-k "
            f"{spec.num_experts_per_tok}: Megatron-Core scores each group by its top {spec.num_experts_per_tok} // "
            f"{spec.topk_group} experts, DeepSeek by its top 2, so Megatron would route this model differently; "
            "they agree only when top-k = 2 * topk_group. Convert to hf, torch or maxtext instead"
        )
    return spec.n_group, spec.topk_group


def open_megatron_writer(
    root: str | os.PathLike, spec: ModelSpec, layout: MegatronLayout, iteration: int | None = None, share: Any = None
) -> "DcpWriter":
    """A DcpWriter for `<root>/iter_NNNNNNN` (or `release`) with the `_extra_state` items already in.

    Stream the tensors of `layout.from_hf(...)` into it, close it, then call
    :func:`write_megatron_sidecars` with the same arguments.
    """
    from maxckpt.containers.dcp import DcpWriter

    writer = DcpWriter(Path(root) / iteration_dir_name(iteration), share=share)
    if share is None or share.rank == 0:  # a multi-process conversion: process 0 writes the non-tensor items
        for name, obj in layout.extra_state(spec).items():
            writer.write_object(name, obj)
    return writer
