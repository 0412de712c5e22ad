"""MaxText's parameter tables: each :class:`Param` is one MaxText path and its HF counterpart, with the
kernel's input/output dimensions in spec symbols and which transform applies (norm offsets, the query scale,
rotary order, fused and regrouped kernels).

:func:`layer_params` builds a layer's table per kind from the spec (MHA or MLA attention, dense or MoE MLP,
Gated DeltaNet, Llama or Gemma norms); :data:`GLOBAL_PARAMS` are the embedding, final norm and output.
How the layers are stacked is :mod:`maxckpt.formats.maxtext.scans`; the walk is
:class:`maxckpt.formats.maxtext.layout.MaxTextLayout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from maxckpt.families import FAMILIES, Family
from maxckpt.formats.hf import hybrid
from maxckpt.formats.hf import layout as hfl
from maxckpt.layouts import geometry
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec

PARAMS_PREFIX = "params/params/"
AUX_PREFIX = "nnx_aux/model/"  # NNX model variables that are not params (DeepSeek's routing bias)


@dataclass(frozen=True)
class Param:
    """One MaxText parameter and its HF counterpart.

    `in_dims`/`out_dims` are the kernel's input and output dimensions as spec
    symbols; an empty `in_dims` marks a vector/table copied as is (`flat`:
    HF holds it flattened, e.g. a per-head bias).
    """

    maxtext: str
    hf: str
    in_dims: tuple[str, ...]
    out_dims: tuple[str, ...]
    rotary: bool = False  # q/k per-head features: reordered when MaxText is interleaved
    query: bool = False  # carries MaxText's query scaling (see query_factor)
    when: str | None = None  # present only when this spec condition holds (see PRESENT)
    norm: bool = False  # a norm scale: HF weight = scale - spec.norm_offset
    embedding: bool = False  # the token table: MaxText's may carry sqrt(emb_dim)
    expert: bool = False  # MaxText `[X, ...]`, one HF tensor per expert (`{e}` in `hf`)
    part: tuple[int, int] | None = None  # (k, n): slot k of n interleaved on the last axis of a fused HF tensor
    flat: bool = False  # HF holds the vector flattened
    aux: bool = False  # stored under nnx_aux/model/ with the layer axis first (DeepSeek's routing bias)
    conv: bool = False  # a depthwise conv kernel: MaxText [kernel, 1, channels], HF Conv1d [channels, 1, kernel]
    # "qkvz" / "ba": one MaxText kernel packed per key-head group that HF splits into the `|`-separated tensors
    # of `hf` (qwen3.5's Gated DeltaNet projections; formats/hf/hybrid.py: split_grouped).
    regroup: str | None = None
    concat: bool = False  # `part` slots are concatenated on the last axis (llama4's gate_up_proj), not interleaved
    # An [X, a, b] tensor HF holds as [X, b, a]; with `part`, HF concatenates the parts on axis 1 instead of
    # interleaving them on the last (gemma4's packed experts: gate_up_proj [X, 2M, E] from wi_0 / wi_1 [X, E, M]).
    transposed: bool = False

    def maxtext_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        shape = hfl.shape_of(self.in_dims + self.out_dims, spec)
        return (spec.num_experts, *shape) if self.expert else shape

    def hf_shape(self, spec: ModelSpec) -> tuple[int, ...]:
        if self.conv:
            return hfl.shape_of(self.out_dims, spec)[::-1]
        if not self.in_dims:
            shape = hfl.shape_of(self.out_dims, spec)
            if self.transposed:
                shape = (*shape[:-2], shape[-1], shape[-2])
                if self.part is not None:
                    shape = (shape[0], shape[1] * self.part[1], *shape[2:])
                return shape
            if self.part is not None:
                shape = (*shape[:-1], shape[-1] * self.part[1])
            return (math.prod(shape),) if self.flat else shape
        return (math.prod(hfl.shape_of(self.out_dims, spec)), math.prod(hfl.shape_of(self.in_dims, spec)))

    def present(self, spec: ModelSpec) -> bool:
        return self.when is None or PRESENT[self.when](spec)

    def hf_names(self, spec: ModelSpec, layer: int | None) -> list[str]:
        """The HF tensor names (one per expert for expert params) of this param in HF layer `layer`."""
        names = [self.hf.format(e=e) for e in range(spec.num_experts)] if self.expert else self.hf.split("|")
        return names if layer is None else [hfl.layer_name(layer, n) for n in names]

    def hf_slot_shape(self, spec: ModelSpec, slot: int) -> tuple[int, ...]:
        """The shape of HF tensor `slot` of this param (a regrouped param's parts differ; else hf_shape)."""
        if self.regroup is None:
            return self.hf_shape(spec)
        return hfl.shape_of(hybrid.SPLIT_PROJECTIONS[self.hf.split("|")[slot]], spec)

    def to_hf_slot(self, x: np.ndarray, spec: ModelSpec, model_dtype: np.dtype | None, slot: int) -> np.ndarray:
        """HF tensor `slot` of a regrouped param from its MaxText kernel."""
        return hybrid.split_grouped(self.regroup, self.to_hf(x, spec, model_dtype), spec)[slot]

    def from_hf_slots(self, parts: list[np.ndarray], spec: ModelSpec, model_dtype: np.dtype | None) -> np.ndarray:
        """A regrouped param's MaxText kernel from its HF tensors."""
        return self.from_hf(hybrid.join_split(self.regroup, parts, spec), spec, model_dtype)

    # ------------------------------------------------------------ transforms

    def to_hf(self, x: np.ndarray, spec: ModelSpec, model_dtype: np.dtype | None = None) -> np.ndarray:
        """One MaxText array (one expert's, for expert params) -> its HF array (a part, for fused ones),
        in :meth:`hf_dtype` (computed in float32 when that is wider than the stored dtype)."""
        out = self.hf_dtype(spec, x.dtype, model_dtype)
        y = self._to_hf(x.astype(np.float32) if self.widens(spec, x.dtype) else x, spec)
        return y if y.dtype == out else y.astype(out)

    def _to_hf(self, x: np.ndarray, spec: ModelSpec) -> np.ndarray:
        if self.rotary and spec.maxtext_rotary == "interleaved":
            x = tf.permute_last(x, tf.half_from_interleaved(spec.head_dim))
        if self.query:
            x = tf.scale(x, query_factor(spec))
        if self.norm:
            x = tf.shift(x, spec.norm_offset)
        if self.embedding and spec.maxtext_embedding_scaled:
            x = tf.unscale(x, math.sqrt(spec.emb_dim))
        if self.conv:
            return np.ascontiguousarray(x.transpose(2, 1, 0))
        if self.in_dims:
            return tf.kernel_to_torch(x, len(self.in_dims))
        if self.transposed:
            return np.ascontiguousarray(np.swapaxes(x, -1, -2))
        return np.ascontiguousarray(x).reshape(-1) if self.flat else x

    def widens(self, spec: ModelSpec, dtype: np.dtype) -> bool:
        """This param is transformed by a factor or offset that `dtype`, narrower than float32, would round:
        Gemma's norm offset, an embedding or query scale that is not a power of two (sqrt(128)), or in
        float16 any scale."""
        if not _is_narrow(dtype):
            return False
        # A power of two is exact in bfloat16 (float32's exponent range), not in float16, whose small
        # exponent range turns a division by 16 into subnormals that drop bits.
        rounds = (lambda f: f != 1.0) if np.dtype(dtype) == np.float16 else (lambda f: not _power_of_two(f))
        offset = self.norm and bool(spec.norm_offset)
        table = self.embedding and spec.maxtext_embedding_scaled and rounds(math.sqrt(spec.emb_dim))
        query = self.query and rounds(query_factor(spec))
        return offset or table or query

    def maxtext_dtype(self, spec: ModelSpec, hf_dtype: np.dtype, model_dtype: np.dtype | None = None) -> np.dtype:
        """MaxText keeps a param that :meth:`widens` in float32, so no bit of the HF value is lost; one that
        came from such a float32 MaxText param (the HF tensor is float32 while the model is narrower) goes
        back to the model's dtype, exactly."""
        if self.widens(spec, hf_dtype):
            return np.dtype(np.float32)
        return _narrowed(self, spec, hf_dtype, model_dtype) or np.dtype(hf_dtype)

    def hf_dtype(self, spec: ModelSpec, maxtext_dtype: np.dtype, model_dtype: np.dtype | None = None) -> np.dtype:
        """The mirror of :meth:`maxtext_dtype` for MaxText -> HF: a narrow param that widens goes out in
        float32; a float32 one that MaxText widened from the model's narrower dtype goes back to it."""
        if self.widens(spec, maxtext_dtype):
            return np.dtype(np.float32)
        return _narrowed(self, spec, maxtext_dtype, model_dtype) or np.dtype(maxtext_dtype)

    def from_hf(self, w: np.ndarray, spec: ModelSpec, model_dtype: np.dtype | None = None) -> np.ndarray:
        """The inverse of :meth:`to_hf` (for a part: `w` is the fused HF array, this slot is taken)."""
        out = self.maxtext_dtype(spec, w.dtype, model_dtype)
        x = self._from_hf(w.astype(np.float32) if self.widens(spec, w.dtype) else w, spec)
        return x if x.dtype == out else x.astype(out)

    def _from_hf(self, w: np.ndarray, spec: ModelSpec) -> np.ndarray:
        x = w
        if self.transposed:
            if self.part is not None:
                k, n = self.part
                width = x.shape[1] // n
                x = x[:, k * width : (k + 1) * width]
            x = np.ascontiguousarray(np.swapaxes(x, -1, -2))
        elif self.part is not None and self.concat:
            width = x.shape[-1] // self.part[1]
            x = np.ascontiguousarray(x[..., self.part[0] * width : (self.part[0] + 1) * width])
        elif self.part is not None:
            x = np.ascontiguousarray(x[..., self.part[0] :: self.part[1]])
        if self.conv:
            x = np.ascontiguousarray(w.transpose(2, 1, 0))
        if self.in_dims:
            x = tf.torch_to_kernel(w, hfl.shape_of(self.in_dims, spec), hfl.shape_of(self.out_dims, spec))
        elif self.flat:
            x = x.reshape(hfl.shape_of(self.out_dims, spec))
        if self.embedding and spec.maxtext_embedding_scaled:
            x = tf.scale(x, math.sqrt(spec.emb_dim))
        if self.norm:
            x = tf.unshift(x, spec.norm_offset)
        if self.query:
            x = tf.unscale(x, query_factor(spec))
        if self.rotary and spec.maxtext_rotary == "interleaved":
            x = tf.permute_last(x, tf.interleaved_from_half(spec.head_dim))
        return x


def _power_of_two(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5


def _is_narrow(dtype: np.dtype | None) -> bool:
    return dtype is not None and tf.is_float(dtype) and np.dtype(dtype).itemsize < 4


def _narrowed(p: Param, spec: ModelSpec, dtype: np.dtype, model_dtype: np.dtype | None) -> np.dtype | None:
    """The model's narrow dtype when `dtype` is the float32 that `p` was widened to from it, else None."""
    if np.dtype(dtype) == np.float32 and _is_narrow(model_dtype) and p.widens(spec, model_dtype):
        return np.dtype(model_dtype)
    return None


def model_dtype(tensors: Mapping[str, Any]) -> np.dtype | None:
    """The floating dtype holding most of the model's elements: the one widened params came from."""
    counts: dict[np.dtype, int] = {}
    for t in tensors.values():
        if tf.is_float(t.dtype):
            counts[np.dtype(t.dtype)] = counts.get(np.dtype(t.dtype), 0) + math.prod(t.shape)
    return max(counts, key=counts.get) if counts else None


PRESENT = {
    "qk_norm": lambda s: s.qk_norm,
    "untied": lambda s: not s.tie_word_embeddings,
    "attention_bias": lambda s: s.attention_bias,
    "qkv_bias": lambda s: s.attention_bias or s.qkv_bias,  # q/k/v biases: gpt-oss's (with out/bias) or qwen2.5's
    "sinks": lambda s: s.attention_sinks,
    "router_bias": lambda s: s.router_bias,
    "expert_bias": lambda s: s.expert_bias,
    "shared_experts": lambda s: s.num_shared_experts > 0,
    "routing_bias": lambda s: s.routing == "sigmoid_bias",
    "indexer": lambda s: s.indexer_n_heads > 0,
    "sandwich": lambda s: s.sandwich_norms,
    "shared_expert_gate": lambda s: s.num_shared_experts > 0 and s.shared_expert_gate,
    "per_layer_inputs": lambda s: s.per_layer_input_dim > 0,
}


def query_factor(spec: ModelSpec) -> float:
    """HF q_proj = MaxText query kernel * this factor.

    HF scales scores by query_pre_attn_scalar**-0.5 (head_dim**-0.5 unless a
    Gemma config says otherwise). MaxText either folded that scale into the
    kernel (llama, mistral, mixtral, gemma2: factor sqrt(scalar)) or scales by
    head_dim**-0.5 at runtime (qwen3, gemma3, gpt-oss: factor
    sqrt(scalar / head_dim), 1 when they agree).
    """
    scalar = float(spec.query_pre_attn_scalar or spec.head_dim)
    return math.sqrt(scalar) if spec.maxtext_query_scale else math.sqrt(scalar / spec.head_dim)


def float32_rounding_note(spec: ModelSpec) -> str | None:
    """What a float32 conversion between MaxText and HF rounds for this model, or None when nothing does.

    MaxText folds the query scale into the query kernel (llama-style families) and stores Gemma's table times
    sqrt(emb); HF stores neither. A factor that is not a power of two (sqrt(128), sqrt(2304) = 48) rounds in
    float32, and no float32 value can always be chosen to come back exactly: measured on 1M normal values,
    85-96% of such a tensor's values survive a MaxText <-> HF round trip bit for bit, the rest are 1 ulp off.
    A bfloat16 model loses nothing (those tensors are widened to float32, :meth:`Param.widens`).
    """
    parts = []
    factor = query_factor(spec)
    if FAMILIES[spec.family].attention != "mla" and factor != 1.0 and not _power_of_two(factor):
        parts.append(f"the query kernels by {factor:.6g}")
    if spec.maxtext_embedding_scaled and not _power_of_two(math.sqrt(spec.emb_dim)):
        parts.append(f"the embedding table by sqrt({spec.emb_dim}) = {math.sqrt(spec.emb_dim):.6g}")
    if not parts:
        return None
    return (f"float32: MaxText and HF differ in {' and '.join(parts)}, which rounds the last bit of some values "
            "(a round trip gives back 85-96% of them exactly, the rest 1 ulp off; a bfloat16 model is exact)")


def attention_params(spec: ModelSpec, module: str) -> list[Param]:
    """One layer's attention params under MaxText module `module` (self_attention, GptOssAttention, ...)."""
    m = module
    if spec.kv_lora_rank:  # MLA: every kernel is an ordinary [in..., out...] DenseGeneral
        query = [  # a query LoRA, or (q_lora_rank 0, deepseek2-16b) one query kernel
            Param(f"{m}/wq_a/kernel", "self_attn.q_a_proj.weight", ("E",), ("QL",)),
            Param(f"{m}/q_norm/scale", "self_attn.q_a_layernorm.weight", (), ("QL",), norm=True),
            Param(f"{m}/wq_b/kernel", "self_attn.q_b_proj.weight", ("QL",), ("Hq", "QK")),
        ] if spec.q_lora_rank else [Param(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "QK"))]
        indexer = [  # DeepSeek-V3.2's sparse-attention indexer (its k_norm is a LayerNorm: scale and bias)
            Param(f"{m}/indexer/wq_b/kernel", "self_attn.indexer.wq_b.weight", ("QL",), ("IH", "ID"), when="indexer"),
            Param(f"{m}/indexer/wk/kernel", "self_attn.indexer.wk.weight", ("E",), ("ID",), when="indexer"),
            Param(f"{m}/indexer/k_norm/scale", "self_attn.indexer.k_norm.weight", (), ("ID",), when="indexer"),
            Param(f"{m}/indexer/k_norm/bias", "self_attn.indexer.k_norm.bias", (), ("ID",), when="indexer"),
            Param(f"{m}/indexer/weights_proj/kernel", "self_attn.indexer.weights_proj.weight", ("E",), ("IH",),
                  when="indexer"),
        ]
        return [
            *query,
            *indexer,
            Param(f"{m}/wkv_a/kernel", "self_attn.kv_a_proj_with_mqa.weight", ("E",), ("KVA",)),
            Param(f"{m}/kv_norm/scale", "self_attn.kv_a_layernorm.weight", (), ("KL",), norm=True),
            Param(f"{m}/wkv_b/kernel", "self_attn.kv_b_proj.weight", ("KL",), ("Hq", "KVB")),
            Param(f"{m}/out/kernel", "self_attn.o_proj.weight", ("Hq", "VD"), ("E",)),
        ]
    if spec.attention_output_gate:  # [query | gate] per head: no rotary reordering ("half" families only)
        query = Param(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "2D"), query=True)
    else:
        query = Param(f"{m}/query/kernel", "self_attn.q_proj.weight", ("E",), ("Hq", "D"), rotary=True, query=True)
    return [
        query,
        Param(f"{m}/key/kernel", "self_attn.k_proj.weight", ("E",), ("Hkv", "D"), rotary=True),
        Param(f"{m}/value/kernel", "self_attn.v_proj.weight", ("E",), ("Hkv", "D")),
        # a gated attention's output is flattened and gated before the projection: [Hq*D, E]
        Param(f"{m}/out/kernel", "self_attn.o_proj.weight", ("Hq*D",) if spec.attention_output_gate else ("Hq", "D"),
              ("E",)),
        Param(
            f"{m}/query/bias",
            "self_attn.q_proj.bias",
            (),
            ("Hq", "D"),
            rotary=True,
            query=True,
            flat=True,
            when="qkv_bias",
        ),
        Param(f"{m}/key/bias", "self_attn.k_proj.bias", (), ("Hkv", "D"), rotary=True, flat=True, when="qkv_bias"),
        Param(f"{m}/value/bias", "self_attn.v_proj.bias", (), ("Hkv", "D"), flat=True, when="qkv_bias"),
        Param(f"{m}/out/bias", "self_attn.o_proj.bias", (), ("E",), when="attention_bias"),
        *qk_norm_params(spec, m),
        Param(f"{m}/sinks", "self_attn.sinks", (), ("Hq",), when="sinks"),
    ]


