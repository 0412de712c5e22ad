"""The MaxText layout (every family of maxckpt.families), scanned or not, mapped to and from HF.

The mapping is tables of :class:`Param` (MaxText path, HF name, the kernel's
input/output dimensions in spec symbols, and which transform applies),
built per layer kind from the spec (:func:`layer_params`: MHA or MLA
attention, dense or MoE MLP, Llama or Gemma norms), plus
:data:`GLOBAL_PARAMS`. Family-dependent steps come from the
:class:`ModelSpec`: the rotary feature order of q/k (`maxtext_rotary`),
where the query scale lives (`maxtext_query_scale`, `query_pre_attn_scalar`),
Gemma's norm offset and embedding scale.

How a family's layers are stored is :func:`layer_stacks` (Family.maxtext_scan):
one `decoder/layers` stack; gemma2's (local, global) pairs in one layer;
gemma3's and gpt-oss's blocks (`decoder/layers/layers_{j}`, plus unstacked
`decoder/layers_remainder/layers_{r}`); deepseek's `dense_layers` and
`moe_layers`. Scanned tensors stack layers on `param_scan_axis` (1 in
MaxText, for every layer tensor, experts included: `[X, L, ...]`; DeepSeek's
routing bias in `nnx_aux` is `[L, X]`); unscanned ones name them
`decoder/layers_{i}/...` (`dense_layers_{i}`, `moe_layers_{i}`). Training
checkpoints nest params under `params/params/`, param-only ones do not; both
are read, and written checkpoints use `params/params/` (what MaxText's
`load_parameters_path` reads).

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

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.formats.hf import hybrid
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.maxtext import local_global
from maxckpt.layouts import geometry
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.families.registry import refine_tree_family
from maxckpt.families import FAMILIES, Family
from maxckpt.tensors import LazyTensor, TensorInfo

PARAMS_PREFIX = "params/params/"
AUX_PREFIX = "nnx_aux/model/"  # NNX model variables that are not params (DeepSeek's routing bias)
_LAYER_RE = re.compile(r"^decoder/layers_(\d+)/(.+)$")
_SKIPPED_ROOTS = ("opt_state/", "nnx_aux/", "step")


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


@dataclass(frozen=True)
class Stack:
    """A group of MaxText layers with one param table, and the HF layers they are.

    Scanned (`indices` None): each param is one tensor `{prefix}/{param}` with
    the layers stacked on the scan axis, position k being HF layer `hf_layers[k]`.
    Unscanned: `prefix` holds `{i}`, and HF layer `hf_layers[k]` is
    `{prefix.format(i=indices[k])}/{param}`.
    """

    params: tuple[Param, ...]
    hf_layers: tuple[int, ...]
    prefix: str
    indices: tuple[int, ...] | None = None
    # Scanned on two axes (a hybrid's local_layers): [scan axis] the block, [scan axis + 1] the position in it,
    # `inner` positions per block; hf_layers are block-major. 0: one layer axis.
    inner: int = 0
    # The spec sizing this stack's tensors when it differs from the model's (gemma4's full-attention layers).
    spec: ModelSpec | None = None

    def sized(self, spec: ModelSpec) -> ModelSpec:
        """The spec this stack's params are shaped and transformed by."""
        return self.spec or spec

    def stacked_shape(self, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
        """The stored shape of a scanned param whose one-layer shape is `shape`, layers stacked at `axis`."""
        if not self.inner:
            return tf.insert_axis(shape, axis, len(self.hf_layers))
        return tf.insert_axis(tf.insert_axis(shape, axis, len(self.hf_layers) // self.inner), axis + 1, self.inner)

    @property
    def scanned(self) -> bool:
        return self.indices is None

    def path(self, p: Param, k: int | None = None) -> str:
        """Canonical MaxText path of param `p` (position k's, when unscanned)."""
        prefix = self.prefix if k is None or self.indices is None else self.prefix.format(i=self.indices[k])
        return f"{AUX_PREFIX if p.aux else ''}{prefix}/{p.maxtext}"


def layer_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """How MaxText lays out this family's layers (Family.maxtext_scan), scanned or not."""
    family = FAMILIES[spec.family]
    L = spec.num_layers
    style = family.maxtext_scan
    moe = spec.num_experts > 0
    if style == "dense_moe":
        k = spec.first_dense_layers
        groups = [(layer_params(spec, False), tuple(range(k)), "decoder/dense_layers"),
                  (layer_params(spec, True), tuple(range(k, L)), "decoder/moe_layers")]
        return [
            Stack(params, hf, prefix) if scanned else Stack(params, hf, prefix + "_{i}", tuple(range(len(hf))))
            for params, hf, prefix in groups if hf
        ]
    if style == "pairs":  # one MaxText layer = HF layers 2i (local) and 2i + 1 (global)
        if L % 2:
            raise UnsupportedModelError(f"{spec.family}: {L} layers is not a whole number of (local, global) pairs")
        out = []
        for j, suffix in enumerate(("_local", "_global")):
            hf = tuple(range(j, L, 2))
            prefix, indices = ("decoder/layers", None) if scanned else ("decoder/layers_{i}", tuple(range(L // 2)))
            out.append(Stack(layer_params(spec, moe, suffix), hf, prefix, indices))
        return out
    if style == "hybrid":
        return hybrid_stacks(spec, scanned)
    if style == "cycle":
        return cycle_stacks(spec, scanned)
    if style == "local_global":
        return local_global_stacks(spec, scanned)
    params = layer_params(spec, moe)
    if not scanned:
        return [Stack(params, tuple(range(L)), "decoder/layers_{i}", tuple(range(L)))]
    if style == "blocks":  # blocks of n layers scanned as decoder/layers/layers_{j}, the rest unstacked
        n = spec.sliding_window_pattern
        blocks = L // n
        out = [
            Stack(params, tuple(b * n + j for b in range(blocks)), f"decoder/layers/layers_{j}")
            for j in range(n)
            if blocks
        ]
        rest = tuple(range(blocks * n, L))
        if rest and not family.maxtext_scan_remainder:
            raise UnsupportedModelError(
                f"{spec.family}: {L} layers is not a whole number of blocks of {n}; MaxText scans only whole "
                "blocks of this family (and drops the rest), so convert with scan_layers=false"
            )
        if rest:
            out.append(Stack(params, rest, "decoder/layers_remainder/layers_{i}", tuple(range(len(rest)))))
        return out
    return [Stack(params, tuple(range(L)), "decoder/layers")]


def cycle_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """A "cycle" family's layers (llama4): MoE or dense MLP per layer (hfl.is_moe_layer).

    Scanned: `decoder/layers/layers_{j}` for j < layer_cycle_interval n, each stacked over the L / n blocks
    (MaxText scans whole blocks only). Unscanned: `decoder/layers_{i}`.
    """
    n, L = spec.layer_cycle_interval, spec.num_layers
    kinds = {moe: layer_params(spec, moe) for moe in (False, True)}
    if not scanned:
        stacks = []
        for moe in (False, True):
            hf = tuple(i for i in range(L) if hfl.is_moe_layer(spec, i) == moe)
            if hf:
                stacks.append(Stack(kinds[moe], hf, "decoder/layers_{i}", hf))
        return stacks
    step = max(spec.interleave_moe_layer_step or 1, 1)
    if n < 1 or L % n or n % step:
        raise UnsupportedModelError(
            f"{spec.family}: {L} layers in scanned blocks of layer_cycle_interval={n} (which must be a multiple of "
            f"interleave_moe_layer_step={step}): MaxText scans whole blocks only; convert with scan_layers=false"
        )
    return [Stack(kinds[hfl.is_moe_layer(spec, j)], tuple(b * n + j for b in range(L // n)),
                  f"decoder/layers/layers_{j}") for j in range(n)]


def hybrid_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """A Gated DeltaNet hybrid's layers: blocks of full_attention_interval n layers, the last full attention.

    Scanned: `decoder/layers/local_layers` (the n - 1 Gated DeltaNet layers of every block, on two axes),
    `decoder/layers/global_layer` (one per block), leftover layers (all Gated DeltaNet) stacked in
    `decoder/layers_remainder/local_layers`. Unscanned: `decoder/layers_{i}`.
    """
    n, L, moe = spec.full_attention_interval, spec.num_layers, spec.num_experts > 0
    if n < 1:
        raise UnsupportedModelError(
            f"{spec.family} needs full_attention_interval >= 1 (--set full_attention_interval=N)"
        )
    if spec.num_shared_experts > 1:
        raise UnsupportedModelError(
            f"{spec.family}: MaxText's shared expert is one MLP of moe_mlp_dim width; this model's is "
            f"{spec.num_shared_experts} times that (HF shared_expert_intermediate_size), which MaxText cannot load"
        )
    linear, full = layer_params(spec, moe, linear=True), layer_params(spec, moe)
    if not scanned:
        lin = tuple(i for i in range(L) if i % n != n - 1)
        att = tuple(i for i in range(L) if i % n == n - 1)
        return [Stack(ps, hf, "decoder/layers_{i}", hf) for ps, hf in ((linear, lin), (full, att)) if hf]
    blocks, out = L // n, []
    if FAMILIES[spec.family].maxtext_hybrid_block == "per_layer":  # decoder/layers/layer_{j}, j < n
        if L % n:
            raise UnsupportedModelError(
                f"{spec.family}: {L} layers is not a whole number of blocks of {n}; MaxText scans only whole "
                "blocks of this family (convert with scan_layers=false)"
            )
        return [Stack(linear if j < n - 1 else full, tuple(b * n + j for b in range(blocks)),
                      f"decoder/layers/layer_{j}") for j in range(n)]
    if blocks and n > 1:
        hf = tuple(b * n + j for b in range(blocks) for j in range(n - 1))
        out.append(Stack(linear, hf, "decoder/layers/local_layers", inner=n - 1))
    if blocks:
        out.append(Stack(full, tuple(b * n + n - 1 for b in range(blocks)), "decoder/layers/global_layer"))
    rest = tuple(range(blocks * n, L))
    if rest:
        out.append(Stack(linear, rest, "decoder/layers_remainder/local_layers"))
    return out


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


def local_global_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """gemma4's layers (formats/maxtext/local_global.py), each Stack with the spec sizing its tensors.

    Scanned: `decoder/scanned_blocks/local_layers` (the sliding layers of every block, on two axes),
    `decoder/scanned_blocks/global_layer` (one per block), leftover layers in `decoder/layers_remainder/local_layers`.
    Unscanned: `decoder/layers_{i}`.
    """
    n, L = spec.sliding_window_pattern, spec.num_layers
    if n < 1:
        raise UnsupportedModelError(f"{spec.family} needs sliding_window_pattern >= 1 (--set sliding_window_pattern=N)")
    if not scanned:
        return [Stack(local_global_layer_params(spec, i), (i,), "decoder/layers_{i}", (i,),
                      spec=geometry.layer_spec(spec, i)) for i in range(L)]
    if spec.per_layer_input_dim or spec.num_kv_shared_layers:
        raise UnsupportedModelError(
            f"{spec.family}: MaxText 0.2.5 runs a model with per-layer inputs or KV-shared layers unscanned only "
            "(its gemma4_small decoder refuses scan_layers); write it with scan_layers=false (--no-scan-layers)"
        )
    blocks, out = L // n, []
    local, full = local_global_layer_params(spec, 0), local_global_layer_params(spec, n - 1)
    if blocks and n > 1:
        hf = tuple(b * n + j for b in range(blocks) for j in range(n - 1))
        out.append(Stack(local, hf, local_global.LOCAL, inner=n - 1, spec=spec))
    if blocks:
        out.append(Stack(full, tuple(b * n + n - 1 for b in range(blocks)), local_global.GLOBAL,
                         spec=geometry.layer_spec(spec, n - 1)))
    rest = tuple(range(blocks * n, L))
    if rest:
        out.append(Stack(local, rest, local_global.REMAINDER, spec=spec))
    return out


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
    for family in FAMILIES.values():  # a cycle family's MoE module (llama4's Llama4MoEBlock_0) names it
        if family.maxtext_scan == "cycle" and f"/{family.maxtext_moe.split('/')[0]}/" in text:
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


def _hybrid_dims(names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                 family: Family) -> dict[str, Any]:
    """The ModelSpec fields a Gated DeltaNet hybrid's tree shows (see :func:`hybrid_stacks`)."""
    def shape_at(path: str, stacked_axes: int) -> tuple[int, ...]:
        shape = tuple(infos[names[path]].shape)
        for _ in range(stacked_axes):
            shape = tf.remove_axis(shape, axis)
        return shape

    pre = family.maxtext_layer_norms[0]
    if scanned and family.maxtext_hybrid_block == "per_layer":  # decoder/layers/layer_{j}
        positions = sorted({int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers/layer_(\d+)/", n))})
        interval = len(positions)
        blocks = infos[names[f"decoder/layers/layer_{interval - 1}/{pre}/scale"]].shape[axis]
        num_layers = blocks * interval
        one_full = lambda path: shape_at(f"decoder/layers/layer_{interval - 1}/{path}", 1)  # noqa: E731
        one_linear = lambda path: shape_at(f"decoder/layers/layer_0/{path}", 1)  # noqa: E731
    elif scanned:
        local, full = "decoder/layers/local_layers", "decoder/layers/global_layer"
        if f"{full}/{pre}/scale" not in names:
            raise UnsupportedModelError(f"{family.name} checkpoint has no {full}: no whole block of layers to read")
        blocks = infos[names[f"{full}/{pre}/scale"]].shape[axis]
        inner = infos[names[f"{local}/{pre}/scale"]].shape[axis + 1] if f"{local}/{pre}/scale" in names else 0
        rem = f"decoder/layers_remainder/local_layers/{pre}/scale"
        rest = infos[names[rem]].shape[axis] if rem in names else 0
        interval, num_layers = inner + 1, blocks * (inner + 1) + rest
        one_full = lambda path: shape_at(f"{full}/{path}", 1)  # noqa: E731
        one_linear = (lambda path: shape_at(f"{local}/{path}", 2)) if inner else (  # noqa: E731
            lambda path: shape_at(f"decoder/layers_remainder/local_layers/{path}", 1))
    else:
        layers = sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n))})
        attn_q = f"{family.maxtext_attention}/query/kernel"
        full_layers = [i for i in layers if f"decoder/layers_{i}/{attn_q}" in names]
        linear_layers = [i for i in layers if i not in full_layers]
        if not full_layers:
            raise UnsupportedModelError(f"{family.name} checkpoint has no full-attention layer to read heads from")
        interval, num_layers = full_layers[0] + 1, len(layers)
        one_full = lambda path: shape_at(f"decoder/layers_{full_layers[0]}/{path}", 0)  # noqa: E731
        one_linear = lambda path: shape_at(f"decoder/layers_{linear_layers[0]}/{path}", 0)  # noqa: E731
    vocab, emb = infos[names["token_embedder/embedding"]].shape
    attn, lin, moe = family.maxtext_attention, family.maxtext_linear_attention, family.maxtext_moe
    _, heads, query = one_full(f"{attn}/query/kernel")
    gated = bool(family.settings.get("attention_output_gate"))
    head_dim = query // 2 if gated else query
    dims: dict[str, Any] = {
        "_family": family.name, "_scanned": scanned, "num_layers": num_layers, "emb_dim": emb, "vocab_size": vocab,
        "tie_word_embeddings": "decoder/logits_dense/kernel" not in names, "full_attention_interval": interval,
        "num_heads": heads, "head_dim": head_dim, "num_kv_heads": one_full(f"{attn}/key/kernel")[1],
        "qk_norm": _has(one_full, f"{attn}/query_norm/scale"),
        "gdn_num_value_heads": one_linear(f"{lin}/A_log")[0],
        "gdn_value_head_dim": one_linear(f"{lin}/norm/rms_norm/scale")[0],
        "gdn_conv_kernel_dim": one_linear(f"{lin}/conv1d/kernel")[0],
    }
    if moe:
        experts, _, width = one_full(f"{moe}/wi_0")
        shared = family.maxtext_shared_experts
        has_shared = bool(shared) and _has(one_full, f"{shared}/wi_0/kernel")
        shared_width = one_full(f"{shared}/wi_0/kernel")[-1] if has_shared else 0
        dims.update(num_experts=experts, moe_mlp_dim=width, mlp_dim=width, num_shared_experts=shared_width // width,
                    router_bias=False, expert_bias=False, first_dense_layers=0)
    else:
        dims["mlp_dim"] = one_full("mlp/wi_0/kernel")[-1]
    return dims


def _cycle_dims(names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                family: Family) -> dict[str, Any]:
    """The ModelSpec fields a "cycle" family's tree shows (see :func:`cycle_stacks`): the block length when
    scanned, and which layers are MoE (the first MoE layer is interleave_moe_layer_step - 1)."""
    pattern = re.compile(r"^decoder/layers/layers_(\d+)/" if scanned else r"^decoder/layers_(\d+)/")
    slots = sorted({int(m.group(1)) for n in names if (m := pattern.match(n))})
    pre = family.maxtext_layer_norms[0]
    if not slots:
        raise CorruptCheckpointError(f"{family.name} checkpoint has no decoder layers")

    def path(j: int, sub: str) -> str:
        return f"decoder/layers/layers_{j}/{sub}" if scanned else f"decoder/layers_{j}/{sub}"

    def one(j: int, sub: str) -> tuple[int, ...]:
        shape = tuple(infos[names[path(j, sub)]].shape)
        return tf.remove_axis(shape, axis) if scanned else shape

    blocks = infos[names[path(slots[0], f"{pre}/scale")]].shape[axis] if scanned else 1
    attn, moe = family.maxtext_attention, family.maxtext_moe
    moe_slots = [j for j in slots if path(j, f"{moe}/wi_0") in names]
    dense_slots = [j for j in slots if path(j, "mlp/wi_0/kernel") in names]
    vocab, emb = infos[names["token_embedder/embedding"]].shape
    _, heads, head_dim = one(slots[0], f"{attn}/query/kernel")
    dims: dict[str, Any] = {
        "_family": family.name, "num_layers": blocks * len(slots), "emb_dim": emb, "vocab_size": vocab,
        "tie_word_embeddings": "decoder/logits_dense/kernel" not in names, "num_heads": heads,
        "head_dim": head_dim, "num_kv_heads": one(slots[0], f"{attn}/key/kernel")[1],
        "qk_norm": path(slots[0], f"{attn}/query_norm/scale") in names,
    }
    if scanned:
        dims["layer_cycle_interval"] = len(slots)
    if moe_slots:
        experts, _, width = one(moe_slots[0], f"{moe}/wi_0")
        shared = moe.rsplit("/", 1)[0] + "/shared_experts/wi_0/kernel"
        dims.update(num_experts=experts, moe_mlp_dim=width, router_bias=False, expert_bias=False,
                    first_dense_layers=0, interleave_moe_layer_step=moe_slots[0] + 1,
                    num_shared_experts=one(moe_slots[0], shared)[-1] // width if path(moe_slots[0], shared) in names
                    else 0)
    dims["mlp_dim"] = one(dense_slots[0], "mlp/wi_0/kernel")[-1] if dense_slots else dims.get("moe_mlp_dim")
    return dims


def _has(one_layer, path: str) -> bool:
    try:
        one_layer(path)
    except KeyError:
        return False
    return True


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
        style = FAMILIES[family].maxtext_scan if family else "layers"
        if style == "hybrid":
            return _hybrid_dims(names, infos, scanned, self.scan_axis, FAMILIES[family])
        if style == "cycle":
            return _cycle_dims(names, infos, scanned, self.scan_axis, FAMILIES[family])
        if style == "local_global":
            return local_global.infer_dims(names, infos, self.scan_axis, FAMILIES[family])

        def layer_count(prefix: str) -> int:
            """Layers under `prefix` (stacked: its scan axis; unstacked: how many `prefix_{i}` there are)."""
            if scanned:
                sizes = {
                    infos[s].shape[self.scan_axis]
                    for c, s in names.items()
                    if c.startswith(prefix + "/")
                    and len(infos[s].shape) > self.scan_axis
                    and not c.startswith(AUX_PREFIX)
                }
                return max(sizes) if sizes else 0
            pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)/")
            found = {int(m.group(1)) for n in names if (m := pattern.match(n))}
            return max(found) + 1 if found else 0

        if style == "dense_moe":
            dense, moe_layers = layer_count("decoder/dense_layers"), layer_count("decoder/moe_layers")
            num_layers, probes = (
                dense + moe_layers,
                [("decoder/dense_layers", dense), ("decoder/moe_layers", moe_layers)],
            )
        elif style == "blocks" and scanned:
            blocks = {int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers/layers_(\d+)/", n))}
            rest = {int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers_remainder/layers_(\d+)/", n))}
            per_block = layer_count("decoder/layers/layers_0") if blocks else 0
            num_layers = per_block * len(blocks) + len(rest)
            probes = [("decoder/layers/layers_0", per_block)] if blocks else []
            probes.append(("decoder/layers_remainder/layers_0", len(rest)))
        else:
            num_layers = layer_count("decoder/layers")
            probes = [("decoder/layers", num_layers)]
            if style == "pairs":
                num_layers *= 2
        if not num_layers:
            raise CorruptCheckpointError("MaxText checkpoint has neither decoder/layers nor decoder/layers_0")

        def probe_shape(path: str) -> tuple[int, ...] | None:
            """One layer's shape of a param, from the first stack that has it; None when absent."""
            for prefix, count in probes:
                if not count:
                    continue
                stacked = scanned and not prefix.startswith("decoder/layers_remainder")
                full = f"{prefix}/{path}" if stacked or prefix.endswith("_0") else f"{prefix}_0/{path}"
                if full in names:
                    shape = tuple(infos[names[full]].shape)
                    return tf.remove_axis(shape, self.scan_axis) if stacked else shape
            return None

        def shape(path: str) -> tuple[int, ...]:
            found = probe_shape(path)
            if found is None:
                raise UnsupportedModelError(
                    f"MaxText checkpoint has no layer param {path}: not a parameter tree of a family maxckpt "
                    "converts (llama2/3/3.1, mistral, qwen3, mixtral, qwen3-moe, deepseek3, gpt-oss, gemma2, gemma3)"
                )
            return found

        vocab, emb = infos[names["token_embedder/embedding"]].shape
        suffix = "_local" if style == "pairs" else ""
        attn = (FAMILIES[family].maxtext_attention if family else "self_attention") + suffix
        dims: dict[str, Any] = {
            "num_layers": num_layers,
            "emb_dim": emb,
            "vocab_size": vocab,
            "tie_word_embeddings": "decoder/logits_dense/kernel" not in names,
        }
        if family:
            dims["_family"] = family
        if probe_shape(f"{attn}/wkv_a/kernel") is not None:  # MLA (a query LoRA, or one query kernel: deepseek2)
            lora = probe_shape(f"{attn}/wq_a/kernel") is not None
            q_lora = shape(f"{attn}/wq_a/kernel")[-1] if lora else 0
            kv_lora = shape(f"{attn}/kv_norm/scale")[0]
            _, heads, qk = shape(f"{attn}/wq_b/kernel" if lora else f"{attn}/query/kernel")
            kv_a = shape(f"{attn}/wkv_a/kernel")[-1]
            _, _, kvb = shape(f"{attn}/wkv_b/kernel")
            v_dim = shape(f"{attn}/out/kernel")[1]
            rope = kv_a - kv_lora
            dims.update(q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope,
                        v_head_dim=v_dim, num_heads=heads, num_kv_heads=heads, head_dim=rope, qk_norm=False)
            index_weights = probe_shape(f"{attn}/indexer/weights_proj/kernel")
            if index_weights is not None:  # DeepSeek-V3.2's indexer
                dims.update(indexer_n_heads=index_weights[-1], indexer_head_dim=shape(f"{attn}/indexer/wk/kernel")[-1])
            if kvb != qk - rope + v_dim:
                raise ShapeMismatchError(f"MLA wkv_b has {kvb} features per head; q says nope {qk - rope} + v {v_dim}")
        else:
            _, heads, head_dim = shape(f"{attn}/query/kernel")
            dims.update(num_heads=heads, head_dim=head_dim, num_kv_heads=shape(f"{attn}/key/kernel")[1],
                        qk_norm=probe_shape(f"{attn}/query_norm/scale") is not None)
            if probe_shape(f"{attn}/query/bias") is not None:  # with out/bias: gpt-oss's four; without: qwen2.5's
                dims["attention_bias" if probe_shape(f"{attn}/out/bias") is not None else "qkv_bias"] = True
            if probe_shape(f"{attn}/sinks") is not None:
                dims["attention_sinks"] = True
        dense_mlp = probe_shape(f"mlp{suffix}/wi_0/kernel")
        moe = FAMILIES[family].maxtext_moe if family else None
        if moe and probe_shape(f"{moe}/wi_0") is not None:
            experts, _, width = shape(f"{moe}/wi_0")
            dims.update(num_experts=experts, moe_mlp_dim=width,
                        router_bias=probe_shape(f"{moe}/gate/bias") is not None,
                        expert_bias=probe_shape(f"{moe}/wi_0_bias") is not None)
            shared = probe_shape(moe.rsplit("/", 1)[0] + "/shared_experts/wi_0/kernel") if "/" in moe else None
            dims["num_shared_experts"] = shared[-1] // width if shared is not None else 0
            dims["first_dense_layers"] = probes[0][1] if style == "dense_moe" else 0
        if dense_mlp is not None:
            dims["mlp_dim"] = dense_mlp[-1]
        elif "moe_mlp_dim" in dims:
            dims["mlp_dim"] = dims["moe_mlp_dim"]
        else:
            shape(f"mlp{suffix}/wi_0/kernel")  # raises: no MLP this layout knows
        return dims

    def expected_tensors(self, spec: ModelSpec, scanned: bool, prefix: str = "") -> dict[str, tuple[int, ...]]:
        """MaxText path -> shape for this spec."""
        out = {prefix + p.maxtext: p.maxtext_shape(spec) for p in GLOBAL_PARAMS if p.present(spec)}
        for stack in layer_stacks(spec, scanned):
            sized = stack.sized(spec)
            for p in stack.params:
                if stack.scanned:
                    axis = 0 if p.aux else self.scan_axis
                    path = stack.path(p)
                    out[(path if p.aux else prefix + path)] = stack.stacked_shape(p.maxtext_shape(sized), axis)
                else:
                    for k in range(len(stack.hf_layers)):
                        path = stack.path(p, k)
                        out[(path if p.aux else prefix + path)] = p.maxtext_shape(sized)
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
        out: dict[str, LazyTensor] = {}
        for p in GLOBAL_PARAMS:
            if p.present(spec):
                src = tensors[names[p.maxtext]]
                out[p.hf] = tf.lazy_map(p.hf, src, lambda x, p=p, spec=spec: p.to_hf(x, spec, main), p.hf_shape(spec),
                                        p.hf_dtype(spec, src.dtype, main))
        model_spec = spec
        for stack in layer_stacks(model_spec, scanned):
            spec = stack.sized(model_spec)  # noqa: PLW2901 - this stack's own geometry (gemma4's global layers)
            fused: dict[str, list[Param]] = {}
            for p in stack.params:
                if p.part is not None:
                    fused.setdefault(p.hf, []).append(p)
            for p in stack.params:
                if p.part is not None and p is not fused[p.hf][0]:
                    continue  # built with its first part
                for k, layer in enumerate(stack.hf_layers):
                    parts = fused[p.hf] if p.part else [p]
                    readers = [self._reader(stack, q, k, tensors, names, groups, spec) for q in parts]
                    dtype = p.hf_dtype(spec, tensors[names[stack.path(p, None if stack.scanned else k)]].dtype, main)
                    for e, hf_name in enumerate(p.hf_names(spec, layer)):
                        compute = self._compute(p, parts, readers, e, spec, main)
                        out[hf_name] = LazyTensor.computed(hf_name, p.hf_slot_shape(spec, e), dtype, compute)
        return out

    def read_within_layers(self, lo: int, hi: int) -> None:
        """A process of a multi-process conversion converts HF layers [lo, hi) only: stacked reads stay within them."""
        groups = getattr(self, "_layer_groups", None)
        if groups is not None:
            groups.window = (lo, hi)

    @staticmethod
    def _compute(p: Param, parts: list[Param], readers, e: int, spec: ModelSpec, main: np.dtype | None):
        if p.expert:
            return lambda: p.to_hf(readers[0](e), spec, main)
        if p.regroup is not None:  # one MaxText kernel, several HF tensors: slot e
            return lambda: p.to_hf_slot(readers[0](), spec, main, e)
        if p.part is not None and p.transposed:  # a packed HF tensor: its parts concatenated on axis 1
            return lambda: np.concatenate([q.to_hf(r(), spec, main) for q, r in zip(parts, readers)], axis=1)
        if p.part is not None:  # a fused HF tensor: its parts interleaved (or concatenated) on the last axis
            fuse = (lambda xs: np.concatenate(xs, axis=-1)) if p.concat else tf.interleave_last
            return lambda: fuse([q.to_hf(r(), spec, main) for q, r in zip(parts, readers)])
        return lambda: p.to_hf(readers[0](), spec, main)

    def _reader(self, stack: Stack, p: Param, k: int, tensors, names, groups: tf.LayerGroups, spec: ModelSpec):
        """A function (expert or None) -> the MaxText array of param `p` at stack position k (that expert's)."""
        src = tensors[names[stack.path(p, None if stack.scanned else k)]]
        uses = spec.num_experts if p.expert else len(p.hf_names(spec, None))
        if not stack.scanned:
            return lambda e=None: src.read((e,)) if e is not None else src.read()
        axis = 0 if p.aux else self.scan_axis
        groups.positions[src.name] = tuple(stack.hf_layers)
        if stack.inner:  # [.., block, position, ..]: read the block, take the position (now on `axis`)
            b, j = divmod(k, stack.inner)
            uses *= stack.inner

            def nested(e=None):
                block = groups.layer(src, axis, b, uses)
                return block[e, j] if e is not None else block[tf.on_axis(axis, j)]

            return nested
        if p.expert and not groups.fits(src, axis):  # one layer of all experts is too big: read one expert's slice
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
        for p in GLOBAL_PARAMS:
            if p.present(spec):
                name = PARAMS_PREFIX + p.maxtext
                out[name] = tf.lazy_map(name, hf[p.hf], lambda w, p=p, spec=spec: p.from_hf(w, spec, main),
                                        p.maxtext_shape(spec), p.maxtext_dtype(spec, hf[p.hf].dtype, main))
        scanned = self.scan_layers is not False
        model_spec = spec
        for stack in layer_stacks(model_spec, scanned):
            spec = stack.sized(model_spec)  # this stack's own geometry (gemma4's global layers)
            for p in stack.params:
                root = "" if p.aux else PARAMS_PREFIX
                per_layer = []
                for k, layer in enumerate(stack.hf_layers):
                    name = root + stack.path(p, k)
                    sources = [hf[n] for n in p.hf_names(spec, layer)]
                    one = hfl.shape_of(p.in_dims + p.out_dims, spec)
                    if p.regroup is not None:  # several HF tensors, one MaxText kernel
                        per_layer.append([LazyTensor.computed(
                            name, one, p.maxtext_dtype(spec, sources[0].dtype, main),
                            lambda srcs=sources, p=p, spec=spec: p.from_hf_slots([t.read() for t in srcs], spec,
                                                                                 main))])
                        continue
                    per_layer.append([
                        tf.lazy_map(f"{name}[{e}]" if p.expert else name, t,
                                    lambda w, p=p, spec=spec: p.from_hf(w, spec, main),
                                    one, p.maxtext_dtype(spec, t.dtype, main))
                        for e, t in enumerate(sources)
                    ])
                if stack.scanned and stack.inner:  # one tensor per block, then the blocks stacked
                    name = root + stack.path(p)
                    rows = []
                    for b in range(len(per_layer) // stack.inner):
                        block = per_layer[b * stack.inner : (b + 1) * stack.inner]
                        rows.append(
                            tf.lazy_grid(f"{name}[{b}]", block, outer_axis=self.scan_axis, inner_axis=0) if p.expert
                            else LazyTensor.stacked(f"{name}[{b}]", [parts[0] for parts in block], axis=self.scan_axis)
                        )
                    out[name] = LazyTensor.stacked(name, rows, axis=self.scan_axis)
                elif stack.scanned:
                    name = root + stack.path(p)
                    if p.expert:
                        out[name] = tf.lazy_grid(name, per_layer, outer_axis=self.scan_axis, inner_axis=0)
                    else:
                        out[name] = LazyTensor.stacked(
                            name, [parts[0] for parts in per_layer], axis=0 if p.aux else self.scan_axis
                        )
                else:
                    for k, parts in enumerate(per_layer):
                        name = root + stack.path(p, k)
                        out[name] = LazyTensor.stacked(name, parts, axis=0) if p.expert else parts[0]
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
