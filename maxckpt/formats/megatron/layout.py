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

>>> layout = MegatronLayout(spec="local")                        # doctest: +SKIP
>>> mega = layout.from_hf(hf_tensors, model_spec)                # doctest: +SKIP
>>> sorted(layout.extra_state(model_spec))[:1]                   # doctest: +SKIP
['decoder.layers.mlp.linear_fc1._extra_state/shard_0_2']
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.hf.layout import layer_name as _hf
from maxckpt.formats.megatron import names as n
from maxckpt.formats.megatron import te_spec
from maxckpt.formats.megatron.support import check_supported_keys
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES
from maxckpt.families.registry import refine_tree_family
from maxckpt.layouts.torch_transforms import fuse_gate_up, fuse_qkv, pad_rows, padded_size, split_gate_up, split_qkv
from maxckpt.layouts.transforms import lazy_grid, lazy_layer, lazy_rename, lazy_rows, shared_result
from maxckpt.tensors import LazyTensor, TensorInfo

__all__ = ["MegatronLayout", "deinterleave_gate_up", "interleave_gate_up"]

# What Megatron-Core 0.16's MLATransformerConfig assumes and Megatron-LM's flags do not set: the YaRN
# settings a spec must have for the hand-off flags to rebuild the same model.
_MEGATRON_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


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
        """DeepSeek-V3 dims from Megatron's per-layer shapes, by way of the HF names they map to.

        The vocabulary size is left out (Megatron's embedding is padded).
        """
        back = {**n.MLA_LAYER, **n.MLA_Q_PROJ}
        back.update({te: n.MLA_LAYER[meg] for meg, te in te_spec.FUSED_NORMS.items()})
        back.update({n.ROUTER: "mlp.gate.weight", n.EXPERT_BIAS: "mlp.gate.e_score_correction_bias",
                     n.FC2: "mlp.down_proj.weight", n.SHARED_FC2: "mlp.shared_experts.down_proj.weight"})
        hf_infos: dict[str, TensorInfo] = {"model.embed_tokens.weight": infos[n.EMBED]}
        if n.OUTPUT in infos:
            hf_infos["lm_head.weight"] = infos[n.OUTPUT]
        for name, info in infos.items():
            m = re.match(r"decoder\.layers\.(\d+)\.(.+)$", name)
            if not m:
                continue
            i, suffix = int(m.group(1)), m.group(2)
            if suffix in back:
                hf_infos[_hf(i, back[suffix])] = info
            elif suffix in (n.FC1, n.SHARED_FC1):  # [2F, E]: gate and up halves
                half = TensorInfo("", (info.shape[0] // 2, *info.shape[1:]), info.dtype)
                prefix = "mlp." if suffix == n.FC1 else "mlp.shared_experts."
                hf_infos[_hf(i, prefix + "gate_proj.weight")] = hf_infos[_hf(i, prefix + "up_proj.weight")] = half
            elif suffix == n.EXP_FC1:  # [X, 2M, E]: one HF gate per expert
                for e in range(info.shape[0]):
                    half = TensorInfo("", (info.shape[1] // 2, info.shape[2]), info.dtype)
                    hf_infos[_hf(i, f"mlp.experts.{e}.gate_proj.weight")] = half
        dims = hfl.HFLayout().infer_dims(hf_infos)
        dims.pop("vocab_size", None)
        dims["_family"] = refine_tree_family("deepseek3", hf_infos)  # deepseek2-16b: a q_proj
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
        out[n.EMBED] = _padded(embed, vp, n.EMBED)
        if not spec.tie_word_embeddings:
            head = _check(_need(hf, "lm_head.weight", where), (spec.vocab_size, E), "lm_head")
            out[n.OUTPUT] = _padded(head, vp, n.OUTPUT)
        final_norm = _check(_need(hf, "model.norm.weight", where), (E,), "the final norm")
        out[n.FINAL_NORM] = lazy_rename(final_norm, n.FINAL_NORM)
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

        layers(n.QKV, qkv)
        layers(n.PROJ, lambda i: get(i, "self_attn.o_proj.weight", (E, H * D)))
        if spec.attention_bias or spec.qkv_bias:

            def qkv_bias(i: int) -> LazyTensor:
                q = get(i, "self_attn.q_proj.bias", (H * D,))
                k = get(i, "self_attn.k_proj.bias", (G * D,))
                v = get(i, "self_attn.v_proj.bias", (G * D,))
                return LazyTensor.computed(
                    f"qkv_bias{i}", (self._qkv_rows(spec),), q.dtype,
                    lambda: fuse_qkv(q.read()[:, None], k.read()[:, None], v.read()[:, None], H, G, D)[:, 0],
                )

            layers(n.QKV_BIAS, qkv_bias)  # qwen2.5 (--add-qkv-bias) has no linear_proj bias
        if spec.attention_bias:
            layers(n.PROJ_BIAS, lambda i: get(i, "self_attn.o_proj.bias", (E,)))
        if spec.attention_sinks:
            layers(n.SINKS, lambda i: get(i, "self_attn.sinks", (H,)))
        if spec.num_experts:
            self._check_moe(spec)
            out.update(self._experts_from_hf(hf, spec, get))
        else:
            layers(n.FC1, fc1)
            layers(n.FC2, lambda i: get(i, "mlp.down_proj.weight", (E, F)))
        in_norm, mlp_norm = te_spec.norm_names(self.norm_keys, spec, te=self.spec == "te")
        layers(in_norm, lambda i: get(i, "input_layernorm.weight", (E,)))
        layers(mlp_norm, lambda i: get(i, "post_attention_layernorm.weight", (E,)))
        if spec.qk_norm:
            layers(n.Q_NORM, lambda i: get(i, "self_attn.q_norm.weight", (D,)))
            layers(n.K_NORM, lambda i: get(i, "self_attn.k_norm.weight", (D,)))
        return out

    def _check_moe(self, spec: ModelSpec, writing: bool = True) -> None:
        """Megatron MoE as maxckpt writes it (SequentialMLP-compatible expert keys); DeepSeek's extras per layer."""
        extras = (spec.first_dense_layers or spec.num_shared_experts or spec.kv_lora_rank
                  or spec.routing in ("sigmoid_bias", "softmax_greedy"))
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
        if writing and spec.kv_lora_rank:
            yarn = dict(spec.rope_scaling or {})
            if str(yarn.get("rope_type", yarn.get("type"))) != "yarn":
                raise UnsupportedModelError(
                    f"{spec.family}: Megatron-Core's MLA takes YaRN rope (rope_type 'yarn'); "
                    f"this model has {yarn or 'none'}"
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
        return te_spec.layer_key(self.spec == "te", spec, i, meg)

    def layer_entries(self, spec: ModelSpec, i: int) -> list[n.Entry]:
        """Layer i of a per-layer family: (Megatron suffix, how, HF suffixes), in Megatron's module order."""
        if not spec.kv_lora_rank:
            raise UnsupportedModelError(f"{spec.family}: per-layer Megatron keys are mapped for MLA models only")
        out: list[n.Entry] = [(meg, "same", (hf,)) for meg, hf in n.MLA_LAYER.items()
                              if spec.q_lora_rank or meg not in n.MLA_Q_LORA]
        if not spec.q_lora_rank:  # one linear_q_proj, where the query LoRA would be (Megatron's module order)
            out[1:1] = [(meg, "same", (hf,)) for meg, hf in n.MLA_Q_PROJ.items()]
        if not hfl.is_moe_layer(spec, i):
            return out + [
                (n.FC1, "gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
                (n.FC2, "same", ("mlp.down_proj.weight",)),
            ]
        router, gate, up, down = self._hf_expert_names(spec)
        out.append((n.ROUTER, "same", (router,)))
        if spec.routing == "sigmoid_bias":  # DeepSeek's routing bias: HF's e_score_correction_bias
            out.append((n.EXPERT_BIAS, "same", ("mlp.gate.e_score_correction_bias",)))
        out += [(n.EXP_FC1, "experts_gate_up", (gate, up)), (n.EXP_FC2, "experts", (down,))]
        if spec.num_shared_experts:  # all shared experts as one MLP of width S = shared x M, as HF has them
            out += [
                (n.SHARED_FC1, "gate_up", ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")),
                (n.SHARED_FC2, "same", ("mlp.shared_experts.down_proj.weight",)),
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
                shape = (2 * g.shape[0], *g.shape[1:])
                return LazyTensor.computed(tag, shape, g.dtype, lambda: fuse_gate_up(g.read(), u.read()))

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
            for suffix in (meg, te_spec.FUSED_NORMS.get(meg)):
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
        family = FAMILIES[spec.family]
        block, (gate, up, down) = family.hf_expert_block, family.hf_expert_projections
        return (f"{block}.gate.weight", f"{block}.experts.{{e}}.{gate}.weight", f"{block}.experts.{{e}}.{up}.weight",
                f"{block}.experts.{{e}}.{down}.weight")

    def _experts_from_hf(self, hf: Mapping[str, LazyTensor], spec: ModelSpec, get) -> dict[str, LazyTensor]:
        """Router [L, X, E] and experts [L, X, 2M, E] / [L, X, E, M], one (layer, expert) piece at a time."""
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        if FAMILIES[spec.family].hf_experts == "fused_interleaved":
            return self._fused_experts_from_hf(spec, get)
        router, gate, up, down = self._hf_expert_names(spec)
        out: dict[str, LazyTensor] = {}
        name = f"decoder.layers.{n.ROUTER}"
        out[name] = LazyTensor.stacked(name, [get(i, router, (X, E)) for i in range(L)])

        def fc1(i: int, e: int) -> LazyTensor:
            g, u = get(i, gate.format(e=e), (M, E)), get(i, up.format(e=e), (M, E))
            return LazyTensor.computed(f"fc1_{i}_{e}", (2 * M, E), g.dtype, lambda: fuse_gate_up(g.read(), u.read()))

        name = f"decoder.layers.{n.EXP_FC1}"
        out[name] = lazy_grid(name, [[fc1(i, e) for e in range(X)] for i in range(L)], outer_axis=0, inner_axis=1)
        name = f"decoder.layers.{n.EXP_FC2}"
        downs = [[get(i, down.format(e=e), (E, M)) for e in range(X)] for i in range(L)]
        out[name] = lazy_grid(name, downs, outer_axis=0, inner_axis=1)
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

        stacked(n.ROUTER, lambda i: get(i, "mlp.router.weight", (X, E)))
        grid(n.EXP_FC1, (2 * M, E), gate_up)
        grid(n.EXP_FC2, (E, M), down)
        if spec.router_bias:
            stacked(n.ROUTER_BIAS, lambda i: get(i, "mlp.router.bias", (X,)))
        if spec.expert_bias:
            stacked(n.EXP_FC1_BIAS, lambda i: _computed_from(get(i, "mlp.experts.gate_up_proj_bias", (X, 2 * M)),
                                                           lambda b: deinterleave_gate_up(b[:, None, :])[..., 0]))
            stacked(n.EXP_FC2_BIAS, lambda i: get(i, "mlp.experts.down_proj_bias", (X, E)))
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
            if fn is None:
                out[name] = lazy_rename(t, name)
            else:
                out[name] = LazyTensor.computed(name, shape, t.dtype, lambda: fn(t.read()))

        put("mlp.router.weight", layer(n.ROUTER, (X, E), "the router"), (X, E))
        if spec.router_bias:
            put("mlp.router.bias", layer(n.ROUTER_BIAS, (X,), "the router bias"), (X,))
        put("mlp.experts.gate_up_proj", layer(n.EXP_FC1, (X, 2 * M, E), "the experts' fc1"), (X, E, 2 * M),
            interleave_gate_up)
        if spec.expert_bias:
            put("mlp.experts.gate_up_proj_bias", layer(n.EXP_FC1_BIAS, (X, 2 * M), "the experts' fc1 bias"), (X, 2 * M),
                lambda b: interleave_gate_up(b[:, :, None])[:, 0, :])
        put("mlp.experts.down_proj", layer(n.EXP_FC2, (X, E, M), "the experts' fc2"), (X, M, E),
            lambda w: np.ascontiguousarray(np.swapaxes(w, -1, -2)))
        if spec.expert_bias:
            put("mlp.experts.down_proj_bias", layer(n.EXP_FC2_BIAS, (X, E), "the experts' fc2 bias"), (X, E))
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
        """Lazily express Megatron tensors (stacked or per-layer keys) as HF tensors.

        Each HF tensor reads one layer of the source: for a DCP source that is
        one stored chunk. Vocabulary padding is dropped (`spec.vocab_size` rows).
        """
        L, E, F, D = spec.num_layers, spec.emb_dim, spec.mlp_dim, spec.head_dim
        H, G = spec.num_heads, spec.num_kv_heads
        where = "Megatron -> HF"
        out: dict[str, LazyTensor] = {}

        embed = _need(tensors, n.EMBED, where)
        out["model.embed_tokens.weight"] = _unpadded(embed, spec.vocab_size, E, "model.embed_tokens.weight")
        final_norm = _check(_need(tensors, n.FINAL_NORM, where), (E,), "the final norm")
        out["model.norm.weight"] = lazy_rename(final_norm, "model.norm.weight")
        if not spec.tie_word_embeddings:
            if n.OUTPUT not in tensors:
                raise ShapeMismatchError(
                    f"{where}: {n.OUTPUT!r} is missing but the model spec says the output is untied; "
                    "pass tie_word_embeddings=True (Megatron: no --untie-embeddings-and-output-weights)"
                )
            out["lm_head.weight"] = _unpadded(tensors[n.OUTPUT], spec.vocab_size, E, "lm_head.weight")
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
            return split_qkv(required((n.QKV,), i, (self._qkv_rows(spec), E)).read(), H, G, D)

        @shared_result(keep=2)
        def fc1_of(i: int) -> tuple:
            return split_gate_up(required((n.FC1,), i, (2 * F, E)).read())

        for i in range(L):
            qkv = required((n.QKV,), i, (self._qkv_rows(spec), E))

            def part(j: int, i: int = i) -> Any:
                return lambda: qkv_of(i)[j]

            for j, (p, rows) in enumerate((("q", H * D), ("k", G * D), ("v", G * D))):
                name = _hf(i, f"self_attn.{p}_proj.weight")
                out[name] = LazyTensor.computed(name, (rows, E), qkv.dtype, part(j))
            name = _hf(i, "self_attn.o_proj.weight")
            out[name] = lazy_rename(required((n.PROJ,), i, (E, H * D)), name)
            if spec.attention_bias or spec.qkv_bias:
                out.update(self._attention_biases_to_hf(i, spec, required))
            if spec.attention_sinks:
                out[_hf(i, "self_attn.sinks")] = lazy_rename(required((n.SINKS,), i, (H,)), _hf(i, "self_attn.sinks"))

            if spec.num_experts and FAMILIES[spec.family].hf_experts == "fused_interleaved":
                self._check_moe(spec, writing=False)
                out.update(self._fused_experts_to_hf(tensors, spec, i))
            elif spec.num_experts:
                out.update(self._experts_to_hf(tensors, spec, i))
            else:
                out.update(self._dense_mlp_to_hf(i, spec, layer, required, fc1_of))
            out[_hf(i, "input_layernorm.weight")] = lazy_rename(
                required((n.IN_NORM_TE, n.IN_NORM_LOCAL), i, (E,)), _hf(i, "input_layernorm.weight")
            )
            out[_hf(i, "post_attention_layernorm.weight")] = lazy_rename(
                required((n.MLP_NORM_TE, n.MLP_NORM_LOCAL), i, (E,)), _hf(i, "post_attention_layernorm.weight")
            )
            if spec.qk_norm:
                for hf_suffix, meg in (("self_attn.q_norm.weight", n.Q_NORM), ("self_attn.k_norm.weight", n.K_NORM)):
                    out[_hf(i, hf_suffix)] = lazy_rename(required((meg,), i, (D,)), _hf(i, hf_suffix))
        return out


    def _attention_biases_to_hf(self, i: int, spec: ModelSpec, required) -> dict[str, LazyTensor]:
        """Layer i's q/k/v biases (from the fused, per-group `linear_qkv.bias`) and o_proj bias (gpt-oss's;
        qwen2.5 has none)."""
        H, G, D, E = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.emb_dim
        fused = required((n.QKV_BIAS,), i, (self._qkv_rows(spec),))
        parts = functools.lru_cache(maxsize=1)(lambda: [p[:, 0] for p in split_qkv(fused.read()[:, None], H, G, D)])
        out = {}
        for j, (p, rows) in enumerate((("q", H * D), ("k", G * D), ("v", G * D))):
            name = _hf(i, f"self_attn.{p}_proj.bias")
            out[name] = LazyTensor.computed(name, (rows,), fused.dtype, lambda j=j: parts()[j])
        if not spec.attention_bias:
            return out
        name = _hf(i, "self_attn.o_proj.bias")
        out[name] = lazy_rename(required((n.PROJ_BIAS,), i, (E,)), name)
        return out

    @staticmethod
    def _dense_mlp_to_hf(i: int, spec: ModelSpec, layer, required, fc1_of) -> dict[str, LazyTensor]:
        """Layer i's gate/up (from the fused fc1, or its _w/_v halves) and down projections."""
        E, F = spec.emb_dim, spec.mlp_dim
        gate, up, down = _hf(i, "mlp.gate_proj.weight"), _hf(i, "mlp.up_proj.weight"), _hf(i, "mlp.down_proj.weight")
        fc1 = layer((n.FC1,), i, (2 * F, E))
        if fc1 is not None:
            out = {
                gate: LazyTensor.computed(gate, (F, E), fc1.dtype, lambda: fc1_of(i)[0]),
                up: LazyTensor.computed(up, (F, E), fc1.dtype, lambda: fc1_of(i)[1]),
            }
        else:  # singleton_local_shards checkpoints split fc1 into weight_w (gate) / weight_v (up)
            out = {gate: lazy_rename(required((n.FC1 + "_w",), i, (F, E)), gate),
                   up: lazy_rename(required((n.FC1 + "_v",), i, (F, E)), up)}
        out[down] = lazy_rename(required((n.FC2,), i, (E, F)), down)
        return out

    def _experts_to_hf(self, tensors: Mapping[str, LazyTensor], spec: ModelSpec, i: int) -> dict[str, LazyTensor]:
        """Layer i's router and experts as HF tensors; each expert reads its own (layer, expert) slice."""
        self._check_moe(spec, writing=False)
        L, E, X, M = spec.num_layers, spec.emb_dim, spec.num_experts, spec.moe_mlp_dim
        router, gate, up, down = self._hf_expert_names(spec)
        where = "Megatron -> HF"
        r = _check(_need(tensors, f"decoder.layers.{n.ROUTER}", where), (L, X, E), "the router")
        fc1 = _check(_need(tensors, f"decoder.layers.{n.EXP_FC1}", where), (L, X, 2 * M, E), "the experts' fc1")
        fc2 = _check(_need(tensors, f"decoder.layers.{n.EXP_FC2}", where), (L, X, E, M), "the experts' fc2")
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



def deinterleave_gate_up(w: np.ndarray) -> np.ndarray:
    """gpt-oss `gate_up_proj` `[..., E, 2M]` (gate at even columns, up at odd) -> Megatron `[..., 2M, E]`.

    The Megatron rows are [gate; up].
    """
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