def qk_norm_params(spec: ModelSpec, m: str) -> list[Param]:
    """The q/k norm scales: per head feature [D] (reordered with the rotary features), or over the whole
    projection [H*D] (olmo3's, in HF's order already: no rotary reordering applies to a family without it)."""
    if FAMILIES[spec.family].qk_norm_across_heads:
        return [Param(f"{m}/query_norm/scale", "self_attn.q_norm.weight", (), ("Hq*D",), norm=True, when="qk_norm"),
                Param(f"{m}/key_norm/scale", "self_attn.k_norm.weight", (), ("Hkv*D",), norm=True, when="qk_norm")]
    return [
        Param(f"{m}/query_norm/scale", "self_attn.q_norm.weight", (), ("D",), rotary=True, norm=True, when="qk_norm"),
        Param(f"{m}/key_norm/scale", "self_attn.k_norm.weight", (), ("D",), rotary=True, norm=True, when="qk_norm"),
    ]


def dense_mlp_params(module: str = "mlp", hf_block: str = "mlp") -> list[Param]:
    return [
        Param(f"{module}/wi_0/kernel", f"{hf_block}.gate_proj.weight", ("E",), ("F",)),
        Param(f"{module}/wi_1/kernel", f"{hf_block}.up_proj.weight", ("E",), ("F",)),
        Param(f"{module}/wo/kernel", f"{hf_block}.down_proj.weight", ("F",), ("E",)),
    ]


def moe_params(spec: ModelSpec, family: Family) -> list[Param]:
    """The router, routed experts (and shared experts, routing bias) of one MoE layer."""
    m = family.maxtext_moe
    # gpt-oss: experts not transposed, gate/up interleaved in one HF tensor
    if family.hf_experts == "fused_interleaved":
        return [
            Param(f"{m}/gate/kernel", "mlp.router.weight", ("E",), ("X",)),
            Param(f"{m}/gate/bias", "mlp.router.bias", (), ("X",), when="router_bias"),
            Param(f"{m}/wi_0", "mlp.experts.gate_up_proj", (), ("X", "E", "M"), part=(0, 2)),
            Param(f"{m}/wi_1", "mlp.experts.gate_up_proj", (), ("X", "E", "M"), part=(1, 2)),
            Param(f"{m}/wi_0_bias", "mlp.experts.gate_up_proj_bias", (), ("X", "M"), part=(0, 2), when="expert_bias"),
            Param(f"{m}/wi_1_bias", "mlp.experts.gate_up_proj_bias", (), ("X", "M"), part=(1, 2), when="expert_bias"),
            Param(f"{m}/wo", "mlp.experts.down_proj", (), ("X", "M", "E")),
            Param(f"{m}/wo_bias", "mlp.experts.down_proj_bias", (), ("X", "E"), when="expert_bias"),
        ]
    block, names = family.hf_expert_block, family.hf_expert_projections
    default_shared = m.rsplit("/", 1)[0] + "/shared_experts" if "/" in m else "shared_experts"
    shared = family.maxtext_shared_experts or default_shared
    hf_shared = f"{block}.{family.hf_shared_experts}"
    shared_params = [
        Param(f"{shared}/wi_0/kernel", f"{hf_shared}.gate_proj.weight", ("E",), ("S",), when="shared_experts"),
        Param(f"{shared}/wi_1/kernel", f"{hf_shared}.up_proj.weight", ("E",), ("S",), when="shared_experts"),
        Param(f"{shared}/wo/kernel", f"{hf_shared}.down_proj.weight", ("S",), ("E",), when="shared_experts"),
    ]
    if family.hf_experts == "fused_concat":  # llama4: [X, E, 2M] gate then up, [X, M, E]; MaxText's layout as is
        return [
            Param(f"{m}/gate/kernel", f"{block}.router.weight", ("E",), ("X",)),
            Param(f"{m}/wi_0", f"{block}.experts.gate_up_proj", (), ("X", "E", "M"), part=(0, 2), concat=True),
            Param(f"{m}/wi_1", f"{block}.experts.gate_up_proj", (), ("X", "E", "M"), part=(1, 2), concat=True),
            Param(f"{m}/wo", f"{block}.experts.down_proj", (), ("X", "M", "E")),
            *shared_params,
        ]
    return [
        Param(f"{m}/gate/kernel", f"{block}.gate.weight", ("E",), ("X",)),
        Param(f"{m}/gate/bias", f"{block}.gate.e_score_correction_bias", (), ("X",), aux=True, when="routing_bias"),
        Param(f"{m}/wi_0", f"{block}.experts.{{e}}.{names[0]}.weight", ("E",), ("M",), expert=True),
        Param(f"{m}/wi_1", f"{block}.experts.{{e}}.{names[1]}.weight", ("E",), ("M",), expert=True),
        Param(f"{m}/wo", f"{block}.experts.{{e}}.{names[2]}.weight", ("M",), ("E",), expert=True),
        Param(f"{shared}/wi_0/kernel", f"{hf_shared}.gate_proj.weight", ("E",), ("S",), when="shared_experts"),
        Param(f"{shared}/wi_1/kernel", f"{hf_shared}.up_proj.weight", ("E",), ("S",), when="shared_experts"),
        Param(f"{shared}/wo/kernel", f"{hf_shared}.down_proj.weight", ("S",), ("E",), when="shared_experts"),
        Param(f"{shared}_gate/kernel", f"{hf_shared}_gate.weight", ("E",), ("1",), when="shared_expert_gate"),
    ]


def linear_attention_params(module: str, split: bool = False) -> list[Param]:
    """One Gated DeltaNet layer's params under MaxText module `module` (formats/hf/hybrid.py): HF packs the
    input projections alike, or (`split`, qwen3.5) holds each head-major part apart."""
    m = module
    qkvz, ba = "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"
    if split:
        qkvz, ba = "linear_attn.in_proj_qkv.weight|linear_attn.in_proj_z.weight", (
            "linear_attn.in_proj_b.weight|linear_attn.in_proj_a.weight")
    return [
        Param(f"{m}/in_proj_qkvz/kernel", qkvz, ("E",), ("GQKVZ",), regroup="qkvz" if split else None),
        Param(f"{m}/in_proj_ba/kernel", ba, ("E",), ("GBA",), regroup="ba" if split else None),
        Param(f"{m}/conv1d/kernel", "linear_attn.conv1d.weight", (), ("GCK", "1", "GC"), conv=True),
        Param(f"{m}/dt_bias", "linear_attn.dt_bias", (), ("GVH",)),
        Param(f"{m}/A_log", "linear_attn.A_log", (), ("GVH",)),
        Param(f"{m}/norm/rms_norm/scale", "linear_attn.norm.weight", (), ("GVD",)),  # a plain RMSNorm: no offset
        Param(f"{m}/out_proj/kernel", "linear_attn.out_proj.weight", ("GV",), ("E",)),
    ]


def norm_params(spec: ModelSpec, suffix: str = "") -> list[Param]:
    if spec.sandwich_norms:  # Gemma: norms around attention and around the MLP
        return [
            Param(f"pre_self_attention_norm{suffix}/scale", "input_layernorm.weight", (), ("E",), norm=True),
            Param(f"post_self_attention_norm{suffix}/scale", "post_attention_layernorm.weight", (), ("E",), norm=True),
            Param(f"pre_ffw_norm{suffix}/scale", "pre_feedforward_layernorm.weight", (), ("E",), norm=True),
            Param(f"post_ffw_norm{suffix}/scale", "post_feedforward_layernorm.weight", (), ("E",), norm=True),
        ]
    family = FAMILIES[spec.family]
    (pre, post), (hf_pre, hf_post) = family.maxtext_layer_norms, family.hf_layer_norms
    return [
        Param(f"{pre}/scale", f"{hf_pre}.weight", (), ("E",), norm=True),
        Param(f"{post}/scale", f"{hf_post}.weight", (), ("E",), norm=True),
    ]


def layer_params(spec: ModelSpec, moe: bool, suffix: str = "", linear: bool = False) -> tuple[Param, ...]:
    """Every param of one MaxText layer (gemma2's half-layers carry `suffix` _local/_global; `linear`: a
    Gated DeltaNet layer of a hybrid)."""
    family = FAMILIES[spec.family]
    attention = family.maxtext_attention + suffix
    if linear:
        mixer = linear_attention_params(family.maxtext_linear_attention, family.hf_gdn_projections == "split")
    else:
        mixer = attention_params(spec, attention)
    mlp = moe_params(spec, family) if moe else dense_mlp_params("mlp" + suffix, family.hf_mlp_block)
    return tuple(p for p in (*mixer, *mlp, *norm_params(spec, suffix)) if p.present(spec))


# The dense Llama-family table (q/k norms included; callers check `present`), for the demo, the
# benchmark and tests that build MaxText trees by hand: paths under decoder/layers or decoder/layers_{i}.
LAYER_PARAMS: tuple[Param, ...] = (
    *[
        p
        for p in attention_params(ModelSpec("llama2", 1, 1, 1, 1, 1, 1, 1, qk_norm=True), "self_attention")
        if p.when in (None, "qk_norm")
    ],
    *dense_mlp_params(),
    *norm_params(ModelSpec("llama2", 1, 1, 1, 1, 1, 1, 1)),
)

GLOBAL_PARAMS: tuple[Param, ...] = (
    Param("token_embedder/embedding", hfl.EMBED, (), ("V", "E"), embedding=True),
    Param("decoder/decoder_norm/scale", hfl.FINAL_NORM, (), ("E",), norm=True),
    Param("decoder/logits_dense/kernel", hfl.LM_HEAD, ("E",), ("V",), when="untied"),
    # gemma4 e2b/e4b's per-layer input embedder (its table is scaled at runtime, in MaxText and HF alike)
    Param("decoder/per_layer_embedder/embed_tokens_per_layer", "model.embed_tokens_per_layer.weight", (), ("VP", "L*P"),
          when="per_layer_inputs"),
    Param("decoder/per_layer_embedder/per_layer_model_projection/kernel", "model.per_layer_model_projection.weight",
          ("E",), ("L*P",), when="per_layer_inputs"),
    Param("decoder/per_layer_embedder/per_layer_projection_norm/scale", "model.per_layer_projection_norm.weight", (),
          ("P",), norm=True, when="per_layer_inputs"),
)


def local_global_layer_params(spec: ModelSpec, i: int) -> tuple[Param, ...]:
    """Layer i's params of a local/global model (gemma4), sized by its own spec: the common table, less the value
    kernel where the key is the value, plus the layer scalar."""
    sizes = geometry.layer_spec(spec, i)
    params = [p for p in layer_params(sizes, False)
              if not (geometry.value_is_key(spec, i) and p.hf == "self_attn.v_proj.weight")]
    if geometry.is_kv_shared(spec, i):  # e2b/e4b: keys and values from the donor layer
        dropped = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")
        params = [p for p in params if p.hf not in dropped]
    if spec.per_layer_input_dim:
        params += [
            Param("per_layer_input_gate/kernel", "per_layer_input_gate.weight", ("E",), ("P",)),
            Param("per_layer_projection/kernel", "per_layer_projection.weight", ("P",), ("E",)),
            Param("post_per_layer_input_norm/scale", "post_per_layer_input_norm.weight", (), ("E",), norm=True),
        ]
    if spec.num_experts:  # gemma4's MoE: the dense MLP is `moe_block/shared_experts`, beside the experts
        params = [p for p in params if not p.maxtext.startswith("mlp/")] + packed_parallel_moe_params(spec)
    if spec.layer_scalar:
        params.append(Param("layer_scalar", "layer_scalar", (), ("1",)))
    return tuple(params)


def packed_parallel_moe_params(spec: ModelSpec) -> list[Param]:
    """Gemma4MoE's params (families/gemma4_moe.py): the dense MLP, the router and the packed experts."""
    m = FAMILIES[spec.family].maxtext_moe  # mlp/moe_block/MoeBlock_0
    dense = m.rsplit("/", 1)[0] + "/shared_experts"
    return [
        Param(f"{dense}/wi_0/kernel", "mlp.gate_proj.weight", ("E",), ("F",)),
        Param(f"{dense}/wi_1/kernel", "mlp.up_proj.weight", ("E",), ("F",)),
        Param(f"{dense}/wo/kernel", "mlp.down_proj.weight", ("F",), ("E",)),
        Param(f"{m}/gate/kernel", "router.proj.weight", ("E",), ("X",)),
        Param("mlp/pre_forward_scale_2", "router.scale", (), ("E",)),
        Param(f"{m}/per_expert_scale", "router.per_expert_scale", (), ("X",)),
        Param(f"{m}/wi_0", "experts.gate_up_proj", (), ("X", "E", "M"), part=(0, 2), transposed=True),
        Param(f"{m}/wi_1", "experts.gate_up_proj", (), ("X", "E", "M"), part=(1, 2), transposed=True),
        Param(f"{m}/wo", "experts.down_proj", (), ("X", "M", "E"), transposed=True),
        Param("mlp/post_feedforward_layernorm_1/scale", "post_feedforward_layernorm_1.weight", (), ("E",), norm=True),
        Param("mlp/post_feedforward_layernorm_2/scale", "post_feedforward_layernorm_2.weight", (), ("E",), norm=True),
        Param("mlp/pre_feedforward_layernorm_2/scale", "pre_feedforward_layernorm_2.weight", (), ("E",), norm=True),
    ]
